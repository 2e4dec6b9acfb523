#!/usr/bin/env python3
"""Effective bandwidth of the MX quantize / dequantize kernels vs the XLA reference vs a device copy.

Bytes counted = bytes the op must read plus bytes it must write (each once). For each size the same run
measures: a device-to-device copy (cudaMemcpyAsync through CuPy when importable, and XLA's elementwise
copy-like `x + 1` always), the CuTe DSL kernels (implementation="cuda") and the XLA reference
(implementation="xla"). Timing (benchmarks/harness.py timeit_rotating): enqueue `--calls` calls, block once,
divide; median of `--batches` such batches; inputs rotate over several buffers. Prints a table, writes
h200_quantize.json and h200_quantize.png into the --out folder.

Groups (--groups, default all): copy, quantize (row+col / row / col / square, kernel and XLA),
tunings (registry.TUNING_VARIANTS: the comparison schedules of the bf16 row+col kernel, in the library when
built with --with-tunes), dequantize, rms (fused RMSNorm + quantize on bf16 (M, D), kernel and XLA reference; bytes =
x read + weight read + y written + FP8 data + scales written).

Usage: python benchmarks/quantize.py [--out DIR] [--quick] [--groups copy,quantize,...] [--sizes 8192x8192,...]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
from copy_baseline import copy_seconds
from harness import timeit_rotating as timeit

from jax_mxfp8.formats import quantize as ref_quantize
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import quantize as pq
from jax_mxfp8.primitives import rms_norm_quantize as prq

# (M, K) of bf16 inputs: 128 MiB .. 2 GiB, all far beyond the 50 MB L2.
SIZES = [(8192, 8192), (32768, 16384), (65536, 16384)]
QUICK_SIZES = [(8192, 8192), (16384, 16384)]
# (M, D) of the bf16 RMSNorm + quantize benchmark (LLM hidden sizes; 256 MiB .. 1 GiB of x)
RMS_SIZES = [(32768, 4096), (65536, 4096), (16384, 16384)]
QUICK_RMS_SIZES = [(32768, 4096)]
GROUPS = ("copy", "quantize", "tunings", "dequantize", "rms")


def tuning_label(cfg) -> str:
    label = f"R{cfg.rows_per_thread} w{cfg.warps_per_cta}"
    if cfg.row_scale_store != "byte":
        label += f" {cfg.row_scale_store}-scales x{cfg.tiles_per_warp}"
    if cfg.min_ctas_per_sm:
        label += f" min{cfg.min_ctas_per_sm}"
    return label


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results",
        out_help="folder for h200_quantize.json and .png (default benchmarks/results)",
        quick="two quantize sizes and one RMSNorm size",
        calls="calls per batch (default 30)",
        batches="batches (default 3)",
    )
    ap.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated subset of {GROUPS}")
    ap.add_argument("--sizes", help="comma-separated MxK sizes for the quantize groups (default: SIZES)")
    ap.add_argument("--rms-sizes", help="comma-separated MxD sizes for the rms group (default: RMS_SIZES)")
    args = harness.parse(ap, argv)
    harness.counts(args, calls=30, batches=3)
    groups = set(args.groups.split(","))
    if groups - set(GROUPS):
        ap.error(f"unknown groups {sorted(groups - set(GROUPS))}")

    def parse_sizes(text):
        return [tuple(int(v) for v in item.split("x")) for item in text.split(",")]

    out_dir = Path(args.out)
    ok, why = library.kernels_runnable()
    meta = harness.metadata(
        args,
        kernels=True,
        method="enqueue `calls` calls, block once, divide; median of `batches`; bytes = read + written",
    )
    print(f"device: {meta['device_kind']}, jax {meta['jax']}, kernels: {ok or why}")

    rows = []
    sizes = parse_sizes(args.sizes) if args.sizes else (QUICK_SIZES if args.quick else SIZES)
    if not groups & {"copy", "quantize", "tunings", "dequantize"}:
        sizes = []
    for m, k in sizes:
        n = m * k
        key = jax.random.key(m + k)
        nbuf = 3 if n * 2 <= 2**30 else 2
        xs = [jax.random.normal(jax.random.fold_in(key, i), (m, k), jnp.bfloat16) * 3.0 for i in range(nbuf)]
        jax.block_until_ready(xs)

        def record(name, fn, nbytes, inputs=xs, m=m, k=k):
            t = timeit(jax.jit(fn), inputs, args.calls, args.batches)
            rows.append(dict(M=m, K=k, op=name, seconds=t, bytes=nbytes, tbps=nbytes / t / 1e12))
            print(f"  {m:6d} x {k:6d}  {name:40s} {t * 1e3:8.3f} ms  {nbytes / t / 1e12:6.3f} TB/s", flush=True)

        bf16_bytes = 2 * n
        scales = n // 32
        t_cp = copy_seconds(bf16_bytes, args.calls, args.batches, torch_fallback=False)[0] if "copy" in groups else None
        if t_cp is not None:
            rows.append(
                dict(
                    M=m,
                    K=k,
                    op="copy (cudaMemcpy D2D)",
                    seconds=t_cp,
                    bytes=2 * bf16_bytes,
                    tbps=2 * bf16_bytes / t_cp / 1e12,
                )
            )
            tb = 2 * bf16_bytes / t_cp / 1e12
            print(f"  {m:6d} x {k:6d}  {'copy (cudaMemcpy D2D)':40s} {t_cp * 1e3:8.3f} ms  {tb:6.3f} TB/s")
        if "copy" in groups:
            record("copy-like (XLA x+1, bf16)", lambda v: v + jnp.bfloat16(1), 2 * bf16_bytes)

        rowcol_bytes = bf16_bytes + 2 * (n + scales)
        row_bytes = bf16_bytes + n + scales
        for impl in ((["cuda"] if ok else []) + ["xla"]) if "quantize" in groups else []:
            record(f"quantize rowcol [{impl}]", lambda v, i=impl: pq.quantize_rowcol(v, implementation=i), rowcol_bytes)
            record(f"quantize row [{impl}]", lambda v, i=impl: pq.quantize(v, implementation=i), row_bytes)
            record(f"quantize col [{impl}]", lambda v, i=impl: pq.quantize(v, axis=-2, implementation=i), row_bytes)
            record(
                f"quantize square [{impl}]",
                lambda v, i=impl: pq.quantize(v, block="square", axis=(-2, -1), implementation=i),
                bf16_bytes + n + n // 1024,
            )
        if ok and "tunings" in groups:  # the comparison schedules of the bf16 row+col kernel
            for cfg in registry.TUNING_VARIANTS:
                if not library.has_kernel(cfg.name):
                    print(f"{cfg.name}: not in the library (tools/build_library.py --with-tunes)")
                    continue
                op = functools.partial(pq.QUANTIZE_ROWCOL.call, cfg, "cuda")
                record(f"quantize rowcol t{cfg.tune} {tuning_label(cfg)} [cuda]", op, rowcol_bytes)
        qs = [ref_quantize(x) for x in xs] if "dequantize" in groups else []
        jax.block_until_ready(qs)
        for impl in ((["cuda"] if ok else []) + ["xla"]) if "dequantize" in groups else []:
            record(
                f"dequantize row -> bf16 [{impl}]",
                lambda a, i=impl: pq.dequantize(a, jnp.bfloat16, implementation=i),
                n + scales + bf16_bytes,
                inputs=qs,
            )
        del xs, qs

    rms_sizes = parse_sizes(args.rms_sizes) if args.rms_sizes else (QUICK_RMS_SIZES if args.quick else RMS_SIZES)
    for m, d in rms_sizes if "rms" in groups else []:
        n = m * d
        key = jax.random.key(m + 3 * d)
        nbuf = 3 if n * 2 <= 2**30 else 2
        xs = [jax.random.normal(jax.random.fold_in(key, i), (m, d), jnp.bfloat16) * 3.0 for i in range(nbuf)]
        w = 1.0 + 0.1 * jax.random.normal(jax.random.fold_in(key, 99), (d,), jnp.float32)
        jax.block_until_ready((xs, w))

        def record_rms(name, fn, nbytes, m=m, d=d, xs=xs):
            t = timeit(jax.jit(fn), xs, args.calls, args.batches)
            rows.append(dict(M=m, K=d, op=name, seconds=t, bytes=nbytes, tbps=nbytes / t / 1e12))
            print(f"  {m:6d} x {d:6d}  {name:40s} {t * 1e3:8.3f} ms  {nbytes / t / 1e12:6.3f} TB/s", flush=True)

        t_cp = copy_seconds(2 * n, args.calls, args.batches, torch_fallback=False)[0] if "copy" in groups else None
        if t_cp is not None:
            rows.append(dict(M=m, K=d, op="copy (cudaMemcpy D2D)", seconds=t_cp, bytes=4 * n, tbps=4 * n / t_cp / 1e12))
            tb = 4 * n / t_cp / 1e12
            print(f"  {m:6d} x {d:6d}  {'copy (cudaMemcpy D2D)':40s} {t_cp * 1e3:8.3f} ms  {tb:6.3f} TB/s")
        rms_bytes = 2 * n + 4 * d + 2 * n + n + n // 32
        for impl in (["cuda"] if ok else []) + ["xla"]:
            record_rms(
                f"rms_norm_quantize [{impl}]",
                lambda v, i=impl, w=w: prq.rms_norm_quantize_fwd(v, w, implementation=i),
                rms_bytes,
            )
        del xs

    # summary
    def get(m, k, op):
        for r in rows:
            if (r["M"], r["K"], r["op"]) == (m, k, op):
                return r
        return None

    print(f"\n{'size':14s}  {'op':40s}   TB/s   %copy   x XLA")
    for r in rows:
        cp_row = get(r["M"], r["K"], "copy (cudaMemcpy D2D)") or get(r["M"], r["K"], "copy-like (XLA x+1, bf16)")
        r["fraction_of_copy"] = r["tbps"] / cp_row["tbps"] if cp_row else None
        xla = get(r["M"], r["K"], r["op"].replace("[cuda]", "[xla]")) if "[cuda]" in r["op"] else None
        r["speedup_vs_xla"] = xla["seconds"] / r["seconds"] if xla else None
        frac = f"{100 * r['fraction_of_copy']:6.1f}%" if r["fraction_of_copy"] else "     -"
        sp = f"{r['speedup_vs_xla']:6.2f}x" if r["speedup_vs_xla"] else "      -"
        print(f"{r['M']:6d}x{r['K']:<6d}  {r['op']:40s} {r['tbps']:6.3f} {frac} {sp}")

    harness.write_json(out_dir / "h200_quantize.json", meta, rows=rows)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 5))
        for op in dict.fromkeys(r["op"] for r in rows):
            pts = [(r["bytes"] / 1e9, r["tbps"]) for r in rows if r["op"] == op]
            ax.plot(*zip(*pts, strict=True), marker="o", label=op)
        ax.set_xscale("log")
        ax.set_xlabel("bytes moved (GB)")
        ax.set_ylabel("effective TB/s (read + written)")
        ax.set_title(f"MX quantize on {meta['device_kind']}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "h200_quantize.png", dpi=120)
    except Exception as e:  # noqa: BLE001
        print(f"plot skipped: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
