"""XLA reference of fused RMSNorm + MX quantize (the producer of pre-quantized GEMM activations)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mxfp8.formats import MXArray, quantize


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """y = x * rsqrt(mean(x^2, -1) + eps) * weight, computed in float32, returned in x.dtype. (..., D)."""
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * r * weight.astype(jnp.float32)).astype(x.dtype)


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
    """Gradients (dx in x.dtype, dweight in weight.dtype) of rms_norm for incoming dy, in float32."""
    x32, w32, dy32 = (a.astype(jnp.float32) for a in (x, weight, dy))
    r = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    dyw = dy32 * w32
    dx = r * dyw - x32 * (r**3) * jnp.mean(dyw * x32, axis=-1, keepdims=True)
    dw = jnp.sum((dy32 * x32 * r).reshape(-1, x.shape[-1]), axis=0)
    return dx.astype(x.dtype), dw.astype(weight.dtype)
