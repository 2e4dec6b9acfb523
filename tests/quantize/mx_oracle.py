"""Independent NumPy reference of MXFP8 quantize / dequantize, written from docs/numerics.md "The contract".

This module never imports jax_mxfp8 (nor jax): it is the oracle the library is tested against, so it uses
techniques unlike a jnp port of the library:

* block amax: the blocked axes are split in place into (n // 32, 32) and reduced with NumPy;
* scale exponents: ``np.frexp`` on float64 (``amax = m * 2**e`` with ``m`` in [0.5, 1)) instead of reading
  float32 exponent bits; the "up" quotient is the IEEE float32 quotient (NumPy keeps subnormals, i.e. the
  gradual underflow that the contract requires, unlike XLA CPU's flush-to-zero);
* element rounding: exact float64 scaling (``np.ldexp``) and a search in the sorted table of all finite
  FP8 values, ties going to the even code (the even mantissa), instead of a dtype cast;
* dequantize: float64 product of the element with ``2.0 ** (b - 127)`` rounded once to float32.

All byte outputs are uint8 views: FP8 codes (sign bit 0x80) and E8M0 scale bytes.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

BLOCK = 32
NAN_SCALE = 0xFF


@dataclasses.dataclass(frozen=True)
class Fmt:
    """An FP8 element format, described from the OCP spec (not from the library)."""

    name: str
    dtype: type
    max: float  # largest finite magnitude
    emax: int  # exponent of the largest binade (the floor rule subtracts it)
    emin: int  # exponent of the smallest normal binade
    mbits: int  # explicit mantissa bits
    n_finite: int  # number of non-negative finite codes (0x00 .. n_finite - 1)

    @property
    def grid(self) -> np.ndarray:
        """All non-negative finite values, indexed by their code (strictly increasing)."""
        codes = np.arange(self.n_finite, dtype=np.uint8)
        return codes.view(self.dtype).astype(np.float64)


E4M3 = Fmt("e4m3", ml_dtypes.float8_e4m3fn, 448.0, 8, -6, 3, 0x7F)  # 0x7F is NaN
E5M2 = Fmt("e5m2", ml_dtypes.float8_e5m2, 57344.0, 15, -14, 2, 0x7C)  # 0x7C is +Inf
FORMATS = (E4M3, E5M2)


def fmt_of(dtype) -> Fmt:
    """The Fmt for an element dtype (jnp.float8_e4m3fn / jnp.float8_e5m2 or their ml_dtypes types)."""
    d = np.dtype(dtype)
    for f in FORMATS:
        if d == np.dtype(f.dtype):
            return f
    raise ValueError(f"not an MX element dtype: {dtype}")


# ---------------------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------------------


def blocked_axes(ndim: int, axis=-1, block: str = "row") -> tuple[int, ...]:
    """Non-negative blocked axes, sorted. Square blocks default to the last two axes."""
    if block == "row":
        axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
        assert len(axes) == 1
    elif block == "square":
        if isinstance(axis, int | np.integer):
            assert axis == -1
            axes = (ndim - 2, ndim - 1)
        else:
            axes = tuple(axis)
        assert len(axes) == 2
    else:
        raise ValueError(block)
    out = tuple(sorted(a % ndim for a in axes))
    assert len(set(out)) == len(out)
    return out


def _split(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...]]:
    """x reshaped with each blocked axis n split into (n // 32, 32); returns it and the 32-axes positions."""
    shape: list[int] = []
    inner: list[int] = []
    for i, n in enumerate(x.shape):
        if i in axes:
            assert n % BLOCK == 0 and n > 0, (i, n)
            shape += [n // BLOCK, BLOCK]
            inner.append(len(shape) - 1)
        else:
            shape.append(n)
    return x.reshape(shape), tuple(inner)


def block_reduce_max(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Per-block maximum of `a` (NaN-propagating), in the scale shape (blocked axes divided by 32)."""
    s, inner = _split(a, axes)
    return s.max(axis=inner)


def block_any(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    s, inner = _split(a, axes)
    return s.any(axis=inner)


def expand(s: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Broadcasts a per-block array (scale shape) back to the full shape."""
    for a in axes:
        s = np.repeat(s, BLOCK, axis=a)
    return s


# ---------------------------------------------------------------------------------------------------------
# Scales
# ---------------------------------------------------------------------------------------------------------


def scale_from_amax(amax, fmt: Fmt, scale_rounding: str) -> np.ndarray:
    """E8M0 byte for finite non-negative float32 amax values (vectorised), via frexp.

    "up":    v = float32(amax / max) in IEEE arithmetic; b = ceil(log2 v) + 127 clamped to [0, 254]
             (v == 0 -> 0). This equals JAX's bit rule (see `scale_up_bitrule`).
    "floor": b = floor(log2 amax) - emax + 127 clamped to [0, 254] (amax == 0 -> 0).
    """
    amax = np.asarray(amax, dtype=np.float32)
    assert np.all(np.isfinite(amax)) and np.all(amax >= 0)
    if scale_rounding == "up":
        with np.errstate(under="ignore"):
            v = amax / np.float32(fmt.max)  # IEEE float32 division, correctly rounded, gradual underflow
        assert v.dtype == np.float32
        m, e = np.frexp(v.astype(np.float64))  # v = m * 2**e, m in [0.5, 1)
        ceil_log2 = np.where(m == 0.5, e - 1, e)
        b = np.clip(ceil_log2 + 127, 0, 254)
        b = np.where(v == 0, 0, b)
    elif scale_rounding == "floor":
        m, e = np.frexp(amax.astype(np.float64))
        floor_log2 = e - 1
        b = np.clip(floor_log2 - fmt.emax + 127, 0, 254)
        b = np.where(amax == 0, 0, b)
    else:
        raise ValueError(scale_rounding)
    return b.astype(np.uint8)


def scale_up_bitrule(amax, fmt: Fmt) -> np.ndarray:
    """The "up" rule exactly as docs/numerics.md "Quantize" states it (the bit test), for self-checking the frexp
    version."""
    with np.errstate(under="ignore"):
        v = np.asarray(amax, dtype=np.float32) / np.float32(fmt.max)
    bits = v.view(np.uint32)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    round_up = (mant > 0) & (exp != 0xFE) & ~((exp == 0) & (mant <= 0x400000))
    return (exp + round_up).astype(np.uint8)


# ---------------------------------------------------------------------------------------------------------
# Elements
# ---------------------------------------------------------------------------------------------------------


def rne_codes(y: np.ndarray, fmt: Fmt) -> np.ndarray:
    """FP8 codes (uint8) of round-to-nearest-even of float64 `y`, |y| <= fmt.max (already clipped).

    Nearest neighbour in the table of all finite values; on a tie the even code wins (codes of
    non-negative values are consecutive, so the code's lowest bit is the mantissa's lowest bit).
    """
    y = np.asarray(y, dtype=np.float64)
    a = np.abs(y)
    assert np.all(a <= fmt.max), "clip before rounding"
    grid = fmt.grid
    lo = np.searchsorted(grid, a, side="right") - 1  # grid[lo] <= a < grid[lo + 1]
    hi = np.minimum(lo + 1, len(grid) - 1)
    d_lo = a - grid[lo]
    d_hi = grid[hi] - a
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0) & (hi != lo))
    code = np.where(take_hi, hi, lo).astype(np.uint8)
    return code | (np.signbit(y).astype(np.uint8) << 7)


def neighbours(y: np.ndarray, fmt: Fmt) -> tuple[np.ndarray, np.ndarray]:
    """The two FP8 values (float64, sign of y) bracketing float64 y (|y| <= max): lo <= |y| <= hi in magnitude.

    When y is representable, lo == hi == y.
    """
    y = np.asarray(y, dtype=np.float64)
    a = np.abs(y)
    grid = fmt.grid
    lo = np.searchsorted(grid, a, side="right") - 1
    exact = grid[lo] == a
    hi = np.where(exact, lo, np.minimum(lo + 1, len(grid) - 1))
    sign = np.where(np.signbit(y), -1.0, 1.0)
    return sign * grid[lo], sign * grid[hi]


def decode(codes: np.ndarray, fmt: Fmt) -> np.ndarray:
    """FP8 codes -> float64 values (via the value table; NaN / Inf codes via ml_dtypes)."""
    return np.asarray(codes, dtype=np.uint8).view(fmt.dtype).astype(np.float64)


@dataclasses.dataclass
class OracleQ:
    data: np.ndarray  # uint8 FP8 codes, x's shape (meaningless where ~finite)
    scale: np.ndarray  # uint8 E8M0 bytes, scale shape
    finite: np.ndarray  # bool, x's shape: the element's block holds no NaN / Inf
    scaled: np.ndarray  # float64 clip(x * 2**(127 - b)), x's shape (NaN where ~finite)
    axes: tuple[int, ...]
    fmt: Fmt


def to_f32(x) -> np.ndarray:
    """Exact upcast of float32 / bfloat16 / float16 input to float32 (the amax precision of the contract)."""
    x = np.asarray(x)
    assert x.dtype in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)), x.dtype
    return x.astype(np.float32)


