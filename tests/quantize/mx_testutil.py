"""Shared helpers of the format tests: input generators, jitted library entry points, byte views.

Generators only build inputs (NumPy, seeded); nothing here computes an expected value.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import jax_mxfp8 as mx
from tests.quantize import mx_oracle as orc

F32_TINY = np.float32(2.0**-126)  # smallest normal float32; the contract lets inputs below it flush to zero

INPUT_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
ELEM_DTYPES = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}


# ---------------------------------------------------------------------------------------------------------
# Library entry points (always under jit: the eager path would only be slower, not different)
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def _jitted_quantize(axis, block, dtype, scale_rounding, rounding):
    def f(x, rng=None):
        return mx.quantize(
            x, axis=axis, block=block, dtype=dtype, scale_rounding=scale_rounding, rounding=rounding, rng=rng
        )

    return jax.jit(f)


def lib_quantize(
    x, *, axis=-1, block="row", dtype=jnp.float8_e4m3fn, scale_rounding="up", rounding="nearest", rng=None
):
    axis = tuple(axis) if not isinstance(axis, int) else axis
    f = _jitted_quantize(axis, block, dtype, scale_rounding, rounding)
    return f(jnp.asarray(x)) if rng is None else f(jnp.asarray(x), rng)


@functools.cache
def _jitted_dequantize(dtype):
    return jax.jit(lambda a: mx.dequantize(a, dtype))


def lib_dequantize(a, dtype=jnp.float32) -> np.ndarray:
    return np.asarray(_jitted_dequantize(dtype)(a))


def data_bytes(a) -> np.ndarray:
    d = np.asarray(a.data)
    assert d.dtype in (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)), d.dtype
    return d.view(np.uint8)


def scale_bytes(a) -> np.ndarray:
    s = np.asarray(a.scale)
    assert s.dtype == np.uint8, s.dtype
    return s


# ---------------------------------------------------------------------------------------------------------
# Input generators
# ---------------------------------------------------------------------------------------------------------


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """Zeroes float32-subnormal magnitudes (the contract lets them flush, so bit-exact tests avoid them)."""
    x32 = x.astype(np.float32)
    return np.where(np.abs(x32) < F32_TINY, np.zeros_like(x), x)


def _cast(x64: np.ndarray, in_dtype) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        x = x64.astype(np.float32).astype(in_dtype)
    if np.dtype(in_dtype) != np.dtype(np.float16):  # float16 subnormals are normal float32 numbers
        x = flush_subnormals(x)
    assert np.all(np.isfinite(x.astype(np.float32)))
    return x


def log_uniform_blocks(rng, shape, axes, lo, hi, spread, in_dtype=np.float32) -> np.ndarray:
    """Per-block magnitude 2**E with E ~ U[lo, hi] (continuous), elements spread over `spread` binades below it.

    Each element is sign * 2**(E - U[0, spread]); a random element of each block is pushed to 2**E so the
    block amax sits at the drawn exponent.
    """
    sshape = tuple(n // orc.BLOCK if i in axes else n for i, n in enumerate(shape))
    e_blk = orc.expand(rng.uniform(lo, hi, size=sshape), axes)
    e = e_blk - rng.uniform(0, spread, size=shape)
    e = np.where(rng.random(shape) < 1 / 32, e_blk, e)
    x = np.exp2(e) * rng.choice([-1.0, 1.0], size=shape)
    return _cast(x, in_dtype)


def mixed_blocks(rng, shape, axes, in_dtype=np.float32, lo=-100, hi=100, outlier_binades=24) -> np.ndarray:
    """Log-uniform blocks mixed with all-zero blocks, single-outlier blocks, exact zeros and normal data."""
    x = log_uniform_blocks(rng, shape, axes, lo, hi, spread=6, in_dtype=np.float32).astype(np.float64)
    sshape = tuple(n // orc.BLOCK if i in axes else n for i, n in enumerate(shape))
    kind = orc.expand(rng.integers(0, 5, size=sshape), axes)
    normal = rng.standard_normal(shape)
    x = np.where(kind == 1, 0.0, x)  # all-zero block
    x = np.where(kind == 2, normal, x)  # N(0, 1) block
    outlier = rng.random(shape) < 1 / 40
    x = np.where(
        (kind == 3) & outlier,
        normal * 2.0 ** rng.integers(8, outlier_binades, size=shape),
        np.where(kind == 3, normal, x),
    )
    x = np.where(rng.random(shape) < 0.03, 0.0, x)  # scattered exact zeros (and -0.0 below)
    x = np.where(rng.random(shape) < 0.01, -0.0, x)
    return _cast(x, in_dtype)


def boundary_blocks(rng, shape, axes, in_dtype=np.float32, kmin=-100, kmax=100) -> np.ndarray:
    """Blocks whose amax sits on a scale-rounding boundary and whose elements sit on FP8 rounding ties.

    amax is one of fmt.max * 2**k, 2**k and their float32 neighbours (for both element formats); the other
    elements are exact FP8 grid points, midpoints between consecutive grid points (RNE ties) or points a
    hair off a midpoint, all times 2**k.
    """
    sshape = tuple(n // orc.BLOCK if i in axes else n for i, n in enumerate(shape))
    k = orc.expand(rng.integers(kmin, kmax, size=sshape), axes).astype(np.float64)
    fmt_pick = orc.expand(rng.integers(0, 2, size=sshape), axes)
    out = np.zeros(shape)
    for i, fmt in enumerate(orc.FORMATS):
        g = fmt.grid
        mids = (g[1:] + g[:-1]) / 2
        pts = np.concatenate([g, mids, mids * (1 + 2.0**-12), mids * (1 - 2.0**-12)])
        pts = pts[pts <= fmt.max]
        vals = rng.choice(pts, size=shape) * rng.choice([-1.0, 1.0], size=shape)
        out = np.where(fmt_pick == i, vals, out)
    fmax = np.where(fmt_pick == 0, orc.E4M3.max, orc.E5M2.max)
    anchors = np.stack([fmax, np.ones(shape), 2 * np.ones(shape)], axis=0)
    pick = orc.expand(rng.integers(0, 3, size=sshape), axes)
    anchor = np.take_along_axis(anchors, pick[None], axis=0)[0]
    # Under a power-of-two anchor the other elements are shrunk below it so that it stays the block amax.
    emax = np.where(fmt_pick == 0, orc.E4M3.emax, orc.E5M2.emax)
    out = np.where(pick > 0, np.ldexp(out, -(emax + 1)), out)
    nudge = orc.expand(rng.integers(-2, 3, size=sshape), axes)  # float32 ulps away from the anchor
    a32 = anchor.astype(np.float32)
    for _ in range(2):
        a32 = np.where(nudge > 0, np.nextafter(a32, np.float32(np.inf)), a32)
        a32 = np.where(nudge < 0, np.nextafter(a32, np.float32(0)), a32)
        nudge = nudge - np.sign(nudge)
    # Put the anchor on one random element of each block: the block's first element along every blocked axis.
    first = np.ones(shape, dtype=bool)
    for a in axes:
        idx = np.arange(shape[a]) % orc.BLOCK == 0
        first &= idx.reshape([-1 if i == a else 1 for i in range(len(shape))])
    out = np.where(first, a32.astype(np.float64) * rng.choice([-1.0, 1.0], size=shape), out)
    x = np.ldexp(out, k.astype(np.int64))
    return _cast(x, in_dtype)
