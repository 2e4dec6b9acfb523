"""The Hopper MX GEMM (primitives/mx_gemm.py, kernels/sm90/mx_gemm.py) against a float64 evaluation of its formula.

CPU: the XLA emulation (path "emulated", through the FfiOp's partitioning and batching) within float32
rounding of the float64 formula (random E4M3/E5M2 data, random power-of-two scales, NaN scale entries,
partial tiles, G > 1, bias, bf16/f32 out), vmap and sharding of the call, and mx_gemm_unsupported /
ValueErrors for bad inputs. GPU (@pytest.mark.gpu): the kernel within the bound of FP8-wgmma accumulation
of each 128-K tile plus float32 promotion and one final rounding (SQNR printed), every output element
written (NaN-poisoned buffer), NaN scales propagate to exactly their rows / columns, M and N that are not
tile multiples, persistent scheduling (more tiles than CTAs), batch, bias, e5m2 operands, both production
tilings forced (128x192 and 128x128: each against float64, bit for bit equal to each other, every element of
a poisoned buffer written), every tuning (and every tuning bit for bit equal to the production variant),
bitwise identical across 3 runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import mx_gemm as mg
from tests.gemm.mx_gemm_testutil import K_TILE, error_bound, formula64, operands, sqnr_db
from tests.seeding_testutil import test_seed

E4, E5 = "float8_e4m3fn", "float8_e5m2"

WGMMA_REL = 2.0**-7
"""Accumulation error allowed per 128-K partial, relative to its absolute sum. Hopper's FP8 wgmma adds
products aligned to the largest exponent with ~14 bits kept (DeepSeek-V3): up to ~2^-13 of the largest
addend lost per product, 32 products + the accumulator per k32 step, four steps per partial. Measured on
these inputs (log-uniform magnitudes over 2^24): up to 1.1e-3 = 2^-9.8 (on the H200). A wrong scale or
fragment index gives errors of order 1; test_kernel_exact_on_small_integers checks the indexing exactly."""


FLOAT32_DOT_REL = K_TILE * 2.0**-24
"""The emulation's float32 dot of 128 exact products: at most 127 roundings of 2^-24 relative to the
absolute sum (any summation order)."""


def _rng() -> np.random.Generator:
    return np.random.default_rng(test_seed())


def _run(ops: dict, out_dtype: str, path: str, tune: int = 0, jit: bool = True, tile_n: int | None = None):
    args = [jnp.asarray(ops[k]) for k in ("a", "b", "sa", "sb")]
    bias = None if ops["bias"] is None else jnp.asarray(ops["bias"])
    kw = dict(out_dtype=out_dtype, path=path, tune=tune, tile_n=tile_n)
    f = lambda a, b, sa, sb, bias: mg.mx_gemm(a, b, sa, sb, bias, **kw)  # noqa: E731
    f = jax.jit(f) if jit else f
    return np.asarray(f(*args, bias).astype(jnp.float32), np.float64)


def _check(c: np.ndarray, ops: dict, out_dtype: str, acc_rel: float, label: str) -> None:
    c64, absdot = formula64(ops)
    kt = ops["a"].shape[2] // K_TILE
    bound = error_bound(c64, absdot, kt, out_dtype, acc_rel)
    nan = np.isnan(c64)
    np.testing.assert_array_equal(np.isnan(c), nan, err_msg=f"{label}: NaN pattern differs")
    err = np.abs(c - c64)[~nan]
    worst = float(np.max(err / bound[~nan])) if err.size else 0.0
    rel = float(np.max(err / (absdot[~nan] + 1e-30))) if err.size else 0.0
    print(f"{label}: SQNR {sqnr_db(c, c64):.1f} dB, max |err| / bound {worst:.3f}, max |err| / absdot {rel:.2e}")
    assert worst <= 1.0, f"{label}: error {worst:.3f}x the bound"


# (g, m, n, k, a_dtype, b_dtype, out_dtype, bias)
CPU_CASES = [
    (1, 128, 128, 128, E4, E4, "float32", False),
    (2, 48, 80, 300, E4, E5, "bfloat16", True),
    (3, 144, 272, 520, E5, E5, "float32", True),
    (1, 16, 32, 1024, E5, E4, "bfloat16", False),
]


def _case_id(c) -> str:
    g, m, n, k, a, b, o, bias = c
    return f"g{g}_m{m}_n{n}_k{k}_{a[7:11]}x{b[7:11]}_{o[:4]}{'_bias' if bias else ''}"


@pytest.mark.parametrize("case", CPU_CASES, ids=_case_id)
def test_emulation_matches_float64(case):
    g, m, n, k, a_dt, b_dt, out, bias = case
    ops = operands(_rng(), g, m, n, k, a_dt, b_dt, bias, nan_rows=((0, 0, 3),), nan_cols=((g - 1, 0, 5),))
    _check(_run(ops, out, "emulated"), ops, out, FLOAT32_DOT_REL, "emulated")


def test_emulation_vmap_and_sharding():
    """vmap folds into G (bias unbatched broadcasts: the same bits); sharding m and n over 4 CPU devices."""
    ops = operands(_rng(), 2, 64, 96, 256, bias=True)
    args = [jnp.asarray(ops[k]) for k in ("a", "b", "sa", "sb")]
    bias = jnp.asarray(ops["bias"])
    one = lambda a, b, sa, sb: mg.mx_gemm(a, b, sa, sb, bias, out_dtype="float32", path="emulated")  # noqa: E731
    full = np.asarray(one(*args))
    per = jax.vmap(lambda a, b, sa, sb: one(a[None], b[None], sa[None], sb[None])[0])(*args)
    np.testing.assert_array_equal(np.asarray(per), full)
    devs = np.array(jax.devices("cpu")[:4]).reshape(2, 2)
    mesh = jax.sharding.Mesh(devs, ("x", "y"))
    spec = lambda *p: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*p))  # noqa: E731
    placed = [
        jax.device_put(args[0], spec(None, "x", None)),
        jax.device_put(args[1], spec(None, "y", None)),
        jax.device_put(args[2], spec(None, None, "x")),
        jax.device_put(args[3], spec(None, None, "y")),
    ]
    sharded = jax.jit(one)(*placed)
    # XLA:CPU blocks the per-shard dots differently: the float64 bound, not the bits
    _check(np.asarray(sharded, np.float64), ops, "float32", FLOAT32_DOT_REL, "sharded")


def test_emulation_nan_scale_rows():
    """A NaN scale of (g, kt, m) makes row m of batch g NaN (even where the partial is 0), nothing else."""
    ops = operands(_rng(), 2, 32, 48, 256, nan_rows=((1, 1, 7),), nan_cols=((0, 0, 2),))
    ops["a"][1, 7, 128:] = 0  # the NaN tile's partial is exactly 0: 0 * NaN is still NaN
    c = _run(ops, "float32", "emulated")
    want = np.zeros(c.shape, bool)
    want[1, 7, :] = True
    want[0, :, 2] = True
    np.testing.assert_array_equal(np.isnan(c), want)


@pytest.mark.parametrize(
    "a_shape, b_shape, a_dt, b_dt, out, bias, fragment",
    [
        ((1, 128, 256), (1, 128, 256), E4, E4, "bfloat16", False, None),
        ((1, 128, 256), (1, 128, 256), E5, E4, "float32", True, None),
        ((128, 256), (128, 256), E4, E4, "bfloat16", False, "rank 3"),
        ((2, 128, 256), (1, 128, 256), E4, E4, "bfloat16", False, "agree on G"),
        ((1, 128, 256), (1, 128, 384), E4, E4, "bfloat16", False, "agree on G"),
        ((1, 128, 200), (1, 128, 200), E4, E4, "bfloat16", False, "multiple of 128"),
        ((1, 0, 0), (1, 16, 0), E4, E4, "bfloat16", False, "multiple of 128"),
        ((1, 120, 256), (1, 128, 256), E4, E4, "bfloat16", False, "multiples of 16"),
        ((1, 128, 256), (1, 136, 256), E4, E4, "bfloat16", False, "multiples of 16"),
        ((1, 128, 256), (1, 128, 256), "bfloat16", E4, "bfloat16", False, "a has dtype bfloat16"),
        ((1, 128, 256), (1, 128, 256), E4, "int8", "bfloat16", False, "b has dtype int8"),
        ((1, 128, 256), (1, 128, 256), E4, E4, "float16", False, "out_dtype=float16"),
    ],
)
def test_unsupported(a_shape, b_shape, a_dt, b_dt, out, bias, fragment):
    why = mg.mx_gemm_unsupported(a_shape, b_shape, a_dt, b_dt, out, bias)
    if fragment is None:
        assert why is None
    else:
        assert why is not None and fragment in why, why


def test_bad_arguments_raise():
    ops = operands(_rng(), 1, 32, 32, 256, bias=True)
    a, b, sa, sb, bias = (jnp.asarray(ops[k]) for k in ("a", "b", "sa", "sb", "bias"))

    def call(**kw):
        return mg.mx_gemm(**{**dict(a=a, b=b, sa=sa, sb=sb, bias=bias), **kw}, out_dtype="bfloat16", path="emulated")

    with pytest.raises(ValueError, match="sa has shape"):
        call(sa=sa[:, :1])
    with pytest.raises(ValueError, match="sb has dtype"):
        call(sb=sb.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match="bias must be float32"):
        call(bias=bias[:16])
    with pytest.raises(ValueError, match="multiple of 128"):
        call(a=a[:, :, :200], b=b[:, :, :200])
    with pytest.raises(ValueError, match="no tuning"):
        mg.mx_gemm(a, b, sa, sb, bias, out_dtype="bfloat16", path="emulated", tune=1)
    with pytest.raises(ValueError, match="path"):
        mg.mx_gemm(a, b, sa, sb, bias, out_dtype="bfloat16", path="xla")


def test_registry_variants():
    names = [v.name for v in registry.MX_GEMM_VARIANTS + registry.MX_GEMM_TUNINGS]
    assert len(set(names)) == len(names)
    for a, b, o, bias in [(E4, E4, "bfloat16", False), (E5, E4, "float32", True)]:
        v = registry.find(registry.MXGemmConfig, a_dtype=a, b_dtype=b, out_dtype=o, has_bias=bias)
        assert v is not None and v.tune == 0 and v.tile_n == 192 and v.smem_bytes <= 227 * 1024
        n128 = registry.find(registry.MXGemmConfig, a_dtype=a, b_dtype=b, out_dtype=o, has_bias=bias, tile_n=128)
        assert n128.name == v.name + "_n128" and n128.smem_bytes <= 227 * 1024
        assert (n128.cluster_m, n128.unroll_stages, n128.uniform_desc) == (v.cluster_m, True, True)
    with pytest.raises(ValueError, match="tile_n"):
        registry.MXGemmConfig(tile_n=256)
    with pytest.raises(ValueError, match="cluster_m"):
        registry.MXGemmConfig(cluster_m=4)
    # production plus two comparison schedules (the first kernel, the previous production), e4m3 -> bf16 only
    assert [v.tune for v in registry.MX_GEMM_TUNINGS] == [1, 10]
    for v in registry.MX_GEMM_TUNINGS:
        assert (v.a_dtype, v.b_dtype, v.out_dtype, v.has_bias) == (E4, E4, "bfloat16", False)


# ---------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------

GPU_CASES = [
    (1, 256, 256, 512, E4, E4, "bfloat16", False),
    (3, 144, 272, 300, E4, E4, "float32", True),  # partial M and N tiles, K padded, batch, bias
    (2, 400, 208, 1024, E5, E4, "bfloat16", True),
    (1, 128, 384, 256, E4, E5, "float32", False),
    (4, 784, 768, 640, E5, E5, "bfloat16", False),
    (1, 2048, 2048, 4096, E4, E4, "float32", False),  # 8 x 11 cluster tiles > 66 clusters: persistent
    # 176 cluster tiles: several work tiles per CTA with 9 K tiles each (2 laps of the 4-stage ring and a
    # remainder): the ring's per-stage phase bits carried across work tiles
    (2, 2048, 2048, 1152, E4, E4, "bfloat16", False),
    (1, 256, 384, 128, E4, E4, "bfloat16", True),  # one K tile (no lap of the unrolled ring)
]


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
@pytest.mark.parametrize("case", GPU_CASES, ids=_case_id)
def test_kernel_matches_float64(case):
    g, m, n, k, a_dt, b_dt, out, bias = case
    ops = operands(_rng(), g, m, n, k, a_dt, b_dt, bias)
    _check(_run(ops, out, "cuda"), ops, out, WGMMA_REL, f"kernel {_case_id(case)}")


def _skip_unless_built(tune: int) -> None:
    """The comparison schedules are in the library only when it was built with --with-tunes."""
    name = next(v.name for v in registry.MX_GEMM_TUNINGS if v.tune == tune)
    if not library.has_kernel(name):
        pytest.skip(f"{name} is not in the library (tools/build_library.py --with-tunes builds it)")


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
@pytest.mark.parametrize("tune", [v.tune for v in registry.MX_GEMM_TUNINGS])
def test_kernel_tunings_match_float64(tune):
    _skip_unless_built(tune)
    ops = operands(_rng(), 2, 272, 592, 1152)  # 3 M tiles: a cluster pair's second CTA is past M
    _check(_run(ops, "bfloat16", "cuda", tune=tune), ops, "bfloat16", WGMMA_REL, f"kernel tune {tune}")


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
def test_kernel_tunings_bitwise_equal():
    """Every comparison schedule (tile shape, cluster, rolled K loop) changes only when and where the same
    per-element operations run (the same 4 wgmmas per 128-K tile on a fresh accumulator, the same FFMA
    promotion in K order), never the numerics: all return the production variant's bits."""
    for v in registry.MX_GEMM_TUNINGS:
        _skip_unless_built(v.tune)
    # K tiles: 9 (unroll_stages: laps + a remainder), 1 (no lap), 20 (whole laps of 4 and of 5 stages)
    for shape in [(2, 272, 592, 1152), (1, 256, 384, 128), (1, 144, 400, 2560)]:
        ops = operands(_rng(), *shape, nan_rows=((0, 0, 5),))
        want = _run(ops, "bfloat16", "cuda")
        for v in registry.MX_GEMM_TUNINGS:
            got = _run(ops, "bfloat16", "cuda", tune=v.tune)
            np.testing.assert_array_equal(got, want, err_msg=f"tune {v.tune} at {shape}")


