"""NumPy model of the packed entry points' offsets rule (varlen_attention's docstring), for the property tests.

valid(cu, total, max_len): the offsets a concrete call accepts: non-decreasing, within [0, total], no sequence
longer than max_len. sanitized(cu, total): what traced offsets become: clamped to [0, total], then a running
maximum (an offset below its predecessor is raised to it).
"""

from __future__ import annotations

import numpy as np


def sanitized(cu, total: int) -> np.ndarray:
    return np.maximum.accumulate(np.clip(np.asarray(cu, np.int64), 0, total)).astype(np.int32)


def valid(cu, total: int, max_len: int) -> bool:
    c = np.asarray(cu, np.int64)
    d = np.diff(c)
    return bool(c[0] >= 0 and np.all(d >= 0) and c[-1] <= total and (d.size == 0 or d.max() <= max_len))
