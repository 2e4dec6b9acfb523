"""gemm_operands (primitives/gemm_operands.py): the GEMM's aligned operands, emulated (CPU) and kernel (GPU).

CPU: the declaration's emulation (path "emulated", through the custom_vmap(custom_partitioning) wrapper)
equals the reference (path "xla") bit for bit; layouts; vmap; G-sharding; bad inputs raise a ValueError
naming the argument. GPU (marked gpu): the kernel (kernels/common/gemm_operands.py) bit-exact against the
reference on the same device, on fresh random data with NaN / Inf / zero / huge / tiny blocks, into
NaN-poisoned output buffers (the `_into` hooks), G > 1 and R, C not multiples of 128.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import gemm_operands as pgo
from jax_mxfp8.primitives import library
from tests.gemm.gemm_align_oracle import mixed_input
from tests.seeding_testutil import test_seed

BOTH = ("row", "col")
CASES = [(i, e, r) for i in registry.IN_DTYPES for e in registry.ELEM_DTYPES for r in registry.SCALE_ROUNDINGS]


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


def assert_same(got, want, what: str) -> None:
    g, w = _bits(got), _bits(want)
    assert g.shape == w.shape, (what, g.shape, w.shape)
    bad = g != w
    if bad.any():
        gf, wf = (np.asarray(a).astype(np.float32) for a in (got, want))
        both_nan = int((bad & np.isnan(gf) & np.isnan(wf)).sum())
        idx = np.argwhere(bad)[:5]
        pytest.fail(
            f"{what}: {int(bad.sum())} of {bad.size} differ ({both_nan} are NaN vs NaN patterns); first at "
            f"{idx.tolist()}: got {[int(g[tuple(i)]) for i in idx]}, want {[int(w[tuple(i)]) for i in idx]}"
        )


def _x(shape, in_dtype, rng, spread=40):
    return jnp.asarray(mixed_input(shape, rng, spread=spread, specials=4 + shape[0] * 4), dtype=in_dtype)


# ------------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("in_dtype,elem,rounding", CASES)
def test_emulated_equals_reference(in_dtype, elem, rounding):
    rng = np.random.default_rng(test_seed())
    x = _x((2, 160, 96), in_dtype, rng)
    kw = dict(dtype=elem, scale_rounding=rounding)
    got = jax.jit(lambda v: pgo.gemm_operands(v, orientations=BOTH, path="emulated", **kw))(x)
    want = jax.jit(lambda v: pgo.gemm_operands(v, orientations=BOTH, path="xla", **kw))(x)  # one program each
    for m in BOTH:
        assert_same(got[m][0], want[m][0], f"{m} data")
        assert_same(got[m][1], want[m][1], f"{m} scale")


@pytest.mark.parametrize("orientations", [("row",), ("col",), "row", ("col", "row")])
def test_layouts_and_single_orientations(orientations):
    rng = np.random.default_rng(test_seed())
    g, r, c = 2, 96, 160
    x = _x((g, r, c), jnp.bfloat16, rng, spread=4)
    got = pgo.gemm_operands(x, orientations=orientations, path="emulated")
    modes = {orientations} if isinstance(orientations, str) else set(orientations)
    assert set(got) == modes
    shapes = {"row": ((g, r, 256), (g, 2, r)), "col": ((g, c, 128), (g, 1, c))}
    for m, (d, s) in got.items():
        assert (d.shape, s.shape) == shapes[m] and d.dtype == jnp.float8_e4m3fn and s.dtype == jnp.float32
        pad = np.asarray(d).view(np.uint8)[..., (c if m == "row" else r) :]
        assert (pad == 0).all(), "padding must be +0"
    if "col" in modes:  # the col orientation of x is the row orientation of x^T
        ref = pgo.gemm_operands(jnp.swapaxes(x, 1, 2), orientations=("row",), path="xla")["row"]
        assert_same(got["col"][0], ref[0], "col data vs row data of x^T")
        assert_same(got["col"][1], ref[1], "col scale vs row scale of x^T")


def test_vmap_folds_into_g():
    rng = np.random.default_rng(test_seed())
    x = _x((3, 2, 64, 96), jnp.float32, rng)
    f = jax.vmap(lambda v: pgo.gemm_operands(v, path="emulated"))
    got = jax.jit(f)(x)
    ref = jax.jit(lambda v: pgo.gemm_operands(v, path="xla"))  # one program (eager: many small ones)
    for i in range(3):
        want = ref(x[i])
        for m in BOTH:
            assert_same(got[m][0][i], want[m][0], f"vmap {m} data")
            assert_same(got[m][1][i], want[m][1], f"vmap {m} scale")


def test_g_sharded_emulation():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))
    rng = np.random.default_rng(test_seed())
    x = _x((4, 64, 128), jnp.bfloat16, rng)
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    f = jax.jit(lambda v: pgo.gemm_operands(v, path="emulated"))
    got = f(xs)
    assert "all-gather" not in f.lower(xs).compile().as_text()
    want = jax.jit(lambda v: pgo.gemm_operands(v, path="xla"))(x)  # one program (eager: many small ones)
    for m in BOTH:
        assert_same(got[m][0], want[m][0], f"sharded {m} data")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(x=np.zeros((64, 64), np.float32)), "x must be"),
        (dict(x=np.zeros((1, 64, 64), np.int32)), "x has dtype"),
        (dict(x=np.zeros((1, 64, 64), np.float16)), "x has dtype"),
        (dict(dtype=jnp.float16), "dtype"),
        (dict(scale_rounding="down"), "scale_rounding"),
        (dict(orientations=()), "orientations"),
        (dict(orientations=("row", "row")), "orientations"),
        (dict(orientations=("diag",)), "orientations"),
        (dict(path="gpu"), "path"),
        (dict(x=np.zeros((1, 48, 64), np.float32)), "axis 1"),
        (dict(x=np.zeros((1, 64, 40), np.float32)), "axis 2"),
    ],
)
@pytest.mark.parametrize("path", ["xla", "emulated"])
def test_bad_inputs_name_the_argument(kwargs, match, path):
    kw = dict(x=np.zeros((1, 64, 64), np.float32), path=path)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        pgo.gemm_operands(kw.pop("x"), **kw)


def test_unsupported_reasons():
    assert pgo.gemm_operands_unsupported((2, 160, 96), jnp.bfloat16) is None
    assert pgo.gemm_operands_unsupported((1, 64, 64), jnp.float32, jnp.float8_e5m2, "floor", ("col",)) is None
    assert "(G, R, C)" in pgo.gemm_operands_unsupported((64, 64), jnp.bfloat16)
    assert "float32 / bfloat16" in pgo.gemm_operands_unsupported((1, 64, 64), jnp.float16)
    assert "multiples of 32" in pgo.gemm_operands_unsupported((1, 48, 64), jnp.bfloat16)
    assert "grid" in pgo.gemm_operands_unsupported((70000, 32, 32), jnp.bfloat16)


@pytest.mark.skipif(library.kernels_runnable()[0], reason="kernels can run here")
def test_cuda_path_needs_the_kernels():
    with pytest.raises(RuntimeError, match="path='cuda'"):
        pgo.gemm_operands(jnp.zeros((1, 64, 64)), path="cuda")


# ------------------------------------------------------------------------------------------------- GPU
_ok, _why = library.kernels_runnable(registry.GemmOperandsConfig.archs)


def _poisoned(variant, x):
    """NaN-poisoned output buffers: data 0xFF (a NaN code the kernel never writes), scale NaN 0x7FC00001."""
    outs = []
    for s in pgo._outputs(variant, x):
        if s.dtype == jnp.float32:
            outs.append(jax.lax.bitcast_convert_type(jnp.full(s.shape, 0x7FC00001, jnp.uint32), jnp.float32))
        else:
            outs.append(jax.lax.bitcast_convert_type(jnp.full(s.shape, 0xFF, jnp.uint8), s.dtype))
    return tuple(outs)


def check_kernel(variant, xs):
    """Kernel (into poisoned buffers) vs the reference on the same device, for each input of xs (one compile)."""
    decl = pgo.declaration(variant)
    kernel = jax.jit(lambda v, *o: decl.ffi_into(variant, (v,), o))
    modes = pgo._modes(variant)
    elem = jnp.dtype(variant.elem_dtype)
    ref = jax.jit(lambda v: [pgo.reference(v, elem, variant.scale_rounding, m) for m in modes])
    for n, x in enumerate(xs):
        got, want = kernel(x, *_poisoned(variant, x)), ref(x)
        for i, m in enumerate(modes):
            assert_same(got[2 * i], want[i][0], f"{variant.name} {m} data (input {n})")
            assert_same(got[2 * i + 1], want[i][1], f"{variant.name} {m} scale (input {n})")


GPU_CASES = [(i, e, r, "both", (2, 160, 224)) for i, e, r in CASES]
GPU_CASES += [("bfloat16", "float8_e4m3fn", "up", "both", s) for s in [(1, 32, 32), (1, 128, 128), (3, 96, 64)]]
GPU_CASES += [
    ("bfloat16", "float8_e4m3fn", "up", "both", (1, 1056, 4128)),
    ("float32", "float8_e4m3fn", "up", "both", (2, 544, 1056)),
]
GPU_CASES += [(i, e, r, o, (2, 160, 352)) for i, e, r in CASES[::3] for o in ("row", "col")]


@pytest.mark.parametrize("in_dtype,elem,rounding,orientations,shape", GPU_CASES)
@pytest.mark.gpu
@pytest.mark.skipif(not _ok, reason=_why)
def test_kernel_bitexact(in_dtype, elem, rounding, orientations, shape):
    variant = registry.find(
        registry.GemmOperandsConfig,
        in_dtype=in_dtype,
        elem_dtype=elem,
        scale_rounding=rounding,
        orientations=orientations,
    )
    rng = np.random.default_rng(test_seed())
    check_kernel(variant, [_x(shape, in_dtype, rng, spread=s) for s in (40, 3, 0)])


@pytest.mark.gpu
@pytest.mark.skipif(not _ok, reason=_why)
@pytest.mark.parametrize("variant", registry.GEMM_OPERANDS_TUNINGS, ids=lambda v: v.name)
def test_tuning_bitexact(variant):
    if not library.has_kernel(variant.name):
        pytest.skip(f"{variant.name} is not in the library (tools/build_library.py --with-tunes builds it)")
    rng = np.random.default_rng(test_seed())
    # (3, 1056, 2080): 459 tiles (more than one wave), partial tiles on both edges of every batch
    check_kernel(variant, [_x(s, variant.in_dtype, rng) for s in [(2, 288, 416), (3, 1056, 2080)]])


@pytest.mark.gpu
@pytest.mark.skipif(not _ok, reason=_why)
def test_cuda_path_vmap_jit_and_repeat():
    rng = np.random.default_rng(test_seed())
    x = _x((2, 2, 224, 160), jnp.bfloat16, rng, spread=6)
    f = jax.jit(jax.vmap(lambda v: pgo.gemm_operands(v, path="cuda")))
    got, again = f(x), f(x)
    hlo = f.lower(x).as_text()
    assert "jax_mxfp8_gemm_operands_both" in hlo
    for b in range(2):
        want = pgo.gemm_operands(x[b], path="xla")
        for m in BOTH:
            for j in range(2):
                assert_same(got[m][j][b], want[m][j], f"cuda vmap {m} {j}")
                assert_same(again[m][j][b], got[m][j][b], f"repeat {m} {j}")
