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
    return y, quantize(y, axis=-1, dtype=dtype, scale_rounding=scale_rounding)


def rms_norm_bwd(x: jax.Array, weight: jax.Array, eps: float, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Gradients (dx in x.dtype, dweight in weight.dtype) of rms_norm for incoming dy, in float32."""
    x32, w32, dy32 = (a.astype(jnp.float32) for a in (x, weight, dy))
    r = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    dyw = dy32 * w32
    dx = r * dyw - x32 * (r**3) * jnp.mean(dyw * x32, axis=-1, keepdims=True)
    dw = jnp.sum((dy32 * x32 * r).reshape(-1, x.shape[-1]), axis=0)
    return dx.astype(x.dtype), dw.astype(weight.dtype)
