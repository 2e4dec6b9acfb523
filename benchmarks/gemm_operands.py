#!/usr/bin/env python3
"""Bandwidth of the GEMM operand producer (quantize + align128, primitives/gemm_operands.py) vs a device copy.

For each bf16 x (1, R, C) the same run times: a device-to-device copy of x (cudaMemcpyAsync through CuPy,
else torch's copy_, in the same process; bytes = 2 * x bytes), the kernel in the orientations "row",
"col" (transposed) and "both" (one read), the tuning variants, the existing contract quantize_rowcol
kernel (no alignment, for reference) and the XLA reference of "both". Bytes = bytes read + bytes written,
each once (x; FP8 data and float32 scales of each orientation). fraction = (bytes / time) / copy
bandwidth. Timing (DESIGN.md): `--calls` calls enqueued, one block, divided; median of `--batches`;
two input buffers rotated. Prints a table, writes JSON (with the command) to --out.

Usage: python benchmarks/gemm_operands.py [--out benchmarks/results] [--sizes 16384x4096,...] [--calls 20]
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jax_mxfp8.kernels import registry  # noqa: E402
from jax_mxfp8.primitives import gemm_operands as pgo  # noqa: E402
from jax_mxfp8.primitives import library  # noqa: E402
from jax_mxfp8.primitives import quantize as pq  # noqa: E402
from jax_mxfp8.reference.gemm_align import RUN, padded  # noqa: E402

SIZES = [(16384, 4096), (8192, 8192), (16384, 14336)]  # (R, C): LM activations / weights


def timeit(fn, inputs, calls: int, batches: int) -> float:
    """Median seconds per call, inputs rotated."""
    jax.block_until_ready(fn(inputs[0]))
    jax.block_until_ready(fn(inputs[-1]))
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        out = None
        for i in range(calls):
            out = fn(inputs[i % len(inputs)])
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def copy_time(nbytes: int, calls: int, batches: int) -> tuple[float | None, str]:
    """Seconds per device-to-device copy of nbytes: CuPy's cudaMemcpyAsync, else torch copy_."""
    try:
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
        return statistics.median(times), "cudaMemcpyAsync D2D (CuPy)"
    except Exception as e:  # noqa: BLE001
        print(f"cupy copy unavailable: {type(e).__name__}: {e}")
    try:
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
        return statistics.median(times), "torch copy_ D2D"
    except Exception as e:  # noqa: BLE001
        print(f"torch copy unavailable: {type(e).__name__}: {e}")
    return None, "none"


def op_bytes(r: int, c: int, modes) -> int:
    """Bytes read + written: bf16 x once, FP8 data and float32 scales of each orientation."""
    n = 2 * r * c
    for m in modes:
        rows, k = (r, c) if m == "row" else (c, r)
        n += rows * padded(k) + 4 * rows * (padded(k) // RUN)
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--sizes", help="comma-separated RxC sizes (default: SIZES)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--no-xla", action="store_true", help="skip the XLA reference rows")
    args = ap.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")] if args.sizes else SIZES
    ok, why = library.kernels_runnable(registry.GemmOperandsConfig.archs)
    dev = jax.devices()[0]
    print(f"device: {dev.device_kind}, jax {jax.__version__}, kernels: {ok or why}")
    rows = []

    def record(r, c, name, fn, nbytes, xs, copy_bw):
        t = timeit(jax.jit(fn), xs, args.calls, args.batches)
        bw = nbytes / t
        frac = bw / copy_bw if copy_bw else None
        rows.append(dict(R=r, C=c, op=name, seconds=t, bytes=nbytes, tbps=bw / 1e12, fraction_of_copy=frac))
        fs = f"{frac:6.3f}" if frac is not None else "   n/a"
        print(f"  {r:6d} x {c:6d}  {name:44s} {t * 1e3:8.3f} ms  {bw / 1e12:6.3f} TB/s  {fs} of copy", flush=True)

    for r, c in sizes:
        key = jax.random.key(r + 7 * c)
        xs = [jax.random.normal(jax.random.fold_in(key, i), (1, r, c), jnp.bfloat16) * 3.0 for i in range(2)]
        jax.block_until_ready(xs)
        xbytes = 2 * r * c
        t_cp, how = copy_time(xbytes, args.calls, args.batches)
        copy_bw = 2 * xbytes / t_cp if t_cp else None
        if t_cp:
            rows.append(dict(R=r, C=c, op=f"copy ({how})", seconds=t_cp, bytes=2 * xbytes, tbps=copy_bw / 1e12,
                             fraction_of_copy=1.0))  # fmt: skip
            print(f"  {r:6d} x {c:6d}  {'copy (' + how + ')':44s} {t_cp * 1e3:8.3f} ms  {copy_bw / 1e12:6.3f} TB/s")
        if copy_bw is None:  # no CuPy / torch: XLA's copy-like elementwise op stands in for the copy
            t_cp = timeit(jax.jit(lambda v: v + jnp.bfloat16(1)), xs, args.calls, args.batches)
            copy_bw = 2 * xbytes / t_cp
            rows.append(dict(R=r, C=c, op="copy-like (XLA x+1)", seconds=t_cp, bytes=2 * xbytes,
                             tbps=copy_bw / 1e12, fraction_of_copy=1.0))  # fmt: skip
        if ok:
            for modes in (("row",), ("col",), ("row", "col")):
                name = f"gemm_operands {'+'.join(modes)} [cuda]"
                fn = lambda v, m=modes: pgo.gemm_operands(v, orientations=m, path="cuda")
                record(r, c, name, fn, op_bytes(r, c, modes), xs, copy_bw)
            for cfg in (c for c in registry.GEMM_OPERANDS_TUNINGS if library.has_kernel(c.name)):  # --with-tunes
                fn = lambda v, cfg=cfg: pgo.declaration(cfg).call(cfg, "cuda", v)
                record(r, c, f"gemm_operands {cfg.orientations} t{cfg.tune} min{cfg.min_ctas_per_sm} [cuda]", fn,
                       op_bytes(r, c, ("row", "col")), xs, copy_bw)  # fmt: skip
            mx = xbytes + 2 * (r * c + r * c // 32)
            record(r, c, "quantize_rowcol (contract MX, no align) [cuda]",
                   lambda v: pq.quantize_rowcol(v, implementation="cuda"), mx, xs, copy_bw)  # fmt: skip
        if not args.no_xla:
            fn = lambda v: pgo.gemm_operands(v, path="xla")
            record(r, c, "gemm_operands row+col [xla]", fn, op_bytes(r, c, ("row", "col")), xs, copy_bw)
        del xs

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(
        device=dev.device_kind,
        jax=jax.__version__,
        kernels=bool(ok),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command="python3 " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
        calls=args.calls,
        batches=args.batches,
        method="enqueue `calls` calls, block once, divide; median of `batches`; bytes = read + written",
    )
    path = out_dir / "h200_gemm_operands.json"
    path.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
