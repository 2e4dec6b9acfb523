"""XLA reference of fused RMSNorm + MX quantize (the producer of pre-quantized GEMM activations)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats import MXArray, quantize

ROW_RESCALE = 2.0**-80
"""The power of two rows are scaled by when their float32 sum of squares overflows (inv_rms). With
|x| <= float32's max < 2^128, each scaled square is < 2^96, so the sum of any row of D < 2^31 elements
stays finite; a row overflows only when its sum is >= 2^128, so its scaled sum is >= 2^-32, far above the
subnormals (scaled squares that underflow are below 2^-149 of a sum >= 2^-32: under half an ulp)."""


def inv_rms(x32: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """(r, s), both (..., 1) float32, with x * rsqrt(mean(x^2) + eps) = (x * r) * s over the last axis of float32
    x (..., D).

    Rows whose float32 mean of squares is finite (every ordinary row): r = rsqrt(mean(x * x) + eps), s = 1, so
    (x * r) * s is exactly x * r. A row of finite values whose x * x sum overflows (values beyond ~1.8e19, or
    a sum past ~3.4e38, where the plain formula gives r = 0 and so y = 0): r = rsqrt(mean((x c)^2) + (eps c) c)
    and s = c = ROW_RESCALE, the same formula scaled by a power of two, applied as two multiplies so that
    neither x * r (<= sqrt(D) * 2^80) nor r itself leaves float32's normal range (r * c would be subnormal
    for a row RMS above 2^126, and flushed to 0 where subnormals are). Rows holding Inf or NaN keep the plain
    formula (NaN at the Inf / NaN, 0 elsewhere, as before). The fused kernel (kernels/common/
    rms_norm_quantize.py) takes the same branch with the same float32 steps.
    """
    ms = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    c = np.float32(ROW_RESCALE)
    xc = x32 * c
    ms_c = jnp.mean(xc * xc, axis=-1, keepdims=True)
    overflow = jnp.isinf(ms) & jnp.isfinite(ms_c)
    r = jax.lax.rsqrt(ms + eps)  # 0 on overflow rows, whose gradient through here is then 0, not NaN
    # the scaled branch sees a harmless 1.0 where it is not taken (ms_c may be 0 there: rsqrt's derivative
    # would be Inf, and Inf * 0 NaN in the gradient)
    r_c = jax.lax.rsqrt(jnp.where(overflow, ms_c, 1.0) + (np.float32(eps) * c) * c)
    return jnp.where(overflow, r_c, r), jnp.where(overflow, c, np.float32(1))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """y = x * rsqrt(mean(x^2, -1) + eps) * weight, computed in float32, returned in x.dtype. (..., D).

    In float32: ((x * r) * s) * weight with (r, s) = inv_rms(x, eps) (s = 1 unless the row's sum of squares
    overflows float32, so ordinary rows get exactly (x * r) * weight)."""
    x32 = x.astype(jnp.float32)
    r, s = inv_rms(x32, eps)
    return (x32 * r * s * weight.astype(jnp.float32)).astype(x.dtype)


def rms_norm_quantize_fwd(
    x: jax.Array, weight: jax.Array, eps: float, *, dtype, scale_rounding: str
) -> tuple[jax.Array, MXArray]:
    """(y, quantize(y) in row blocks along the last axis). y is rounded to x.dtype BEFORE quantizing,
    so the MXArray equals what a separate quantize pass over y would produce, bit for bit."""
    y = rms_norm(x, weight, eps)
    return y, quantize(_as_rounded(y), axis=-1, dtype=dtype, scale_rounding=scale_rounding)


def _as_rounded(y: jax.Array) -> jax.Array:
    """y with its rounding to y.dtype pinned for the quantize that follows.

    Under XLA's default `xla_allow_excess_precision` (on GPU), a convert f32 -> bf16 -> f32 pair may
    be removed inside one jit, so quantize(y) would see the UNROUNDED float32 y (seen on the H200:
    scales/elements differing from a separate quantize of the returned y). reduce_precision to bf16's
    8 exponent / 7 mantissa bits cannot be removed and rounds exactly as the convert does (same
    exponent range, round to nearest even), so the quantize input has y's exact values either way;
    float16 (narrower exponent, where reduce_precision differs on subnormals) goes through an
    optimization barrier instead."""
    if y.dtype == jnp.float32:
        return y
    if y.dtype == jnp.bfloat16:
        return jax.lax.reduce_precision(y.astype(jnp.float32), exponent_bits=8, mantissa_bits=7)
    return jax.lax.optimization_barrier(y)


def rms_norm_bwd(x: jax.Array, weight: jax.Array, eps: float, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Gradients (dx in x.dtype, dweight in weight.dtype) of rms_norm for incoming dy, in float32.

    With u = x * r (the normalized row, |u| <= sqrt(D)): dx = r * (dy w - u * mean(dy w u)), dw = sum(dy u)
    (r applied as (r, s) of inv_rms).
    The same as r dy w - x r^3 mean(dy w x), without forming r^3 (subnormal from |x| ~ 1e13, 0 past ~1e15)
    or x * dy (which overflows before r scales it down)."""
    x32, w32, dy32 = (a.astype(jnp.float32) for a in (x, weight, dy))
    r, s = inv_rms(x32, eps)
    u = x32 * r * s
    dyw = dy32 * w32
    dx = (dyw - u * jnp.mean(dyw * u, axis=-1, keepdims=True)) * r * s
    dw = jnp.sum((dy32 * u).reshape(-1, x.shape[-1]), axis=0)
    return dx.astype(x.dtype), dw.astype(weight.dtype)
