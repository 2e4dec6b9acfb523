"""The Blackwell attention kernels' in-kernel MX quantizations in XLA (layer 5): P in the softmax, dS in the
backward, each the way kernels/sm100/attention_quant.py computes it (amax as float32 bits with NaN kept, the
E8M0 byte from those bits, the exact power-of-two factor from the byte's bits, RNE with saturation).

  scale_byte_up(amax_bits)        the "up" rule for E4M3 from |amax|'s float32 bits (ptx.scale_and_factor)
  quantize_p_const(p)             E4M3(2^8 P~) 2^-8: p_scale="const"
  quantize_rows(x, axis)          (bytes, values): 1x32 blocks along `axis` (p_scale="block")
  quantize_square(x)              (bytes, values): 32x32 blocks over the last two axes (dS)

"values" are the MX values the GEMM multiplies (element x 2^(byte - 127), NaN for byte 0xFF). They equal the
reference's (reference/attention_quant.py: fake_quant_p, fake_quant_square, i.e. formats.quantize) bit for bit
on the same input, which tests/attention/test_attention_sm100_quant.py checks; the byte rule is tested against
formats.scales.scale_bits on every exponent and mantissa boundary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.formats.elements import E4M3, SCALE_NAN
from jax_mxfp8.formats.rounding import round_to_elements
from jax_mxfp8.formats.scales import decode_scale
from jax_mxfp8.reference.attention_quant import P_CONST_LOG2

_F32_INF_BITS = 0x7F800000
_SMALLEST_NORMAL_AMAX_BITS = int(np.float32(E4M3.max * 2.0**-126).view(np.uint32))
_UP_THRESHOLD_BITS = int(np.float32(E4M3.up_threshold).view(np.uint32))
_MANT_175 = 0x600000  # E4M3's max is 1.75 * 2^8: a mantissa above 0.75 rounds the quotient's exponent up


def abs_bits(x: jax.Array) -> jax.Array:
    """|x|'s float32 bit pattern as uint32: integer order is float order, with Inf above every finite value
    and NaN above Inf (the order the kernels' NaN-keeping max gives the byte rule)."""
    return lax.bitcast_convert_type(jnp.abs(x.astype(jnp.float32)), jnp.uint32)


def scale_byte_up(amax_bits: jax.Array) -> jax.Array:
    """E8M0 byte (int32) for a block whose |amax| has float32 bits `amax_bits` (uint32), rule "up", E4M3:
    exponent field - 8 (+1 when the mantissa exceeds 0.75, i.e. amax / 448 is not a power of two); below
    448 * 2^-126 (subnormal quotient) 1 or 0 by comparison with the up threshold; 0xFF for Inf / NaN."""
    e = (amax_bits >> 23).astype(jnp.int32)
    mant = (amax_bits & jnp.uint32(0x7FFFFF)).astype(jnp.int32)
    normal = e - E4M3.emax + (mant > _MANT_175).astype(jnp.int32)
    tiny = (amax_bits >= jnp.uint32(_UP_THRESHOLD_BITS)).astype(jnp.int32)
    b = jnp.where(amax_bits >= jnp.uint32(_SMALLEST_NORMAL_AMAX_BITS), normal, tiny)
    return jnp.where(amax_bits >= jnp.uint32(_F32_INF_BITS), SCALE_NAN, b)


def _elements(x: jax.Array, b: jax.Array) -> jax.Array:
    """E4M3 elements (as float32) of x at scale byte b (broadcast): RNE(satfinite(x 2^(127 - b))), NaN where
    b == 0xFF. 2^(127 - b) is a normal float32 for every byte a finite amax gives (b <= 247), so the product
    is exact (cvt.rn.satfinite after mul.rn in the kernel)."""
    factor = lax.bitcast_convert_type((jnp.uint32(254) - jnp.minimum(b, 254).astype(jnp.uint32)) << 23, jnp.float32)
    y = jnp.clip(x.astype(jnp.float32) * factor, -E4M3.max, E4M3.max)
    return jnp.where((b == SCALE_NAN) | jnp.isnan(y), jnp.float32(jnp.nan), round_to_elements(y, E4M3))


def quantize_p_const(p: jax.Array) -> jax.Array:
    """p_scale="const": E4M3(2^8 P~) 2^-8 elementwise (P~ <= 1, so 2^8 P~ never saturates; NaN stays NaN)."""
    y = p.astype(jnp.float32) * jnp.float32(2.0**P_CONST_LOG2)
    e = jnp.where(jnp.isnan(y), jnp.float32(jnp.nan), round_to_elements(jnp.minimum(y, E4M3.max), E4M3))
    return e * jnp.float32(2.0**-P_CONST_LOG2)


def quantize_rows(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """1x32 blocks along `axis` (a multiple of 32): (bytes int32 with `axis` divided by 32, values float32 of x's
    shape). The kernel: each thread holds one block row, amax by FMNMX.NAN, byte and factor from its bits."""
    xm = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    blocks = xm.reshape(*xm.shape[:-1], xm.shape[-1] // 32, 32)
    b = scale_byte_up(jnp.max(abs_bits(blocks), axis=-1))
    values = decode_scale(b[..., None], _elements(blocks, b[..., None]))
    return jnp.moveaxis(b, -1, axis), jnp.moveaxis(values.reshape(xm.shape), -1, axis)


def quantize_square(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """32x32 blocks over the last two axes (multiples of 32): (bytes int32 (..., R/32, C/32), values float32 of
    x's shape). The kernel: a warp holds a block, one row per lane; each lane's row amax (FMNMX.NAN), then
    one warp reduction (CREDUX.MAXABS.NAN) gives the block's amax, so a NaN anywhere gives byte 0xFF."""
    *lead, r, c = x.shape
    blocks = x.astype(jnp.float32).reshape(*lead, r // 32, 32, c // 32, 32)
    row_amax = jnp.max(abs_bits(blocks), axis=-1)  # (..., R/32, 32, C/32): one per lane
    b = scale_byte_up(jnp.max(row_amax, axis=-2))  # (..., R/32, C/32): the warp reduction
    bb = b[..., :, None, :, None]
    values = decode_scale(bb, _elements(blocks, bb))
    return b, values.reshape(x.shape)
