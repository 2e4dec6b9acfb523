"""The timing rule of DESIGN.md section 6, shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time

import jax


def timeit(fn, args, calls: int, batches: int) -> float:
    """Median seconds per call: enqueue `calls` calls, block once, divide; median over `batches`."""
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)
