#!/usr/bin/env python3
"""Bandwidth of the GEMM operand producer (quantize + align128, primitives/gemm_operands.py) vs a device copy.

For each bf16 x (1, R, C) the same run times: a device-to-device copy of x (cudaMemcpyAsync through CuPy,
else torch's copy_, in the same process; bytes = 2 * x bytes), the kernel in the orientations "row",
"col" (transposed) and "both" (one read), the tuning variants, the existing contract quantize_rowcol
kernel (no alignment, for reference) and the XLA reference of "both". Bytes = bytes read + bytes written,
each once (x; FP8 data and float32 scales of each orientation). fraction = (bytes / time) / copy
bandwidth. Timing (benchmarks/harness.py timeit_rotating): `--calls` calls enqueued, one block, divided;
median of `--batches`; two input buffers rotated. Prints a table, writes h200_gemm_operands.json (with the
command) into the --out folder.

Usage: python benchmarks/gemm_operands.py [--out benchmarks/results] [--sizes 16384x4096,...] [--calls 20]
"""

from __future__ import annotations

import sys
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
from copy_baseline import copy_seconds
from harness import timeit_rotating as timeit

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import gemm_operands as pgo
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import quantize as pq
from jax_mxfp8.reference.gemm_align import RUN, padded

SIZES = [(16384, 4096), (8192, 8192), (16384, 14336)]  # (R, C): LM activations / weights


def op_bytes(r: int, c: int, modes) -> int:
    """Bytes read + written: bf16 x once, FP8 data and float32 scales of each orientation."""
    n = 2 * r * c
    for m in modes:
        rows, k = (r, c) if m == "row" else (c, r)
        n += rows * padded(k) + 4 * rows * (padded(k) // RUN)
    return n


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results",
        out_help="folder for h200_gemm_operands.json (default benchmarks/results)",
        time_budget=None,
        calls="calls per batch (default 20)",
        batches="batches (default 3)",
    )
    ap.add_argument("--sizes", help="comma-separated RxC sizes (default: SIZES)")
    ap.add_argument("--no-xla", action="store_true", help="skip the XLA reference rows")
    args = harness.parse(ap, argv)
    harness.counts(args, calls=20, batches=3)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")] if args.sizes else SIZES
    ok, why = library.kernels_runnable(registry.GemmOperandsConfig.archs)
    meta = harness.metadata(
        args,
        kernels=registry.GemmOperandsConfig.archs,
        method="enqueue `calls` calls, block once, divide; median of `batches`; bytes = read + written",
    )
    budget = harness.TimeBudget(args.time_budget)
    print(f"device: {meta['device_kind']}, jax {meta['jax']}, kernels: {ok or why}")
    rows = []

    def record(r, c, name, fn, nbytes, xs, copy_bw):
        t = timeit(jax.jit(fn), xs, args.calls, args.batches)
        bw = nbytes / t
        frac = bw / copy_bw if copy_bw else None
        rows.append(dict(R=r, C=c, op=name, seconds=t, bytes=nbytes, tbps=bw / 1e12, fraction_of_copy=frac))
        fs = f"{frac:6.3f}" if frac is not None else "   n/a"
        print(f"  {r:6d} x {c:6d}  {name:44s} {t * 1e3:8.3f} ms  {bw / 1e12:6.3f} TB/s  {fs} of copy", flush=True)

    for r, c in sizes:
        if budget.exceeded():
            print(f"{r} x {c}: skipped ({budget.exceeded()})")
            continue
        key = jax.random.key(r + 7 * c)
        xs = [jax.random.normal(jax.random.fold_in(key, i), (1, r, c), jnp.bfloat16) * 3.0 for i in range(2)]
        jax.block_until_ready(xs)
        xbytes = 2 * r * c
        t_cp, how = copy_seconds(xbytes, args.calls, args.batches, torch_fallback=True)
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

    path = harness.write_json(Path(args.out) / "h200_gemm_operands.json", meta, rows=rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
