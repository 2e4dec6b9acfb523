"""E8M0 scale encoding (amax -> exponent byte), exact power-of-two arithmetic, dequantize saturation.

XLA's CPU backend flushes float32 subnormals to zero, and 2**-127 (scale byte 0) is subnormal. Nothing
here divides by a scale or materialises a subnormal power of two: scaling is done by two multiplications
with normal powers of two, and the one subnormal quotient of the "up" rule is replaced by a comparison
(see ElementFormat.up_threshold).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.formats.elements import SCALE_BIAS, SCALE_NAN, ElementFormat

SCALE_ROUNDINGS = ("up", "floor")


def _exponent_bits(x: jnp.ndarray) -> jnp.ndarray:
    """Biased exponent field of a non-negative float32 array, as int32."""
    return (lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32) >> 23).astype(jnp.int32) & 0xFF


def pow2(e: jnp.ndarray) -> jnp.ndarray:
    """2**e as float32 for integer e in [-126, 127], built from its bits (exact, no transcendental)."""
    bits = (e.astype(jnp.int32) + SCALE_BIAS).astype(jnp.uint32) << 23
    return lax.bitcast_convert_type(bits, jnp.float32)


def mul_pow2(x: jnp.ndarray, e: jnp.ndarray) -> jnp.ndarray:
    """x * 2**e in float32 for integer e in [-252, 252] without materialising a subnormal power of two.

    The product is exact whenever it is a normal float32 number.
    """
    e = e.astype(jnp.int32)
    e1 = e // 2
    return x * pow2(e1) * pow2(e - e1)


def scale_bits(amax: jnp.ndarray, fmt: ElementFormat, scale_rounding: str) -> jnp.ndarray:
    """E8M0 scale byte (as int32) for blocks with the given float32 amax (finite, >= 0).

    "up": b = exponent of fp32(amax / max), plus one unless that quotient is an exact power of two
      (bit-identical to jax.nn's mxfp8 quantize and to cvt.rp.satfinite.ue8m0).
    "floor": b = floor(log2 amax) - emax + 127 (OCP MX v1.0), clamped to [0, 254].
    amax == 0 gives b = 0 under both rules.
    """
    amax = amax.astype(jnp.float32)
    if scale_rounding == "up":
        v = amax / jnp.float32(fmt.max)
        bits = lax.bitcast_convert_type(v, jnp.uint32)
        exp = (bits >> 23).astype(jnp.int32) & 0xFF
        mant = bits & jnp.uint32(0x7FFFFF)
        round_up = (mant > 0) & (exp != 0xFE)
        normal_b = jnp.where(round_up, exp + 1, exp)
        # Quotients below 2**-126 are subnormal: IEEE rounds them to at most 2**-127 (byte 0) unless the
        # quotient exceeds 2**-127, which happens exactly when amax >= up_threshold (byte 1).
        tiny_b = jnp.where(amax >= jnp.float32(fmt.up_threshold), 1, 0)
        smallest_normal_amax = jnp.float32(fmt.max * 2.0**-126)
        return jnp.where(amax >= smallest_normal_amax, normal_b, tiny_b).astype(jnp.int32)
    if scale_rounding == "floor":
        return jnp.clip(_exponent_bits(amax) - fmt.emax, 0, 254)
    raise ValueError(f"scale_rounding={scale_rounding!r} is not one of {SCALE_ROUNDINGS}")


def check_scale_rounding(scale_rounding: str) -> None:
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding={scale_rounding!r} is not one of {SCALE_ROUNDINGS}")


def decode_scale(scale: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
    """x * 2**(scale - 127) in float32, NaN where scale == 0xFF."""
    b = scale.astype(jnp.int32)
    out = mul_pow2(x.astype(jnp.float32), b - SCALE_BIAS)
    return jnp.where(b == SCALE_NAN, jnp.float32(jnp.nan), out)


_F32_MAX = float(np.finfo(np.float32).max)


def saturation_bound(dtype) -> float:
    """The largest finite value a dequantize to `dtype` produces: min(dtype's max, float32's max).

    float32 3.4028235e38 (also for float64 output: the product is formed in float32), bfloat16
    3.3895314e38, float16 65504. Exactly representable in float32 and in `dtype`.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"dtype={dtype!r} is not a dtype") from e
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"dtype={dt.name}: dequantize outputs a floating dtype (float32, bfloat16, float16)")
    return min(float(jnp.finfo(dt).max), _F32_MAX)


def saturate(y: jnp.ndarray, elements: jnp.ndarray, dtype) -> jnp.ndarray:
    """float32 `y` (element * 2**(b - 127)) with +-saturation_bound(dtype) where the element is finite and
    |y| exceeds it; NaN and Inf elements (and NaN blocks) pass through unchanged.

    Why: under scale_rounding="up" a block of amax near float32's (or bfloat16's) maximum gets elements that
    round up to 256 (E4M3) / 32768 (E5M2) at scale 2**120, i.e. 2**128, which float32 cannot hold; a
    finite input must not come back as Inf (docs/numerics.md "Float32 range"). The kernel
    (kernels/common/ptx.dequant1) applies the same rule to the same float32 product, bit for bit.
    """
    bound = jnp.float32(saturation_bound(dtype))
    over = jnp.isfinite(elements) & (jnp.abs(y) > bound)
    return jnp.where(over, jnp.copysign(bound, y), y)
