#!/usr/bin/env python3
"""Kernel-level timing of the MX GEMM's quantize epilogue (primitives/mx_gemm_epilogue.py) vs its baselines.

One process, side by side, for (M, K, N) in 8192^3, 16384 x 4096 x 14336 and 16384 x 14336 x 4096, on the
aligned operands of benchmarks/mx_gemm_kernel.py (a (1, M, K), b (1, N, K) e4m3 K-major, power-of-two
scales per 128 K; made before timing):
  plain          the production MX GEMM, bf16 out (mx_gemm)
  epi            the quantize epilogue: E4M3 (M, N) + E8M0 scales (M, N/32) (mx_gemm_quantized)
  epi_t1         its tuning 1 (the first version: four 16-bit stores per block and row, no paired_stores)
  epi_gelu       the same with GELU (tanh form) before the quantization
  epi_gelu_pre   the same, also writing the bf16 pre-activation (what a GELU backward keeps)
  then_q         the MX GEMM (bf16 out), then the quantize kernel along N (jax_mxfp8 quantize,
                 implementation="cuda"): the two-pass path the epilogue replaces
  then_gelu_q    the MX GEMM (bf16 out), jax.nn.gelu (XLA, bf16), then the quantize kernel
  epi_pre        row orientation + bf16 pre (what mx_dot_general_quantized ran before store_col)
  epi_pre_col    row + pre + the column orientation (store_col: gemm_operands' "col" form, transposed)
  epi_gelu_pre_col   the same with GELU
  epi_pre_then_col   epi_pre, then the gemm_operands kernel's "col" pass over pre (bf16): the two-pass path
                 store_col replaces (the MLP's down-projection residual before it)
  epi_gelu_pre_then_col   the same with GELU (the MLP's training forward before store_col)
  then_ops_both  the MX GEMM (bf16 out), then the gemm_operands kernel's "row" + "col" from one read
                 (GEMM + quantize kernel, both orientations)
FLOPs 2*M*N*K. Timing (benchmarks/timing.py): enqueue --calls calls, block once,
divide; median of --batches batches. Targets (issue 15 item 3): epi >= 0.95x plain and >= 1.2x then_q
(likewise epi_gelu vs then_gelu_q, reported).

Usage: python benchmarks/gemm_epilogue.py [--out FILE.json] [--smoke] [--only plain,epi,...] [--shapes N]
  --smoke   a small shape, emulated on CPU (numbers mean nothing; proves the script)
The JSON (default benchmarks/results/h200_gemm_epilogue.json) is rewritten after every shape.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mx_gemm_kernel import FULL_SHAPES, aligned_operands  # noqa: E402 (benchmarks/mx_gemm_kernel.py)
from timing import timeit  # noqa: E402

from jax_mxfp8.kernels import registry  # noqa: E402
from jax_mxfp8.primitives import library  # noqa: E402
from jax_mxfp8.primitives import mx_gemm as mg  # noqa: E402
from jax_mxfp8.primitives import mx_gemm_epilogue as me  # noqa: E402
from jax_mxfp8.primitives.gemm_operands import gemm_operands  # noqa: E402
from jax_mxfp8.primitives.quantize import quantize  # noqa: E402

SMOKE_SHAPES = [(256, 256, 384)]
IMPLS = (
    "plain",
    "epi",
    "epi_t1",
    "epi_gelu",
    "epi_gelu_pre",
    "then_q",
    "then_gelu_q",
    "epi_pre",
    "epi_pre_col",
    "epi_gelu_pre_col",
    "epi_pre_then_col",
    "epi_gelu_pre_then_col",
    "then_ops_both",
)
# (impl, baseline, ratio): impl at least ratio x as fast as baseline
TARGETS = (
    ("epi", "plain", 0.95),
    ("epi", "then_q", 1.2),
    ("epi_t1", "plain", 0.95),
    ("epi_t1", "then_q", 1.2),
    ("epi_gelu", "then_gelu_q", 1.2),
    ("epi_pre_col", "epi_pre", 0.95),
    ("epi_pre_col", "epi_pre_then_col", 1.0),
    ("epi_gelu_pre_col", "epi_gelu_pre_then_col", 1.0),
    ("epi_pre_col", "then_ops_both", 1.0),
)


def make_fn(name: str, path: str):
    """The timed function of impl `name` on (a, b, sa, sb)."""
    impl = "cuda" if path == "cuda" else "emulated"

    def plain(a, b, sa, sb):
        return mg.mx_gemm(a, b, sa, sb, out_dtype=jnp.bfloat16, path=path)

    def then_q(a, b, sa, sb, gelu=False):
        y = plain(a, b, sa, sb)
        y = jax.nn.gelu(y) if gelu else y
        q = quantize(y, axis=-1, implementation=impl)
        return q.data, q.scale

    def then_col(a, b, sa, sb, act=""):
        q, s, pre = me.mx_gemm_quantized(a, b, sa, sb, activation=act, store_pre=True, path=path)
        h = jax.nn.gelu(pre) if act else pre  # what the down projection re-quantized (bf16)
        return q, s, gemm_operands(h, orientations=("col",), path=impl)["col"]

    def col(a, b, sa, sb, act=""):
        return me.mx_gemm_quantized(a, b, sa, sb, activation=act, store_pre=True, store_col=True, path=path)

    fns = {
        "plain": plain,
        "epi_pre": lambda *o: me.mx_gemm_quantized(*o, store_pre=True, path=path),
        "epi_pre_col": col,
        "epi_gelu_pre_col": lambda *o: col(*o, act="gelu"),
        "epi_pre_then_col": then_col,
        "epi_gelu_pre_then_col": lambda *o: then_col(*o, act="gelu"),
        "then_ops_both": lambda *o: gemm_operands(plain(*o), orientations=("row", "col"), path=impl),
        "epi": lambda *o: me.mx_gemm_quantized(*o, path=path),
        "epi_t1": lambda *o: me.mx_gemm_quantized(*o, path=path, tune=1),
        "epi_gelu": lambda *o: me.mx_gemm_quantized(*o, activation="gelu", path=path),
        "epi_gelu_pre": lambda *o: me.mx_gemm_quantized(*o, activation="gelu", store_pre=True, path=path),
        "then_q": then_q,
        "then_gelu_q": lambda *o: then_q(*o, gelu=True),
    }
    return jax.jit(fns[name])


def run_shape(m, k, n, args, res) -> None:
    ops = aligned_operands(jax.random.PRNGKey(0), m, k, n)
    flops = 2 * m * n * k
    for name in args.only.split(",") if args.only else IMPLS:
        out = res.setdefault(name, {})
        if name == "epi_t1" and args.path == "cuda":
            t1 = registry.find(registry.MXGemmEpilogueConfig, tune=1)
            if not library.has_kernel(t1.name):
                out["skipped"] = f"{t1.name} is not in the library (tools/build_library.py --with-tunes)"
                continue
        try:
            t = timeit(make_fn(name, args.path), ops, args.calls, args.batches)
            out["s"] = t
            out["tflops"] = round(flops / t / 1e12, 1)
            print(f"  {name:13s} {t * 1e3:8.3f} ms  {out['tflops']:7.1f} TFLOP/s", flush=True)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            out["error"] = repr(e)[:800]
    res["ratios"] = {
        f"{i}/{b}": round(res[b]["s"] / res[i]["s"], 3)
        for i, b, _ in TARGETS
        if "s" in res.get(i, {}) and "s" in res.get(b, {})
    }
    res["targets_met"] = {f"{i}/{b} >= {r}": res["ratios"].get(f"{i}/{b}", 0) >= r for i, b, r in TARGETS}


def print_table(results) -> None:
    names = [i for i in IMPLS if any(i in r for r in results)]
    print("\nms per call (kernel level; TFLOP/s = 2MNK / t in the JSON)")
    print(f"{'shape':>18s} " + " ".join(f"{nm:>13s}" for nm in names) + "  ratios")
    for r in results:
        cells = [f"{r.get(nm, {}).get('s', float('nan')) * 1e3:13.3f}" for nm in names]
        print(f"{r['name']:>18s} " + " ".join(cells) + "  " + json.dumps(r.get("ratios", {})))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "h200_gemm_epilogue.json"))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--calls", type=int, default=None, help="calls per batch (default 20; smoke 2)")
    ap.add_argument("--batches", type=int, default=None, help="batches (default 3; smoke 2)")
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--shapes", type=int, default=None, help="only the first N shapes")
    args = ap.parse_args(argv)
    args.calls = args.calls or (2 if args.smoke else 20)
    args.batches = args.batches or (2 if args.smoke else 3)
    args.path = "emulated" if args.smoke else "cuda"
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    dev = jax.devices()[0]
    device = getattr(dev, "device_kind", str(dev))
    print(f"device: {device}, jax {jax.__version__}, path {args.path}")
    meta = dict(
        device=device,
        jax=jax.__version__,
        python=platform.python_version(),
        command=shlex.join([os.path.basename(sys.executable), *sys.argv]),
        timestamp=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        mode="smoke" if args.smoke else "full",
        timing=f"enqueue {args.calls} calls, block once, divide; median of {args.batches} batches",
        flops="2*M*N*K",
        targets=[f"{i} >= {r}x {b}" for i, b, r in TARGETS],
        impls=__doc__.split("\n\n")[1],
    )
    if args.smoke:
        meta["note"] = "SMOKE RUN: a tiny shape on the emulated path, timings mean nothing"
    shapes = SMOKE_SHAPES if args.smoke else FULL_SHAPES[: args.shapes]
    results = []
    t0 = time.perf_counter()
    for m, k, n in shapes:
        res = dict(name=f"{m}x{k}x{n}", m=m, k=k, n=n)
        results.append(res)
        print(f"{res['name']}  [{time.perf_counter() - t0:.0f} s]", flush=True)
        run_shape(m, k, n, args, res)
        meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
        out_path.write_text(json.dumps(dict(meta=meta, shapes=results), indent=1) + "\n")
    print_table(results)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
