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
FLOPs 2*M*N*K. Timing (benchmarks/harness.py): enqueue --calls calls, block once, divide; median of
--batches batches. Targets: epi >= 0.95x plain and >= 1.2x then_q (likewise epi_gelu vs then_gelu_q,
reported).

Usage: python benchmarks/gemm_epilogue.py [--out FILE.json] [--smoke] [--only plain,epi,...] [--shapes N]
                                          [--time-budget S]
  --smoke   a small shape, emulated on CPU (numbers mean nothing; proves the script)
The JSON (default benchmarks/results/h200_gemm_epilogue.json) is rewritten after every shape.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
from harness import timeit
from mx_gemm_kernel import FULL_SHAPES, aligned_operands  # benchmarks/mx_gemm_kernel.py

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import mx_gemm as mg
from jax_mxfp8.primitives import mx_gemm_epilogue as me
from jax_mxfp8.primitives.gemm_operands import gemm_operands
from jax_mxfp8.primitives.quantize import quantize

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
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/h200_gemm_epilogue.json",
        smoke="a small shape, emulated on CPU (numbers mean nothing; proves the script)",
        time_budget=None,
        calls="calls per batch (default 20; smoke 2)",
        batches="batches (default 3; smoke 2)",
    )
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--shapes", type=int, default=None, help="only the first N shapes")
    args = harness.parse(ap, argv)
    harness.counts(args, calls={"full": 20, "smoke": 2}, batches={"full": 3, "smoke": 2})
    args.path = "emulated" if args.smoke else "cuda"
    out_path = Path(args.out)
    meta = harness.metadata(
        args,
        kernels=not args.smoke,
        flops="2*M*N*K",
        targets=[f"{i} >= {r}x {b}" for i, b, r in TARGETS],
        impls=__doc__.split("\n\n")[1],
    )
    print(f"device: {meta['device_kind']}, jax {meta['jax']}, path {args.path}")
    shapes = SMOKE_SHAPES if args.smoke else FULL_SHAPES[: args.shapes]
    budget = harness.TimeBudget(args.time_budget)
    results = []
    for m, k, n in shapes:
        res = dict(name=f"{m}x{k}x{n}", m=m, k=k, n=n)
        results.append(res)
        skip = budget.exceeded()
        if skip:
            res["skipped"] = skip
            continue
        print(f"{res['name']}  [{budget.elapsed():.0f} s]", flush=True)
        run_shape(m, k, n, args, res)
        meta["elapsed_s"] = round(budget.elapsed(), 1)
        harness.write_json(out_path, meta, shapes=results)
    print_table(results)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
