"""Element formats of MXFP8: FP8 E4M3 (default) and E5M2, and the E8M0 scale format.

Everything a quantizer needs to know about a format lives in one frozen record, so the rest of the
code never branches on dtype names.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_dtypes
import numpy as np

BLOCK_SIZE = 32
"""Elements per MX block (OCP MX v1.0): 32 along one axis, or 32x32 for square blocks."""

SCALE_DTYPE = jnp.uint8
"""E8M0 scales are stored as raw uint8 exponent bytes: value 2**(b - 127), 0xFF is NaN."""

SCALE_NAN = 0xFF
SCALE_BIAS = 127


@dataclasses.dataclass(frozen=True)
class ElementFormat:
    """Static description of an FP8 element format.

    Attributes:
      name: short name ("e4m3" or "e5m2").
      dtype: the JAX/NumPy dtype of stored elements.
      max: largest finite magnitude (448 or 57344).
      emax: exponent of the largest binade (8 or 15); OCP's floor rule subtracts it.
      emin: exponent of the smallest normal binade (-6 or -14).
      mantissa_bits: explicit mantissa bits (3 or 2).
      up_threshold: smallest float32 amax whose IEEE quotient amax / max exceeds 2**-127, i.e. the
        smallest amax that gets scale byte 1 rather than 0 under scale_rounding="up". The quotient is
        subnormal there, which XLA's CPU backend flushes; comparing amax against this constant gives the
        IEEE answer on every backend.
    """

    name: str
    dtype: np.dtype
    max: float
    emax: int
    emin: int
    mantissa_bits: int
    up_threshold: float


def _up_threshold(max_value: float) -> float:
    fmax = np.float32(max_value)
    tiny_scale = np.float32(2.0**-127)
    a = np.float32(fmax * tiny_scale)
    with np.errstate(under="ignore"):
        while not (a / fmax > tiny_scale):
            a = np.nextafter(a, np.float32(1.0))
    return float(a)


def _make(name: str, dtype) -> ElementFormat:
    info = ml_dtypes.finfo(dtype)
    return ElementFormat(
        name=name,
        dtype=np.dtype(dtype),
        max=float(info.max),
        emax=int(np.log2(float(info.max))),
        emin=int(info.minexp),
        mantissa_bits=int(info.nmant),
        up_threshold=_up_threshold(float(info.max)),
    )


E4M3 = _make("e4m3", jnp.float8_e4m3fn)
E5M2 = _make("e5m2", jnp.float8_e5m2)

_BY_DTYPE = {E4M3.dtype: E4M3, E5M2.dtype: E5M2}


def element_format(dtype) -> ElementFormat:
    """Returns the ElementFormat for an element dtype (float8_e4m3fn or float8_e5m2).

    Raises:
      ValueError: naming the argument `dtype` when the dtype is not a supported MX element type.
    """
    try:
        key = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"dtype={dtype!r} is not a dtype; use jnp.float8_e4m3fn or jnp.float8_e5m2") from e
    if key not in _BY_DTYPE:
        raise ValueError(
            f"dtype={key} is not a supported MX element type; use jnp.float8_e4m3fn (default) or jnp.float8_e5m2"
        )
    return _BY_DTYPE[key]
