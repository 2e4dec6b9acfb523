"""Where MX values meet the limits of float32 (docs/numerics.md, "Float32 range"): finite stays finite.

- Dequantize saturates: a finite element times its finite scale that exceeds the output dtype's range (or
  float32's, the contract's compute type) returns +-max of that dtype, never +-inf. Under
  scale_rounding="up" this happens near float32's maximum: a block with amax > 1.75 * 2**127 gets scale
  byte 247 (E4M3) / 240 (E5M2), and its elements of magnitude >= 1.9375 * 2**127 (E4M3) / 1.75 * 2**127
  (E5M2) round to 256 / 32768, i.e. 2**128 (bfloat16's maximum is one of them). Also for caller-built
  MXArrays with large scale bytes, and for narrower output dtypes (float16 beyond 65504). NaN (scale 0xFF
  or a NaN element) and the infinities an E5M2 element can hold pass unchanged.
- Quantize saturates float64 input (x64 mode) to float32's range first: a finite value beyond +-float32
  max becomes +-float32 max (amax is computed in float32, per the contract); +-inf and NaN stay
  non-finite (a NaN block).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

F32_MAX = float(np.finfo(np.float32).max)


def check_output_dtype(dtype, name: str = "dtype") -> np.dtype:
    """The dequantize output dtype as np.dtype; ValueError naming `name` unless a float type of >= 16 bits."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"{name}={dtype!r} is not a dtype; use jnp.float32, jnp.bfloat16 or jnp.float16") from e
    if not jnp.issubdtype(dt, jnp.floating) or dt.itemsize < 2:
        raise ValueError(
            f"{name}={dt.name} is not a supported dequantize output type; use jnp.float32 (default), "
            "jnp.bfloat16 or jnp.float16"
        )
    return dt


def output_limit(dtype) -> float:
    """Largest finite magnitude a dequantize into `dtype` returns: min(dtype max, float32 max)."""
    return min(float(jnp.finfo(dtype).max), F32_MAX)


def saturate_product(out: jax.Array, elements: jax.Array, dtype, *, may_hold_inf: bool) -> jax.Array:
    """Clips the float32 product `out` = element * 2**e to +-output_limit(dtype), NaN-preserving; where the
    element itself is +-inf (E5M2 only: `may_hold_inf`), the infinity stays."""
    lim = jnp.float32(output_limit(dtype))
    clipped = jnp.clip(out, -lim, lim)
    return jnp.where(jnp.isinf(elements), out, clipped) if may_hold_inf else clipped


def saturate_wide_input(x):
    """float64 (or wider) input with its finite values clipped to +-float32 max; other input unchanged.

    NumPy input stays NumPy (so a later conversion to float32 does not overflow first)."""
    dt = getattr(x, "dtype", None)
    if dt is None or not jnp.issubdtype(dt, jnp.floating) or np.dtype(dt).itemsize <= 4:
        return x
    xp = np if isinstance(x, (np.ndarray, np.generic)) else jnp
    return xp.where(xp.isfinite(x), xp.clip(x, -F32_MAX, F32_MAX), x)
