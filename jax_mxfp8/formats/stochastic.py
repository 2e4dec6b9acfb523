"""Stochastic rounding of float32 values onto an FP8 element grid."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_mxfp8.formats.elements import ElementFormat
from jax_mxfp8.formats.scales import mul_pow2


def stochastic_round(y: jax.Array, fmt: ElementFormat, key: jax.Array) -> jax.Array:
    """Rounds float32 `y` (already clipped to +-fmt.max) to one of its two neighbouring FP8 values.

    The upper neighbour (in magnitude) is chosen with probability (|y| - lo) / spacing, so the result is
    unbiased: E[round(y)] = y. Returns float32 values that are exactly representable in `fmt`.
    Subnormal FP8 values use the fixed spacing 2**(emin - mantissa_bits).
    """
    mag = jnp.abs(y)
    exp = (lax.bitcast_convert_type(mag, jnp.uint32) >> 23).astype(jnp.int32) - 127
    spacing_exp = jnp.maximum(exp, fmt.emin) - fmt.mantissa_bits
    units = mul_pow2(mag, -spacing_exp)  # |y| in units of the local spacing (exact: power-of-two scaling)
    lo = jnp.floor(units)
    frac = units - lo
    u = jax.random.uniform(key, y.shape, jnp.float32)
    rounded = mul_pow2(lo + (u < frac).astype(jnp.float32), spacing_exp)
    return jnp.copysign(rounded, y)
