"""GPU tests of the fused RMSNorm + MX quantize kernel and of the `implementation=` wiring of the public
ops (jax_mxfp8.quantize / dequantize / rms_norm_quantize).

Run on the H200 with `pytest -m gpu tests/rms_norm/test_rms_norm_quantize_gpu.py`; skipped without the built
library or a GPU of compute capability 9.x / 10.x.

What is checked (kernel numerics: jax_mxfp8/kernels/common/rms_norm_quantize.py):
  * the MXArray equals jax_mxfp8.formats.quantize of the kernel's own y, bit for bit, always;
  * where every float32 partial sum of x^2 is exact (small-integer inputs), y is bit-identical with
    the XLA reference on the same GPU (same division, eps add, rsqrt and multiplies);
  * on general inputs y is within one unit in the last place of the reference's (bf16) and the
    fraction of differing elements is small (the two float32 sums of squares differ in summation
    order only); the observed fraction is printed.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.formats import quantize as ref_quantize
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import rms_norm_quantize as prq
from jax_mxfp8.reference.rms_norm import rms_norm_quantize_fwd
from tests.seeding_testutil import test_seed

pytestmark = pytest.mark.gpu

_ok, _why = library.kernels_runnable()
if not _ok:
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason=_why)]

SENTINEL = 0x5A


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _poison(*nbytes):
    bufs = [jnp.full((n,), SENTINEL, jnp.uint8) for n in nbytes]
    jax.block_until_ready(bufs)
    del bufs


def random_rows(shape, dtype, rng: np.random.Generator, specials: bool = True) -> jax.Array:
    """N(0, 1) rows times 2**e per row (e in [-30, 30]), a few outlier channels, and optional special rows:
    all zero, one NaN, one +-Inf, one huge element."""
    d = shape[-1]
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.exp2(rng.integers(-30, 31, size=(*shape[:-1], 1))).astype(np.float32)
    flat = x.reshape(-1, d)
    cols = rng.choice(d, size=max(1, d // 256), replace=False)
    flat[:, cols] *= 50.0
    if specials and flat.shape[0] >= 8:
        r = rng.choice(flat.shape[0], size=4, replace=False)
        flat[r[0]] = 0.0
        flat[r[1], rng.integers(d)] = np.nan
        flat[r[2], rng.integers(d)] = np.inf * rng.choice([-1, 1])
        flat[r[3], rng.integers(d)] = 3.0e38 if dtype == jnp.float32 else 1.0e38
    return jnp.asarray(flat.reshape(shape), dtype=dtype)


def random_weight(d, rng, dtype=jnp.float32) -> jax.Array:
    w = 1.0 + 0.25 * rng.standard_normal(d)
    w[rng.choice(d, size=max(1, d // 64), replace=False)] *= -1.0
    return jnp.asarray(w, dtype=dtype)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|ordinal(a) - ordinal(b)| for same-dtype float arrays (0 where both are NaN)."""
    ia, ib = _bits(a).astype(np.int64), _bits(b).astype(np.int64)
    sign = 1 << (8 * a.dtype.itemsize - 1)

    def ordinal(i):
        return np.where(i & sign, -(i & (sign - 1)), i)

    nan = np.isnan(np.asarray(a, np.float32)) & np.isnan(np.asarray(b, np.float32))
    return np.where(nan, 0, np.abs(ordinal(ia) - ordinal(ib)))


def kernel_call(x, w, **kw):
    return jax.jit(lambda a, b: prq.rms_norm_quantize_fwd(a, b, implementation="cuda", **kw))(x, w)


def reference_call(x, w, eps, **kw):
    return jax.jit(lambda a, b: rms_norm_quantize_fwd(a, b, eps, **kw))(x, w)


def assert_mx_is_quantize_of_y(y, q, elem, rounding, what=""):
    want = jax.jit(lambda v: ref_quantize(v, axis=-1, dtype=elem, scale_rounding=rounding))(y)
    for got, ref, name in ((q.data, want.data, "data"), (q.scale, want.scale, "scale")):
        g, r = _bits(got), _bits(ref)
        bad = g != r
        if bad.any():
            idx = np.argwhere(bad)[:5].tolist()
            unwritten = int(((g == SENTINEL) & (r != SENTINEL)).sum())
            pytest.fail(f"{what} {name}: {int(bad.sum())} of {bad.size} differ ({unwritten} look unwritten) at {idx}")
    assert (q.axes, q.block) == ((-1,), "row")


CASES = list(itertools.product(registry.IN_DTYPES, registry.ELEM_DTYPES, registry.SCALE_ROUNDINGS))
SHAPES = [(8, 32), (64, 96), (40, 1024), (2, 16, 4128), (33, 8192)]


