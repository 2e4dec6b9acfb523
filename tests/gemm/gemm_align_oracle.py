"""Independent float64 NumPy model of align128 (docs/numerics.md "Formats, quantize and GEMM") and the error
study's helpers.

Never imports jax_mxfp8: block exponents are maxed with explicit loops over the 128-runs, elements are
scaled with np.ldexp in float64 and rounded by mx_oracle's table search (ties to the even code), and the
float32 scale is built with np.ldexp (gradual underflow: 2^-127 is NumPy's subnormal float32).
"""

from __future__ import annotations

import numpy as np

from tests.quantize.mx_oracle import Fmt, decode, quantize, rne_codes

RUN = 128


def align128_oracle(codes: np.ndarray, scale: np.ndarray, fmt: Fmt) -> tuple[np.ndarray, np.ndarray]:
    """codes (..., R, K) uint8 FP8 codes, scale (..., R, K/32) uint8 (blocks along the last axis) ->
    (aligned codes (..., R, Kp) uint8, float32 scale (..., Kp/128, R))."""
    codes = np.asarray(codes, np.uint8)
    *lead, r, k = codes.shape
    nb = k // 32
    kp = -(-k // RUN) * RUN
    nt = kp // RUN
    b = np.asarray(scale, np.int64)
    out = np.zeros((*lead, r, kp), np.uint8)
    sc = np.zeros((*lead, nt, r), np.float32)
    vals = decode(codes, fmt)  # float64, NaN for NaN codes
    for t in range(nt):
        blocks = range(4 * t, min(4 * t + 4, nb))  # the blocks that exist
        e = np.max(np.stack([b[..., j] for j in blocks], axis=-1), axis=-1)  # (..., R)
        with np.errstate(under="ignore"):
            pw = np.ldexp(np.float32(1.0), (np.minimum(e, 254) - 127).astype(int))
            sc[..., t, :] = np.where(e == 255, np.float32(np.nan), pw)
        for j in blocks:
            v = vals[..., 32 * j : 32 * j + 32]
            y = np.ldexp(np.where(np.isnan(v), 0.0, v), (b[..., j] - e)[..., None].astype(int))  # exact
            c = rne_codes(y, fmt)
            out[..., 32 * j : 32 * j + 32] = np.where(np.isnan(v), codes[..., 32 * j : 32 * j + 32], c)
    return out, sc


def dequant_aligned(codes: np.ndarray, scale: np.ndarray, fmt: Fmt) -> np.ndarray:
    """float64 values of aligned (codes (..., R, Kp), scale (..., Kp/128, R))."""
    vals = decode(np.asarray(codes, np.uint8), fmt)
    s = np.repeat(np.swapaxes(np.asarray(scale, np.float64), -1, -2), RUN, axis=-1)
    return vals * s


def dequant_mx(codes: np.ndarray, scale: np.ndarray, fmt: Fmt) -> np.ndarray:
    """float64 values of contract MX (codes (..., R, K), E8M0 scale (..., R, K/32)); NaN for scale 0xFF."""
    vals = decode(np.asarray(codes, np.uint8), fmt)
    b = np.repeat(np.asarray(scale, np.int64), 32, axis=-1)
    return np.where(b == 255, np.nan, vals * np.exp2((b - 127).astype(np.float64)))


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    err = np.sum((got - ref) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(np.sum(ref**2) / err))


def mixed_input(shape, rng: np.random.Generator, spread: int = 40, specials: int = 8) -> np.ndarray:
    """float32 N(0,1) times 2^e per (row, 32-column block), e in [-spread, spread], plus `specials` zero, NaN,
    -Inf and huge (2^60) / tiny (2^-60) blocks; no float32 subnormals (inputs may be flushed there)."""
    *lead, r, k = shape
    x = rng.standard_normal(shape).astype(np.float32)
    e = rng.integers(-spread, spread + 1, size=(*lead, r, k // 32, 1))
    x = (x.reshape(*lead, r, k // 32, 32) * np.exp2(e)).reshape(shape)
    flat = x.reshape(-1, k)
    for _ in range(specials):
        i, c = rng.integers(0, flat.shape[0]), 32 * rng.integers(0, k // 32)
        kind = rng.integers(0, 5)
        if kind == 0:
            flat[i, c : c + 32] = 0.0
        elif kind == 1:
            flat[i, c + rng.integers(0, 32)] = np.nan
        elif kind == 2:
            flat[i, c + rng.integers(0, 32)] = -np.inf
        elif kind == 3:
            flat[i, c : c + 32] *= np.float32(2.0**60)
        else:
            flat[i, c : c + 32] *= np.float32(2.0**-60)
    return np.where(np.abs(x) < 2.0**-126, 0.0, x).astype(np.float32)


def align128_col_oracle(z: np.ndarray):
    """(codes (G, N, Mp) uint8, float32 scale (G, Mp/128, N), finite (G, N, Mp)) of the column orientation."""
    zt = np.swapaxes(np.asarray(z, np.float32), -1, -2)  # (G, N, M): blocks along M = the last axis
    q = quantize(zt, axis=-1)
    codes, scale = align128_oracle(q.data, q.scale, q.fmt)
    finite = np.zeros(codes.shape, bool)
    finite[..., : zt.shape[-1]] = q.finite
    finite[..., zt.shape[-1] :] = True  # padding rows: +0
    return codes, scale, finite
