"""GPU tests of the CuTe DSL quantize / dequantize kernels against the XLA reference (bit for bit).

Run on the H200 with `pytest -m gpu tests/quantize/test_quantize_kernels_gpu.py`; skipped without the built
library or a GPU of compute capability 9.x / 10.x. Every check draws fresh random inputs over many
magnitudes (plus zero, NaN, Inf and threshold blocks), poisons the memory the outputs will land in, and
compares every byte with jax_mxfp8.formats on the same device.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.formats import E4M3, E5M2
from jax_mxfp8.formats import dequantize as ref_dequantize
from jax_mxfp8.formats import quantize as ref_quantize
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import quantize as pq
from tests.seeding_testutil import test_seed

pytestmark = pytest.mark.gpu

_ok, _why = library.kernels_runnable()
if not _ok:
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason=_why)]

SENTINEL = 0x5A


def _u8(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a


def random_input(shape, dtype, rng: np.random.Generator, specials: bool = True) -> jax.Array:
    """N(0,1) values times 2**e with e drawn per 32x32 tile and per row in [-60, 60]; optional special
    blocks: all-zero, NaN, +-Inf, amax exactly 448 * 2**k and around the smallest-normal thresholds."""
    m, k = shape[-2], shape[-1]
    lead = shape[:-2]
    x = rng.standard_normal(shape).astype(np.float32)
    tile_e = rng.integers(-60, 61, size=(*lead, m // 32, 1, k // 32, 1))
    row_e = rng.integers(-8, 9, size=(*lead, m, 1))
    x = (x.reshape(*lead, m // 32, 32, k // 32, 32) * np.exp2(tile_e)).reshape(shape) * np.exp2(row_e)
    if specials:
        flat = x.reshape(-1, k)
        rows = flat.shape[0]
        for _ in range(6):
            r, c = rng.integers(0, rows), rng.integers(0, k // 32) * 32
            kind = rng.integers(0, 7)
            if kind == 0:
                flat[r, c : c + 32] = 0.0
            elif kind == 1:
                flat[r, c + rng.integers(0, 32)] = np.nan
            elif kind == 2:
                flat[r, c + rng.integers(0, 32)] = np.inf * rng.choice([-1, 1])
            elif kind == 3:
                flat[r, c + rng.integers(0, 32)] = 448.0 * 2.0 ** rng.integers(-20, 20)
            elif kind == 4:  # amax near the "up" tiny-quotient thresholds (normal float32 inputs)
                flat[r, c : c + 32] = rng.uniform(-1, 1, 32) * np.float32(E4M3.up_threshold)
                flat[r, c] = np.float32(E4M3.up_threshold) * rng.choice([1.0, 1.0000001, 0.9999999])
            elif kind == 5:
                flat[r, c : c + 32] *= 2.0**-100
            else:
                flat[r, c : c + 32] = rng.choice([-1, 1], 32) * 2.0 ** rng.integers(-10, 10, 32)
        x = flat.reshape(shape)
    x = np.where(np.abs(x) < 2.0**-126, 0.0, x)  # no float32 subnormal inputs (FTZ is allowed there)
    return jnp.asarray(x, dtype=dtype)


def poison(*shapes_dtypes):
    """Fills and frees device buffers of the outputs' sizes so that the kernel's outputs most likely
    reuse memory full of SENTINEL bytes (XLA's allocator reuses freed blocks)."""
    bufs = [jnp.full(s, SENTINEL, jnp.uint8) for s in shapes_dtypes]
    jax.block_until_ready(bufs)
    del bufs


def assert_same(got: np.ndarray, want: np.ndarray, what: str):
    got, want = _u8(got), _u8(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    bad = got != want
    if bad.any():
        idx = np.argwhere(bad)[:5]
        unwritten = int(((got == SENTINEL) & (want != SENTINEL)).sum())
        pytest.fail(
            f"{what}: {int(bad.sum())} of {bad.size} bytes differ ({unwritten} look unwritten); first at "
            f"{idx.tolist()}: got {[int(got[tuple(i)]) for i in idx]}, want {[int(want[tuple(i)]) for i in idx]}"
        )


def _nbytes(shape, itemsize=1):
    return (int(np.prod(shape)) * itemsize,)


QUANT_CASES = list(itertools.product(registry.IN_DTYPES, registry.ELEM_DTYPES, registry.SCALE_ROUNDINGS))
SHAPES = [(32, 32), (96, 160), (256, 1024), (2, 64, 352), (1024, 4128), (160, 3072)]


@pytest.mark.parametrize("in_dtype,elem,rounding", QUANT_CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rowcol_bitexact(in_dtype, elem, rounding, shape):
    rng = np.random.default_rng(test_seed())
    x = random_input(shape, jnp.dtype(in_dtype), rng)
    poison(_nbytes(shape), _nbytes(shape), _nbytes(shape))
    row, col = jax.jit(lambda v: pq.quantize_rowcol(v, dtype=elem, scale_rounding=rounding, implementation="cuda"))(x)
    kw = dict(dtype=elem, scale_rounding=rounding, implementation="xla")
    rref = pq.quantize(x, axis=-1, **kw)
    cref = pq.quantize(x, axis=-2, **kw)
    assert_same(row.data, rref.data, "row data")
    assert_same(row.scale, rref.scale, "row scale")
    assert_same(col.data, cref.data, "col data")
    assert_same(col.scale, cref.scale, "col scale")
    assert (row.axes, col.axes) == ((-1,), (-2,))


@pytest.mark.parametrize("in_dtype,elem,rounding", QUANT_CASES)
@pytest.mark.parametrize("block,axis", [("row", -1), ("row", -2), ("square", (-2, -1))])
def test_single_bitexact(in_dtype, elem, rounding, block, axis):
    rng = np.random.default_rng(test_seed())
    shape = (3, 128, 608)
    x = random_input(shape, jnp.dtype(in_dtype), rng)
    poison(_nbytes(shape), _nbytes(shape))
    kw = dict(axis=axis, block=block, dtype=elem, scale_rounding=rounding)
    got = jax.jit(lambda v: pq.quantize(v, implementation="cuda", **kw))(x)
    want = ref_quantize(x, **kw)
    assert_same(got.data, want.data, "data")
    assert_same(got.scale, want.scale, "scale")
    assert (got.axes, got.block) == (want.axes, want.block)


@pytest.mark.parametrize("elem", registry.ELEM_DTYPES)
@pytest.mark.parametrize("out_dtype", registry.DEQUANTIZE_OUT_DTYPES)  # float16: saturates at 65504
@pytest.mark.parametrize("block,axis", [("row", -1), ("row", -2), ("square", (-2, -1))])
def test_dequantize_bitexact(elem, out_dtype, block, axis):
    rng = np.random.default_rng(test_seed())
    shape = (2, 96, 544)
    x = random_input(shape, jnp.float32, rng)
    q = ref_quantize(x, axis=axis, block=block, dtype=elem)
    # also exercise scale bytes at the ends of the range (0 and 254 overflow/underflow cases)
    scale = np.asarray(q.scale).copy()
    scale.reshape(-1)[rng.integers(0, scale.size, 8)] = rng.choice([0, 1, 2, 250, 254], 8)
    q = type(q)(data=q.data, scale=jnp.asarray(scale), axes=q.axes, block=q.block)
    poison(_nbytes(shape, jnp.dtype(out_dtype).itemsize))
    got = np.asarray(jax.jit(lambda a: pq.dequantize(a, out_dtype, implementation="cuda"))(q))
    want = np.asarray(ref_dequantize(q, out_dtype))
    nan_g, nan_w = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    assert (nan_g == nan_w).all(), "NaN positions differ"
    assert_same(
        np.where(nan_g, 0, got).astype(got.dtype).view(np.uint8),
        np.where(nan_w, 0, want).astype(want.dtype).view(np.uint8),
        "dequantized",
    )


def test_repeat_determinism():
    rng = np.random.default_rng(test_seed())
    x = random_input((512, 2048), jnp.bfloat16, rng)
    f = jax.jit(lambda v: pq.quantize_rowcol(v, implementation="cuda"))
    a = jax.tree.map(np.asarray, f(x))
    for _ in range(3):
        b = jax.tree.map(np.asarray, f(x))
        for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            assert_same(u, v, "repeat")


def test_vmap_and_leading_axes():
    rng = np.random.default_rng(test_seed())
    x = random_input((4, 64, 256), jnp.bfloat16, rng)
    got = jax.jit(jax.vmap(lambda v: pq.quantize_rowcol(v, implementation="cuda")))(x)
    want = (ref_quantize(x, axis=-1), ref_quantize(x, axis=-2))
    for g, w in zip(got, want, strict=True):
        assert_same(g.data, w.data, "vmap data")
        assert_same(g.scale, w.scale, "vmap scale")


def test_implementation_none_picks_kernel_and_matches():
    rng = np.random.default_rng(test_seed())
    x = random_input((64, 128), jnp.bfloat16, rng)
    hlo = jax.jit(lambda v: pq.quantize(v)).lower(x).as_text()
    assert "jax_mxfp8_quantize" in hlo
    assert_same(pq.quantize(x).data, ref_quantize(x).data, "default implementation")


def test_unsupported_arguments_raise_for_cuda():
    x = jnp.ones((48, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="multiple of the MX block size 32"):
        pq.quantize(x, axis=-2, implementation="cuda")
    with pytest.raises(ValueError, match="stochastic"):
        pq.quantize(jnp.ones((64, 64)), rounding="stochastic", rng=jax.random.key(0), implementation="cuda")
    # implementation=None falls back to the reference for the same arguments
    assert pq.quantize(x, axis=-1).data.shape == x.shape


@pytest.mark.parametrize(
    "make_call,match",
    [
        # scale buffer of the wrong shape
        (
            lambda x: jax.ffi.ffi_call(
                "jax_mxfp8_quantize",
                (jax.ShapeDtypeStruct(x.shape, jnp.float8_e4m3fn), jax.ShapeDtypeStruct((64, 3), jnp.uint8)),
            )(x, kernel="quantize_row_bf16_e4m3_up"),
            "scale is 64 x 3",
        ),
        # FP8 output of a non-FP8 dtype
        (
            lambda x: jax.ffi.ffi_call(
                "jax_mxfp8_quantize",
                (jax.ShapeDtypeStruct(x.shape, jnp.int8), jax.ShapeDtypeStruct((64, 2), jnp.uint8)),
            )(x, kernel="quantize_row_bf16_e4m3_up"),
            "takes f8e4m3fn",
        ),
        # unknown variant name
        (
            lambda x: jax.ffi.ffi_call(
                "jax_mxfp8_quantize",
                (jax.ShapeDtypeStruct(x.shape, jnp.float8_e4m3fn), jax.ShapeDtypeStruct((64, 2), jnp.uint8)),
            )(x, kernel="quantize_bogus"),
            "no quantize kernel named 'quantize_bogus'",
        ),
        # a rowcol variant on the single-orientation target
        (
            lambda x: jax.ffi.ffi_call(
                "jax_mxfp8_quantize",
                (jax.ShapeDtypeStruct(x.shape, jnp.float8_e4m3fn), jax.ShapeDtypeStruct((64, 2), jnp.uint8)),
            )(x, kernel="quantize_rowcol_bf16_e4m3_up"),
            "has mode rowcol",
        ),
        # another op's variant
        (
            lambda x: jax.ffi.ffi_call(
                "jax_mxfp8_quantize",
                (jax.ShapeDtypeStruct(x.shape, jnp.float8_e4m3fn), jax.ShapeDtypeStruct((64, 2), jnp.uint8)),
            )(x, kernel="dequantize_row_e4m3_bf16"),
            "is a dequantize kernel, not quantize",
        ),
        # dimensions that are not multiples of 32
        (
            lambda x: jax.ffi.ffi_call(
                "jax_mxfp8_quantize",
                (jax.ShapeDtypeStruct((64, 48), jnp.float8_e4m3fn), jax.ShapeDtypeStruct((64, 1), jnp.uint8)),
            )(x[:, :48], kernel="quantize_row_bf16_e4m3_up"),
            "multiples of 32",
        ),
        # float16 input
        (
            lambda x: jax.ffi.ffi_call(
                "jax_mxfp8_quantize",
                (jax.ShapeDtypeStruct(x.shape, jnp.float8_e4m3fn), jax.ShapeDtypeStruct((64, 2), jnp.uint8)),
            )(x.astype(jnp.float16), kernel="quantize_row_bf16_e4m3_up"),
            "takes bf16",
        ),
    ],
)
def test_bad_inputs_return_errors(make_call, match):
    x = jnp.ones((64, 64), jnp.bfloat16)
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(jax.jit(make_call)(x))
    # the process is still healthy afterwards
    assert_same(pq.quantize(x, implementation="cuda").data, ref_quantize(x).data, "after error")


def test_e5m2_constants_match_kernel_assumption():
    for fmt in (E4M3, E5M2):
        assert fmt.max == 1.75 * 2.0**fmt.emax


@pytest.mark.parametrize("tune", [cfg.tune for cfg in registry.TUNING_VARIANTS])
@pytest.mark.parametrize("shape", [(96, 160), (256, 1024), (64, 4128), (1056, 4224)])
def test_tuning_variants_bitexact(tune, shape):
    """The comparison schedules of the bf16 row+col kernel must be exactly as correct as production."""
    cfg = registry.find(registry.QuantizeConfig, in_dtype="bfloat16", mode="rowcol", tune=tune)
    if not library.has_kernel(cfg.name):
        pytest.skip(f"{cfg.name} is not in the library (tools/build_library.py --with-tunes builds it)")
    rng = np.random.default_rng(test_seed())
    x = random_input(shape, jnp.bfloat16, rng)
    poison(_nbytes(shape), _nbytes(shape), _nbytes(shape))
    rd, rs, cd, cs = jax.jit(lambda v: pq.QUANTIZE_ROWCOL.call(cfg, "cuda", v))(x)
    r, c = ref_quantize(x, axis=-1), ref_quantize(x, axis=-2)
    for got, want, what in ((rd, r.data, "row data"), (rs, r.scale, "row scale"), (cd, c.data, "col data")):
        assert_same(got, want, f"t{tune} {what}")
    assert_same(cs, c.scale, f"t{tune} col scale")
