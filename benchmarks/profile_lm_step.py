"""Where one LM training step's GPU time goes: MXFP8 vs BF16 policy, float32 vs bfloat16 activations.

Builds examples/train_lm.py's DecoderLM at its h200 preset (d_model 1024, 8 layers, 8 query / 2 kv heads of
128, batch 16 x 2048 tokens; policy "mxfp8-head-bf16" against the all-BF16 twin), times `train_step` by the
rule of benchmarks/harness.py (enqueue `--calls` steps, block once; median of `--batches`), then traces `--trace-steps`
steps with jax.profiler and sums the GPU kernels' time per step by category:

  ours:<module>   our CuTe DSL kernels, by kernel module (mx_gemm, gemm_operands, attention_fwd, ...)
  cublas          cuBLAS / cuBLASLt GEMMs (nvjet, xmma, gemm)
  cudnn           cuDNN kernels (the BF16 model's attention)
  xla             XLA's own fusions (elementwise, reductions, transposes, the optimizer)
  memcpy, other

plus the 25 longest kernels, so that a gap between two configurations can be read off by category. Tokens
are random (the speed does not depend on them). Results: a printed table and `--out` JSON.

Run (GPU):  python benchmarks/profile_lm_step.py --out benchmarks/results/h200_profile_lm_step.json
Smoke (CPU): python benchmarks/profile_lm_step.py --smoke --out $OUT/p.json  (tiny model; no GPU planes)
"""

from __future__ import annotations

import argparse
import sys

import harness
import jax
import numpy as np
from gpu_trace import profile_calls
from harness import timeit

sys.path.insert(0, str(harness.ROOT / "examples"))

import train_lm  # noqa: E402
from lm_model import make_optimizer, train_step  # noqa: E402

from jax_mxfp8.flax import PrecisionPolicy  # noqa: E402

CONFIGS = ("mxfp8:bfloat16", "bf16:bfloat16", "mxfp8:float32", "bf16:float32")


def run_config(policy: str, dtype: str, args: argparse.Namespace) -> dict:
    """Times and profiles one (policy, activation dtype) configuration."""
    argv = ["--preset", "h200"] if not args.smoke else ["--d-model", "64", "--layers", "1", "--heads", "2"]
    argv += ["--dtype", dtype, "--batch", str(args.batch or (2 if args.smoke else 16))]
    argv += ["--seq-len", str(args.seq_len or (64 if args.smoke else 2048))]
    largs = train_lm.parse_args(argv)
    pol = train_lm.make_policy(largs.policy, largs.layers) if policy == "mxfp8" else PrecisionPolicy.bf16()
    model = train_lm.build_model(largs, pol, 256)
    opt = make_optimizer(model, learning_rate=1e-3, steps=1000)
    rng = np.random.default_rng(0)
    tokens = jax.numpy.asarray(rng.integers(0, 256, size=(largs.batch, largs.seq_len + 1)), jax.numpy.int32)
    jax.block_until_ready(train_step(model, opt, tokens))  # compile
    step_s = timeit(train_step, (model, opt, tokens), args.calls, args.batches)
    out = dict(
        policy=policy,
        dtype=dtype,
        batch=largs.batch,
        seq_len=largs.seq_len,
        d_model=largs.d_model,
        layers=largs.layers,
        step_ms=step_s * 1e3,
        tokens_per_s=largs.batch * largs.seq_len / step_s,
    )
    out.update(profile_calls(train_step, (model, opt, tokens), args.trace_steps))
    return out


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/h200_profile_lm_step.json",
        smoke="a tiny model (CPU check of the script)",
        time_budget=None,
        calls="steps per batch (default 10)",
        batches="batches (default 3)",
    )
    ap.add_argument("--configs", default=",".join(CONFIGS), help="policy:dtype,... (policy mxfp8|bf16)")
    ap.add_argument("--trace-steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    args = harness.parse(ap, argv)
    harness.counts(args, calls=10, batches=3)
    budget = harness.TimeBudget(args.time_budget)
    results = []
    for spec in args.configs.split(","):
        policy, dtype = spec.split(":")
        if policy not in ("mxfp8", "bf16") or dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--configs entry {spec!r}: want policy:dtype with mxfp8|bf16 and float32|bfloat16")
        if budget.exceeded():
            print(f"{spec}: skipped ({budget.exceeded()})")
            continue
        results.append(run_config(policy, dtype, args))
        r = results[-1]
        print(f"{spec:16s} step {r['step_ms']:8.2f} ms  {r['tokens_per_s']:>12,.0f} tok/s  gpu {r['gpu_ms']:7.2f} ms",
              flush=True)  # fmt: skip
    cats = sorted({c for r in results for c in r["categories_ms"]}, key=lambda c: -max(
        r["categories_ms"].get(c, 0.0) for r in results))  # fmt: skip
    table = [[c, *(f"{r['categories_ms'].get(c, 0.0):.2f}" for r in results)] for c in cats]
    table.append(["kernels total", *(f"{r['gpu_ms']:.2f}" for r in results)])
    table.append(["step (wall)", *(f"{r['step_ms']:.2f}" for r in results)])
    print("\nGPU ms per step by category")
    print(harness.markdown_table(["category", *(f"{r['policy']}:{r['dtype']}" for r in results)], table))
    meta = harness.metadata(
        args,
        kernels=not args.smoke,
        timing=f"train_step steps; profile: {args.trace_steps} traced steps, kernel time per step",
    )
    harness.write_json(args.out, meta, results=results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
