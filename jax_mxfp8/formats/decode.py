"""FP8 elements, and MX blocks (elements times their E8M0 scale), to float through their bit patterns.

Why not `data.astype(jnp.float32)`: on GPU, XLA's SimplifyFPConversions pass (on by default through
--xla_allow_excess_precision) deletes convert chains f32 -> f8 -> f32 inside one compiled program, so
`dequantize(quantize(x))` under one jit would return x unrounded (seen on the H200: "quantized" attention
matched cuDNN BF16 to 74 dB). A bitcast is not a convert, so decoding the bits keeps the rounding on every
backend.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jax_mxfp8.formats.blocks import merge_blocks, split_blocks, split_shape
from jax_mxfp8.formats.elements import element_format
from jax_mxfp8.formats.scales import decode_scale, pow2, saturate


def decode_elements(data: jax.Array) -> jax.Array:
    """FP8 (float8_e4m3fn / float8_e5m2) elements to float32, exactly, with no convert op on the FP8 value."""
    fmt = element_format(data.dtype)
    mb = fmt.mantissa_bits
    eb = 7 - mb
    bias = 2 ** (eb - 1) - 1
    c = lax.bitcast_convert_type(data, jnp.uint8).astype(jnp.int32)
    e = (c >> mb) & ((1 << eb) - 1)
    m = c & ((1 << mb) - 1)
    # Normal: (2^mb + m) * 2^(e - bias - mb); subnormal (e == 0): m * 2^(1 - bias - mb). Exact in float32.
    mag = jnp.where(e == 0, m, m + (1 << mb)).astype(jnp.float32) * pow2(jnp.maximum(e, 1) - bias - mb)
    if fmt.name == "e4m3":
        special = (e == (1 << eb) - 1) & (m == (1 << mb) - 1)  # E4M3FN has NaN only (S.1111.111)
        mag = jnp.where(special, jnp.nan, mag)
    else:
        top = e == (1 << eb) - 1
        mag = jnp.where(top, jnp.where(m == 0, jnp.inf, jnp.nan), mag)
    return jnp.where((c & 0x80) != 0, -mag, mag)


def decode_mx(data: jax.Array, scale: jax.Array, axes: Sequence[int], dtype, *, saturated: bool) -> jax.Array:
    """The values of MX leaves: element * 2**(scale - 127) in `dtype`, NaN where the scale byte is 0xFF.

    data: FP8 elements of any shape; scale: uint8 E8M0 bytes, data's shape with every blocked axis divided
    by 32; axes: the blocked axes as non-negative indices. saturated=True: a finite element whose product
    exceeds `dtype`'s range gives +-its largest finite value (formats.dequantize); False: the IEEE float32
    product (+-Inf beyond float32), then the cast (formats.quantize.dequantize_products).
    """
    shape = tuple(data.shape)
    split, inner = split_shape(shape, axes)
    # broadcast over each block's 32 (x32) elements
    scale = split_blocks(scale, tuple(1 if i in inner else d for i, d in enumerate(split)), axes)
    elements = split_blocks(decode_elements(data), split, axes)  # not astype: the module docstring
    out = decode_scale(scale, elements)
    if saturated:
        out = saturate(out, elements, dtype)
    return merge_blocks(out, shape, data).astype(dtype)
