"""Round-to-nearest-even onto an FP8 element grid, in float32 arithmetic (no FP8 convert).

`round_to_elements(y, fmt)` is the float32 value that `y.astype(fmt.dtype)` decodes to, for |y| <= fmt.max:
the quantize step of an MX round trip without materialising FP8 elements. Why not the convert pair:
XLA on GPU deletes f32 -> f8 -> f32 chains inside one program (formats/decode.py), and the decode that
prevents it costs ~15 integer ops per element on top of the convert (which XLA:CPU emulates in software).
Here a handful of ops give the same bits:

  normal range (|y| >= 2^emin): round the float32 significand to the format's `mantissa_bits` in the
    integer domain (add half an ulp minus one, plus the kept LSB for ties-to-even; clear the dropped
    bits): a carry into the exponent is the next binade's first value, as in the convert;
  subnormal range (|y| < 2^emin): the grid is uniform with step q = 2^(emin - mantissa_bits): y / q
    (an exact power-of-two scaling) rounded to the nearest integer, ties to even (XLA's round-nearest-even
    op), times q; the sign is put back so that -tiny rounds to -0 as the convert does. (The classic
    (y + c) - c trick is not safe here: XLA:CPU folded it back to y.)

Inputs must be finite and within +-fmt.max (quantize clips before rounding); NaN inputs give unspecified
values (the caller masks non-finite blocks afterwards). tests/quantize/test_rounding.py checks every float32 in
the E4M3 / E5M2 ranges that matters (all grid points, their midpoints and neighbours, random values)
against ml_dtypes' conversion.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_mxfp8.formats.elements import ElementFormat


def round_to_elements(y: jnp.ndarray, fmt: ElementFormat) -> jnp.ndarray:
    """float32 y (|y| <= fmt.max) rounded to the nearest fmt element value, ties to even; float32."""
    y = y.astype(jnp.float32)
    drop = 23 - fmt.mantissa_bits  # float32 significand bits below the format's
    bits = lax.bitcast_convert_type(y, jnp.uint32)
    lsb = (bits >> drop) & jnp.uint32(1)
    rounded = (bits + jnp.uint32((1 << (drop - 1)) - 1) + lsb) & jnp.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    normal = lax.bitcast_convert_type(rounded, jnp.float32)
    steps = lax.round(y * jnp.float32(2.0 ** (fmt.mantissa_bits - fmt.emin)), lax.RoundingMethod.TO_NEAREST_EVEN)
    sub = jnp.copysign(steps * jnp.float32(2.0 ** (fmt.emin - fmt.mantissa_bits)), y)
    return jnp.where(jnp.abs(y) < jnp.float32(2.0**fmt.emin), sub, normal)
