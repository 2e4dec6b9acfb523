"""The MX quantizations inside attention: Q/K/V/dO operands by block layout, P~ / P, and dS.

All functions take head-major arrays whose last two axes are (sequence, head_dim) or (T, S), and return
dequantized ("fake-quantized") float32 values unless they return an MXArray.

FP8 elements are never converted to FP8 and back inside one program (formats/decode.py says why: XLA on GPU
deletes f32 -> f8 -> f32 convert chains): the fake-quantized values are rounded in float32
(formats/rounding.py, formats/quantize.py quantize_dequantize), bit for bit the decoded round trip.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mxfp8.config.attention import HEAD, SEQ, SQUARE
from jax_mxfp8.formats.elements import E4M3
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import quantize, quantize_dequantize
from jax_mxfp8.formats.rounding import round_to_elements

P_CONST_LOG2 = 8
"""p_scale="const": P~ in [0, 1] is stored as E4M3(P~ * 2^8) with the fixed scale 2^-8."""


def quantize_operand(x: jax.Array, layout: str, scale_rounding: str) -> MXArray:
    """Quantizes a (..., L, H) operand (L = sequence) in the given block layout.

    SQUARE: 32x32 over (L, H). HEAD: 1x32 along H. SEQ: 32x1 along L.
    """
    if layout == SQUARE:
        return quantize(x, axis=(-2, -1), block="square", scale_rounding=scale_rounding)
    if layout == HEAD:
        return quantize(x, axis=-1, block="row", scale_rounding=scale_rounding)
    if layout == SEQ:
        return quantize(x, axis=-2, block="row", scale_rounding=scale_rounding)
    raise ValueError(f"unknown operand layout {layout!r}")


def fake_quant_p(p: jax.Array, axis: int, p_scale: str, scale_rounding: str) -> jax.Array:
    """Quantizes softmax probabilities (values in [0, 1]) as the P V / P^T dO GEMM operand.

    "const": E4M3(2^8 p) * 2^-8 elementwise: one fixed scale, so the result does not depend on `axis` and
      values below 2^-18 (half the smallest E4M3 subnormal times 2^-8) become 0.
    "block": row blocks of 32 along `axis` (the GEMM's contracting axis), scale from the block amax.
    """
    if p_scale == "const":
        # satfinite (as the kernel's cvt.rn.satfinite): a P above 1 (the backward's exp(S - LSE) where S
        # exceeds the forward's LSE by rounding) stays finite instead of casting to NaN; NaN stays NaN
        y = jnp.minimum(p.astype(jnp.float32) * jnp.float32(2.0**P_CONST_LOG2), jnp.float32(E4M3.max))
        y = jnp.where(jnp.isnan(y), jnp.float32(jnp.nan), round_to_elements(y, E4M3))  # = E4M3(y), decoded
        return y * jnp.float32(2.0**-P_CONST_LOG2)
    return quantize_dequantize(p, axis=axis, block="row", scale_rounding=scale_rounding, saturated=True)


def fake_quant_square(x: jax.Array, scale_rounding: str = "up") -> jax.Array:
    """32x32 square blocks over the last two axes (dO over (T, H), dS over (T, S))."""
    return quantize_dequantize(x, axis=(-2, -1), block="square", scale_rounding=scale_rounding, saturated=True)