def quantize(x, *, axis=-1, block: str = "row", dtype=ml_dtypes.float8_e4m3fn, scale_rounding: str = "up"):
    """Reference MX quantization with round-to-nearest-even elements. Returns an OracleQ."""
    fmt = fmt_of(dtype)
    x32 = to_f32(x)
    axes = blocked_axes(x32.ndim, axis, block)
    bad = block_any(~np.isfinite(x32), axes)
    amax = block_reduce_max(np.abs(np.where(np.isfinite(x32), x32, 0)), axes)
    scale = scale_from_amax(amax, fmt, scale_rounding)
    scale = np.where(bad, np.uint8(NAN_SCALE), scale).astype(np.uint8)
    finite = ~expand(bad, axes)
    b = expand(scale, axes).astype(np.int64)
    x64 = np.where(finite, x32.astype(np.float64), 0.0)
    y = np.clip(np.ldexp(x64, 127 - b), -fmt.max, fmt.max)  # exact in float64
    data = rne_codes(y, fmt)
    y = np.where(finite, y, np.nan)
    return OracleQ(data=data, scale=scale, finite=finite, scaled=y, axes=axes, fmt=fmt)


def dequantize(data_codes, scale, axes: tuple[int, ...], fmt: Fmt, dtype=np.float32) -> np.ndarray:
    """element * 2**(b - 127) rounded once from the exact float64 product to float32, then to `dtype`;
    NaN where b == 0xFF. A finite element whose product exceeds the dtype's range (448 * 2**127, or
    256 * 2**120 = 2**128) saturates to +-min(dtype max, float32 max) (docs/numerics.md "Dequantize")."""
    vals = decode(data_codes, fmt)
    b = expand(np.asarray(scale, dtype=np.uint8), axes).astype(np.int64)
    with np.errstate(invalid="ignore"):
        out = vals * np.exp2((b - 127).astype(np.float64))
    bound = min(float(ml_dtypes.finfo(dtype).max), float(np.finfo(np.float32).max))
    with np.errstate(invalid="ignore"):
        big = np.isfinite(vals) & (np.abs(out) > bound)
    out = np.where(big, np.copysign(bound, out), out)
    out = np.where(b == NAN_SCALE, np.nan, out)
    with np.errstate(under="ignore", over="ignore"):
        out32 = out.astype(np.float32)
        return out32 if np.dtype(dtype) == np.float32 else out32.astype(dtype)


def ulp_at(y: np.ndarray, fmt: Fmt) -> np.ndarray:
    """Spacing of the FP8 grid at magnitude |y| (float64): 2**(max(floor(log2|y|), emin) - mbits)."""
    a = np.abs(np.asarray(y, dtype=np.float64))
    _, e = np.frexp(np.where(a > 0, a, 1.0))
    ex = np.maximum(e - 1, fmt.emin)
    return np.ldexp(1.0, ex - fmt.mbits)