@pytest.mark.parametrize("in_dtype,elem,rounding", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_mx_equals_quantize_of_kernel_y_and_y_close(in_dtype, elem, rounding, shape):
    rng = np.random.default_rng(test_seed())
    dt = jnp.dtype(in_dtype)
    x = random_rows(shape, dt, rng)
    w = random_weight(shape[-1], rng)
    n = int(np.prod(shape))
    _poison(n * dt.itemsize, n, n // 32)
    y, q = kernel_call(x, w, eps=1e-6, dtype=elem, scale_rounding=rounding)
    assert y.dtype == dt and y.shape == x.shape and q.data.shape == x.shape
    assert_mx_is_quantize_of_y(y, q, elem, rounding, f"{in_dtype} {shape}")
    y_ref, _ = reference_call(x, w, 1e-6, dtype=elem, scale_rounding=rounding)
    yk, yr = np.asarray(y), np.asarray(y_ref)
    assert (np.isnan(yk.astype(np.float32)) == np.isnan(yr.astype(np.float32))).all(), "NaN positions differ"
    dist = ulp_distance(yk, yr)
    limit = 1 if dt == jnp.bfloat16 else 16
    assert dist.max() <= limit, f"y differs by up to {dist.max()} ulps (limit {limit})"
    frac = float((dist > 0).mean())
    print(f"\n{in_dtype} {shape}: y differs from the XLA reference in {frac:.2e} of elements (max {dist.max()} ulp)")
    assert frac < (2e-3 if dt == jnp.bfloat16 else 0.5)


def _mean_candidates(x, w, eps, out_dtype):
    """y for small-integer x under three ways of forming m = mean(x^2) + eps from the exact sum S:
    A: S / D + eps (IEEE divide, add); B: S * f32(1/D) + eps (multiply, add); C: fma(S, f32(1/D), eps).
    rsqrt on the GPU (lax.rsqrt), the multiplies in float32 on the host. Diagnostics for a mismatch."""
    from fractions import Fraction

    x32 = np.asarray(x, np.float32)
    d = x32.shape[-1]
    s_exact = (x32.astype(np.int64) ** 2).sum(-1)
    d32, e32 = np.float32(d), np.float32(eps)
    rcp = np.float32(1) / d32
    s32 = s_exact.astype(np.float32)
    ms = {
        "A(div,add)": s32 / d32 + e32,
        "B(mul,add)": s32 * rcp + e32,
        "C(fma)": np.array(
            [np.float32(float(Fraction(int(v)) * Fraction(float(rcp)) + Fraction(float(e32)))) for v in s_exact],
            np.float32,
        ),
    }
    out = {}
    for name, m in ms.items():
        r = np.asarray(jax.jit(jax.lax.rsqrt)(jnp.asarray(m)), np.float32)[:, None]
        y = (x32 * r) * np.asarray(w, np.float32)
        out[name] = np.asarray(jnp.asarray(y).astype(out_dtype))
    return out


@pytest.mark.parametrize("in_dtype", registry.IN_DTYPES)
@pytest.mark.parametrize("d", [32, 96, 1024, 4096, 5120, 12288])
def test_y_bitexact_where_sum_of_squares_is_exact(in_dtype, d):
    """Small-integer x: every partial sum of x^2 is an exact float32 integer in any order, so the kernel
    and XLA agree on the mean; y must then be bit-identical (division, eps, rsqrt, multiplies, rounding)."""
    rng = np.random.default_rng(test_seed())
    dt = jnp.dtype(in_dtype)
    x = jnp.asarray(rng.integers(-8, 9, size=(64, d)), dt)
    w = jnp.asarray(rng.standard_normal(d), jnp.bfloat16).astype(jnp.float32)  # any float32 weight
    for eps in (1e-6, 1e-5, 0.0 + 2.0**-10):
        y, q = kernel_call(x, w, eps=eps)
        y_ref, q_ref = reference_call(x, w, eps, dtype=jnp.float8_e4m3fn, scale_rounding="up")
        bad = _bits(y) != _bits(y_ref)
        if bad.any():
            cands = _mean_candidates(x, w, eps, dt)
            match = {
                n: (int((_bits(c) != _bits(y_ref)).sum()), int((_bits(c) != _bits(y)).sum())) for n, c in cands.items()
            }
            pytest.fail(
                f"eps={eps} d={d}: {int(bad.sum())} of {bad.size} y differ; first "
                f"{np.argwhere(bad)[:3].tolist()}: {np.asarray(y)[bad][:3]} vs {np.asarray(y_ref)[bad][:3]}; "
                f"(elements differing from XLA, from the kernel) per way of forming the mean: {match}"
            )
        assert (_bits(q.data) == _bits(q_ref.data)).all() and (_bits(q.scale) == _bits(q_ref.scale)).all()


@pytest.mark.parametrize("in_dtype", registry.IN_DTYPES)
@pytest.mark.parametrize("d", [32, 1024, 4128])
def test_rows_whose_sum_of_squares_overflows(in_dtype, d):
    """Rows of finite values whose float32 x * x sum overflows take the scaled branch (reference/rms_norm.py
    inv_rms: sum of (x * 2^-80)^2, y = ((x * r) * 2^-80) * w), in one batch with ordinary rows and rows holding
    Inf or NaN (the branch is per CTA, so per row). Small integers times 2^70: every scaled square and partial
    sum is exact in any order, so y is bit-identical with the reference; random huge rows within the general
    test's ulp limits; the MXArray is quantize(y) always; the plain formula would give 0 for those rows."""
    rng = np.random.default_rng(test_seed())
    dt = jnp.dtype(in_dtype)
    x = rng.integers(-8, 9, size=(64, d)).astype(np.float32)
    x[::2] *= 2.0**70  # even rows overflow; odd rows are ordinary small integers (exact sums too)
    x[10, 3], x[12, 5], x[13, 7] = np.inf, np.nan, np.inf  # an overflowing row with Inf; an ordinary row with Inf
    x, w = jnp.asarray(x, dt), random_weight(d, rng)
    y, q = kernel_call(x, w, eps=1e-6)
    y_ref, _ = reference_call(x, w, 1e-6, dtype=jnp.float8_e4m3fn, scale_rounding="up")
    assert_mx_is_quantize_of_y(y, q, jnp.float8_e4m3fn, "up", f"overflow rows {in_dtype} {d}")
    yk, yr = np.asarray(y), np.asarray(y_ref)
    assert (np.isnan(yk.astype(np.float32)) == np.isnan(yr.astype(np.float32))).all(), "NaN positions differ"
    same = (_bits(y) == _bits(y_ref)) | (np.isnan(yk.astype(np.float32)) & np.isnan(yr.astype(np.float32)))
    assert same.all(), f"{int((~same).sum())} y differ, rows {sorted(set(np.argwhere(~same)[:, 0].tolist()))[:8]}"
    huge = np.ones(64, bool)
    huge[1::2], huge[[10, 12, 13]] = False, False
    assert np.all(np.abs(yk[huge].astype(np.float32)).max(-1) > 0.1)
    # random rows past the overflow point (2^60 .. 2^126 times N(0, 1)): within the general test's limits
    xr = rng.standard_normal((64, d)) * np.exp2(rng.integers(60, 127, size=(64, 1)))
    xr = jnp.asarray(np.clip(xr, -3.0e38, 3.0e38), dt)
    y, q = kernel_call(xr, w, eps=1e-6)
    assert_mx_is_quantize_of_y(y, q, jnp.float8_e4m3fn, "up", f"random huge rows {in_dtype} {d}")
    y_ref, _ = reference_call(xr, w, 1e-6, dtype=jnp.float8_e4m3fn, scale_rounding="up")
    dist = ulp_distance(np.asarray(y), np.asarray(y_ref))
    assert dist.max() <= (1 if dt == jnp.bfloat16 else 16), f"y differs by up to {dist.max()} ulps"


def test_large_rows_and_limits():
    rng = np.random.default_rng(test_seed())
    cfg = registry.find(registry.RMSNormQuantizeConfig, in_dtype="bfloat16", elem_dtype="float8_e4m3fn")
    x = random_rows((4, cfg.max_d), jnp.bfloat16, rng, specials=False)
    w = random_weight(cfg.max_d, rng)
    y, q = kernel_call(x, w)
    assert_mx_is_quantize_of_y(y, q, jnp.float8_e4m3fn, "up", "max_d")
    x_big = jnp.ones((2, cfg.max_d + 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="at most"):
        prq.rms_norm_quantize_fwd(x_big, jnp.ones((cfg.max_d + 32,)), implementation="cuda")
    # implementation=None falls back to the reference for the same arguments
    y2, _ = prq.rms_norm_quantize_fwd(x_big, jnp.ones((cfg.max_d + 32,)))
    assert y2.shape == x_big.shape


def test_vmap_rank1_and_weight_dtypes():
    rng = np.random.default_rng(test_seed())
    x = random_rows((3, 64, 256), jnp.bfloat16, rng, specials=False)
    w = random_weight(256, rng, jnp.bfloat16)
    y, q = jax.jit(jax.vmap(lambda a: prq.rms_norm_quantize_fwd(a, w, implementation="cuda")))(x)
    y2, q2 = kernel_call(x, w)
    assert (_bits(y) == _bits(y2)).all() and (_bits(q.data) == _bits(q2.data)).all()
    # per-example weights: the reference under vmap
    ws = jnp.stack([w, w * 2, -w])
    yv, _ = jax.vmap(lambda a, b: prq.rms_norm_quantize_fwd(a, b, implementation="cuda"))(x, ws)
    assert yv.shape == x.shape
    # rank-1 input
    y1, q1 = kernel_call(x[0, 0], w)
    assert y1.shape == (256,) and q1.scale.shape == (8,)
    assert_mx_is_quantize_of_y(y1, q1, jnp.float8_e4m3fn, "up", "rank 1")


def test_public_rms_norm_quantize_uses_kernel_and_differentiates():
    rng = np.random.default_rng(test_seed())
    x = random_rows((128, 512), jnp.bfloat16, rng, specials=False)
    w = random_weight(512, rng)
    hlo = jax.jit(lambda a, b: jax_mxfp8.rms_norm_quantize(a, b)).lower(x, w).as_text()
    assert "jax_mxfp8_rms_norm_quantize" in hlo
    hlo_xla = jax.jit(lambda a, b: jax_mxfp8.rms_norm_quantize(a, b, implementation="xla")).lower(x, w).as_text()
    assert "jax_mxfp8_rms_norm_quantize" not in hlo_xla

    def loss(impl):
        return lambda a, b: jnp.sum(jax_mxfp8.rms_norm_quantize(a, b, implementation=impl)[0].astype(jnp.float32) ** 2)

    gk = jax.jit(jax.grad(loss("cuda"), argnums=(0, 1)))(x, w)
    gr = jax.jit(jax.grad(loss("xla"), argnums=(0, 1)))(x, w)
    for a, b in zip(gk, gr):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.linalg.norm(a - b) <= 1e-2 * np.linalg.norm(b)


def test_public_quantize_dequantize_implementation():
    rng = np.random.default_rng(test_seed())
    x = jnp.asarray(rng.standard_normal((256, 512)), jnp.bfloat16)
    for kw in (dict(), dict(axis=-2), dict(block="square", axis=(-2, -1)), dict(dtype=jnp.float8_e5m2)):
        qc = jax_mxfp8.quantize(x, implementation="cuda", **kw)
        qx = jax_mxfp8.quantize(x, implementation="xla", **kw)
        assert (_bits(qc.data) == _bits(qx.data)).all() and (_bits(qc.scale) == _bits(qx.scale)).all()
        assert (qc.axes, qc.block) == (qx.axes, qx.block)
        dc = jax_mxfp8.dequantize(qc, jnp.bfloat16, implementation="cuda")
        dx = jax_mxfp8.dequantize(qx, jnp.bfloat16, implementation="xla")
        assert (_bits(dc) == _bits(dx)).all()
    hlo = jax.jit(lambda v: jax_mxfp8.quantize(v)).lower(x).as_text()
    assert "jax_mxfp8_quantize" in hlo
    hlo = jax.jit(lambda v: jax_mxfp8.quantize(v, implementation="xla")).lower(x).as_text()
    assert "jax_mxfp8_quantize" not in hlo
    # zero gradient through quantize on the kernel path, like the reference
    g = jax.grad(lambda v: jnp.sum(jax_mxfp8.dequantize(jax_mxfp8.quantize(v, implementation="cuda"))))(x)
    assert not np.asarray(g, np.float32).any()
    with pytest.raises(ValueError, match="multiple of the MX block size 32"):
        jax_mxfp8.quantize(jnp.ones((48, 64)), axis=-2, implementation="cuda")


def test_bad_inputs_return_errors():
    x = jnp.ones((64, 64), jnp.bfloat16)

    def call(x, w, out_dtype=jnp.float8_e4m3fn, y_dtype=None):
        out = (
            jax.ShapeDtypeStruct(x.shape, y_dtype or x.dtype),
            jax.ShapeDtypeStruct(x.shape, out_dtype),
            jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 32), jnp.uint8),
        )
        return jax.ffi.ffi_call("jax_mxfp8_rms_norm_quantize", out)(
            x, w, eps=np.float32(1e-6), kernel="rms_norm_quantize_bf16_e4m3_up"
        )

    for fn, match in (
        (lambda: call(x, jnp.ones((64,), jnp.bfloat16)), "expected f32"),
        (lambda: call(x, jnp.ones((32,), jnp.float32)), "weight must have shape"),
        (lambda: call(x, jnp.ones((64,), jnp.float32), out_dtype=jnp.int8), "takes f8e4m3fn"),
        (lambda: call(x, jnp.ones((64,), jnp.float32), y_dtype=jnp.float32), "y has dtype"),
        (lambda: call(x.astype(jnp.float16), jnp.ones((64,), jnp.float32)), "takes bf16"),
    ):
        with pytest.raises(Exception, match=match):
            jax.block_until_ready(jax.jit(fn)())
    y, q = kernel_call(x, jnp.ones((64,), jnp.float32))  # still healthy
    assert_mx_is_quantize_of_y(y, q, jnp.float8_e4m3fn, "up", "after errors")