TILING_CASES = [
    # N = 1024: 5.33 tiles of 192, 8 of 128; M not a multiple of 128 (a partial M tile, a cluster pair's second
    # CTA past M); 9 K tiles: one lap of the 6-stage ring (128x128) or two of the 4-stage ring + remainder
    (1, 1040, 1024, 1152, E4, E4, "bfloat16", False),
    (2, 400, 1024, 1024, E5, E4, "float32", True),
    # N = 1536 (8 tiles of 192, 12 of 128), 1 K tile; persistent: 2 x 9 x 8 (192) and 2 x 9 x 12 (128)
    # cluster tiles, both > 66 clusters
    (2, 2304, 1536, 128, E4, E5, "bfloat16", True),
    (1, 144, 272, 2560, E5, E5, "bfloat16", False),  # both edges partial, 20 K tiles (laps of 4 and of 6)
]


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
@pytest.mark.parametrize("case", TILING_CASES, ids=_case_id)
def test_kernel_tilings_match_float64_and_each_other(case):
    """Each production tiling forced (tile_n=192, 128) within the bound of the float64 formula, and the two
    bit for bit equal (the same per-element operations in the same K order; only the tile shape differs)."""
    g, m, n, k, a_dt, b_dt, out, bias = case
    ops = operands(_rng(), g, m, n, k, a_dt, b_dt, bias, nan_rows=((0, 0, 3),))
    got = {t: _run(ops, out, "cuda", tile_n=t) for t in registry.PRODUCTION_TILE_NS}
    for t, c in got.items():
        _check(c, ops, out, WGMMA_REL, f"tile_n {t} {_case_id(case)}")
    np.testing.assert_array_equal(got[128], got[192], err_msg="the tilings differ")


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
@pytest.mark.parametrize("tile_n", [192, 128])
def test_kernel_tiling_writes_every_element(tile_n):
    """N = 1024 with M = 1040 (not a multiple of 128) into a NaN-filled buffer: every element written."""
    ops = operands(_rng(), 1, 1040, 1024, 384, bias=True)
    args = [jnp.asarray(ops[k]) for k in ("a", "b", "sa", "sb", "bias")]
    poison = jnp.full((1, 1040, 1024), jnp.nan, jnp.float32)
    c = np.asarray(mg.mx_gemm(*args, out_dtype="float32", path="cuda", tile_n=tile_n, out=poison), np.float64)
    assert not np.isnan(c).any()
    _check(c, ops, "float32", WGMMA_REL, f"into, tile_n {tile_n}")


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_writes_every_element(bias):
    """A NaN-filled output buffer comes back NaN-free: every (g, m, n) is written, edge tiles included."""
    ops = operands(_rng(), 2, 144, 272, 384, bias=bias)
    args = [jnp.asarray(ops[k]) for k in ("a", "b", "sa", "sb")]
    bias_arr = None if ops["bias"] is None else jnp.asarray(ops["bias"])
    poison = jnp.full((2, 144, 272), jnp.nan, jnp.float32)
    c = mg.mx_gemm(*args, bias_arr, out_dtype="float32", path="cuda", out=poison)
    c = np.asarray(c, np.float64)
    assert not np.isnan(c).any()
    _check(c, ops, "float32", WGMMA_REL, "into")


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
def test_kernel_nan_scales_propagate():
    ops = operands(_rng(), 2, 144, 160, 384, nan_rows=((1, 2, 7),), nan_cols=((0, 0, 150),))
    ops["a"][1, 7, 256:] = 0  # 0 * NaN is NaN in the kernel too
    c = _run(ops, "bfloat16", "cuda")
    want = np.zeros(c.shape, bool)
    want[1, 7, :] = True
    want[0, :, 150] = True
    np.testing.assert_array_equal(np.isnan(c), want)
    _check(c, ops, "bfloat16", WGMMA_REL, "nan scales")


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
def test_kernel_deterministic():
    ops = operands(_rng(), 2, 1024, 1040, 2048, bias=True)
    args = [jnp.asarray(ops[k]) for k in ("a", "b", "sa", "sb", "bias")]
    f = jax.jit(lambda *x: mg.mx_gemm(*x, out_dtype="float32", path="cuda"))
    runs = [np.asarray(f(*args)) for _ in range(3)]
    for r in runs[1:]:
        np.testing.assert_array_equal(r.view(np.uint32), runs[0].view(np.uint32))


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
def test_kernel_exact_on_small_integers():
    """Integer data in [-4, 4] and scales in {1, 2, 4}: every partial (|.| <= 2048) and the float32 sum are
    exact, so the kernel must return the float64 formula's bits: checks every row, column and K tile
    lands on its own scale (edge tiles, batch, K padding, bias)."""
    rng = _rng()
    ops = operands(rng, 2, 272, 400, 1000, bias=True)
    for key in ("a", "b"):
        x = rng.integers(-4, 5, size=ops[key].shape).astype(np.float32)
        x[:, :, 1000:] = 0
        ops[key] = x.astype(ops[key].dtype)
    for key in ("sa", "sb"):
        ops[key] = np.exp2(rng.integers(0, 3, size=ops[key].shape)).astype(np.float32)
    ops["bias"] = rng.integers(-100, 101, size=ops["bias"].shape).astype(np.float32)
    c64, _ = formula64(ops)
    c = _run(ops, "float32", "cuda")
    np.testing.assert_array_equal(c, c64)
