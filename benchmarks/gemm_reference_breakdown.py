#!/usr/bin/env python3
"""Where the exact BF16 reference of mx_dot_general spends its time (its target: ours_ref >= 0.85x BF16).

One process, bf16 x (M, K), w (K, N) ~ N(0,1), each part jitted and timed alone (benchmarks/harness.py):
  bf16          lax.dot_general(x, w) (the baseline)
  ref           mx_dot_general(x, w, implementation="xla"): the whole reference forward
  prep_x        reference.gemm.quantized_3d(x[None]): quantize along K + dequantize to bf16 (B, M, K)
  prep_w        reference.gemm.quantized_in_place(w): w quantized along K in its own (K, N) layout (what the
                reference runs), then moved to (1, N, K) for the GEMM (XLA folds that move
                into the dot's operand layout in `ref`; timed alone here it is a materialised transpose)
  prep_w_transposed  quantized_3d(w.T[None]): the transpose to (N, K) first, then blocks along the last axis
                (the reference before: XLA fused the transpose into the block reduction, strided reads)
  quantize_x    jax_mxfp8.quantize(x, implementation="xla") alone (FP8 data + E8M0 scales, no dequantize)
  gemm_f32out   reference.gemm.matmul_3d of the two prepared bf16 operands (float32 out) + cast to bf16
  gemm_bf16out  the same GEMM with preferred_element_type=bf16 (what the f32 output + cast costs)
Bytes per part are the HBM floor (each operand read once, written once); GB/s = bytes / time.
The last column "sum" compares ref with prep_x + prep_w + gemm_f32out.

Usage: python benchmarks/gemm_reference_breakdown.py [--out FILE.json] [--smoke] [--time-budget S]
"""

from __future__ import annotations

import harness
import jax
import jax.numpy as jnp
import numpy as np
from harness import timeit
from jax import lax

import jax_mxfp8 as mx
from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.reference import gemm

DN = (((1,), (0,)), ((), ()))
FULL_SHAPES = [(8192, 8192, 8192), (16384, 4096, 14336), (16384, 14336, 4096)]  # (M, K, N)
SMOKE_SHAPES = [(128, 256, 192)]


def parts(m: int, k: int, n: int, calls: int, batches: int) -> dict:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16)
    cfg = MXDotConfig()
    prep_x = jax.jit(lambda x: gemm.quantized_3d(x[None], cfg, gemm.FWD))
    _, w_layout = gemm.operand_layouts(x.shape, w.shape, DN)
    # what the reference runs: w quantized along K in its own (K, N) layout, then moved to (1, N, K)
    prep_w = jax.jit(lambda w: w_layout.to_3d(gemm.quantized_in_place(w, w_layout, cfg)))
    prep_w_transposed = jax.jit(lambda w: gemm.quantized_3d(w.T[None], cfg, gemm.FWD))  # before: (N, K) first
    a, b = prep_x(x), prep_w(w)
    fns = {
        "bf16": (jax.jit(lambda x, w: lax.dot_general(x, w, DN)), (x, w), 2 * (m * k + k * n + m * n)),
        "ref": (jax.jit(lambda x, w: mx.mx_dot_general(x, w, DN, implementation="xla")), (x, w), None),
        "prep_x": (prep_x, (x,), 4 * m * k),
        "prep_w": (prep_w, (w,), 4 * k * n),
        "prep_w_transposed": (prep_w_transposed, (w,), 4 * k * n),
        "quantize_x": (jax.jit(lambda x: mx.quantize(x, axis=-1, implementation="xla")), (x,), 3 * m * k + m * k // 32),
        "gemm_f32out": (jax.jit(lambda a, b: gemm.matmul_3d(a, b)[0].astype(jnp.bfloat16)), (a, b), None),
        "gemm_bf16out": (
            jax.jit(lambda a, b: jnp.einsum("bmk,bnk->bmn", a, b, preferred_element_type=jnp.bfloat16)[0]),
            (a, b),
            None,
        ),
    }
    want = np.asarray(fns["ref"][0](x, w).astype(jnp.float32))
    got = np.asarray(fns["gemm_f32out"][0](a, b).astype(jnp.float32))
    out = {"m": m, "k": k, "n": n, "ref_equals_parts": bool(np.array_equal(want, got)), "parts": {}}
    for name, (f, args, nbytes) in fns.items():
        jax.block_until_ready(f(*args))  # compile outside the timed batches
        s = timeit(f, args, calls, batches)
        row = {"ms": round(s * 1e3, 4)}
        if nbytes:
            row["gb_s"] = round(nbytes / s / 1e9, 1)
        if name in ("bf16", "ref", "gemm_f32out", "gemm_bf16out"):
            row["tflops"] = round(2 * m * n * k / s / 1e12, 1)
        out["parts"][name] = row
    p = out["parts"]
    out["ref_vs_bf16"] = round(p["bf16"]["ms"] / p["ref"]["ms"], 3)
    out["sum_of_parts_ms"] = round(p["prep_x"]["ms"] + p["prep_w"]["ms"] + p["gemm_f32out"]["ms"], 4)
    return out


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/h200_gemm_reference_breakdown.json",
        smoke="a small shape, 2 calls x 2 batches (numbers mean nothing)",
        time_budget=None,
        calls="calls per batch (default 20; smoke 2)",
        batches="batches (default 3; smoke 2)",
    )
    args = harness.parse(ap, argv)
    harness.counts(args, calls={"full": 20, "smoke": 2}, batches={"full": 3, "smoke": 2})
    shapes, calls, batches = (SMOKE_SHAPES if args.smoke else FULL_SHAPES), args.calls, args.batches
    meta = harness.metadata(args)
    budget = harness.TimeBudget(args.time_budget)
    rows = []
    names = ("bf16", "ref", "prep_x", "prep_w", "prep_w_transposed", "quantize_x", "gemm_f32out", "gemm_bf16out")
    print("| M x K x N | " + " | ".join(f"{n} ms" for n in names) + " | ref/bf16 | prep+gemm ms | ref bits = parts |")
    print("|" + " --- |" * (len(names) + 4))
    for m, k, n in shapes:
        if budget.exceeded():
            print(f"| {m}x{k}x{n} | skipped ({budget.exceeded()}) |")
            continue
        r = parts(m, k, n, calls, batches)
        rows.append(r)
        cells = []
        for nm in names:
            p = r["parts"][nm]
            cells.append(f"{p['ms']:.3f}" + (f" ({p['gb_s']:.0f} GB/s)" if "gb_s" in p and nm != "bf16" else ""))
        print(
            f"| {m}x{k}x{n} | " + " | ".join(cells) + f" | {r['ref_vs_bf16']:.3f} | {r['sum_of_parts_ms']:.3f} | "
            f"{r['ref_equals_parts']} |",
            flush=True,
        )
        harness.write_json(args.out, meta, shapes=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
