"""Accuracy metrics shared by tests, benchmarks and examples."""

from __future__ import annotations

import numpy as np


def sqnr_db(reference, approx) -> float:
    """Signal-to-quantization-noise ratio 10 log10(sum ref^2 / sum (ref - approx)^2) in dB, in float64.

    Returns -inf if `approx` holds any NaN or Inf (NaN never passes), +inf for an exact match.
    """
    ref = np.asarray(reference, dtype=np.float64)
    app = np.asarray(approx, dtype=np.float64)
    if ref.shape != app.shape:
        raise ValueError(f"shapes differ: reference {ref.shape}, approx {app.shape}")
    if not np.all(np.isfinite(app)):
        return float("-inf")
    noise = np.sum((ref - app) ** 2)
    signal = np.sum(ref**2)
    if noise == 0:
        return float("inf")
    return float(10.0 * np.log10(signal / noise))
