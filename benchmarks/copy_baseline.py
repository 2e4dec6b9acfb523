"""The bandwidth ceiling the memory-bound kernels are measured against: a device-to-device copy, same process.

copy_seconds(nbytes, calls, batches, torch_fallback) -> (seconds per copy of `nbytes` bytes, or None; how)
times `calls` cudaMemcpyAsync copies through CuPy between CUDA events (median over `batches`), else, with
torch_fallback, torch's copy_ the same way, else (None, "none"). Used by benchmarks/quantize.py and
benchmarks/gemm_operands.py, whose bytes are read + written, as the copy's (2 x nbytes).
"""

from __future__ import annotations

import statistics


def _cupy_seconds(nbytes: int, calls: int, batches: int) -> float:
    import cupy as cp

    a, b = cp.empty(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
    a.fill(1)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    b[...] = a
    times = []
    for _ in range(batches):
        start.record()
        for _ in range(calls):
            cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice, 0)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / calls)
    del a, b
    cp.get_default_memory_pool().free_all_blocks()
    return statistics.median(times)


def _torch_seconds(nbytes: int, calls: int, batches: int) -> float:
    import torch

    a = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(batches):
        start.record()
        for _ in range(calls):
            b.copy_(a)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3 / calls)
    del a, b
    torch.cuda.empty_cache()
    return statistics.median(times)


def copy_seconds(nbytes: int, calls: int, batches: int, *, torch_fallback: bool) -> tuple[float | None, str]:
    """(median seconds per device-to-device copy of `nbytes` bytes, how it was copied); (None, "none") when
    neither CuPy nor (with torch_fallback) torch can copy on a CUDA device here."""
    try:
        return _cupy_seconds(nbytes, calls, batches), "cudaMemcpyAsync D2D (CuPy)"
    except Exception as e:  # noqa: BLE001 - no CuPy, or no CUDA device: say why and try the next
        print(f"cupy copy unavailable: {type(e).__name__}: {e}")
    if torch_fallback:
        try:
            return _torch_seconds(nbytes, calls, batches), "torch copy_ D2D"
        except Exception as e:  # noqa: BLE001
            print(f"torch copy unavailable: {type(e).__name__}: {e}")
    return None, "none"
