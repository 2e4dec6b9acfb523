#!/usr/bin/env python3
"""Training step of one Flax transformer block: MXFP8 policy vs our BF16 policy vs a stock BF16 block.

Block: pre-norm, RMSNorm -> QKV -> RoPE -> causal attention -> out proj (+ residual), RMSNorm -> MLP
(d -> 4d, GELU, -> d, biases) (+ residual); x (B, T, d) bf16, parameters float32.
  mxfp8       jax_mxfp8.flax.TransformerBlock, PrecisionPolicy() (MXFP8 GEMMs, fused RMSNorm+quantize,
              MXFP8 attention; implementation=None everywhere)
  bf16_policy the same module with PrecisionPolicy.bf16()
  stock       the same structure in plain Flax NNX / JAX: nnx.RMSNorm, nnx.Linear(dtype=bf16) (BF16 dots),
              jax.nn.dot_product_attention(implementation="cudnn" on GPU, None elsewhere), jax.nn.gelu;
              RoPE from jax_mxfp8.flax.functional.rope (plain jnp)
Step: jax.jit of value_and_grad of sum(block(x) * ct) (random bf16 cotangent ct, float32 sum) w.r.t. the
parameters, then SGD (p - lr * g); every variant gets the same x and ct. Timing (benchmarks/harness.py):
enqueue --calls steps, block once, divide; median of --batches batches (the step is a pure function of
(params, x, ct); its outputs are discarded, so every call does the same work).
--trace-steps N also traces N steps of each variant with jax.profiler and records the GPU kernel time per step
by category and the longest kernels (gpu_trace.profile_calls: our kernels by module, cuBLAS, cuDNN, XLA
fusions), where the step's time goes.
--hlo also records, per variant, the dot_general operand dtypes of the lowered step and the cuDNN
attention / GEMM custom calls of the compiled one.

Usage: python benchmarks/train_step.py [--out FILE.json] [--smoke] [--hlo] [--trace-steps N]
       [--only mxfp8,bf16_policy,stock]
  --smoke  d 128, 4 heads, T 64, B 2, 2 calls x 2 batches: proves the script on CPU (numbers mean nothing)
"""

from __future__ import annotations

import collections
import json
import re
import sys
import time
import traceback
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
from flax import nnx
from gpu_trace import profile_calls
from harness import timeit

import jax_mxfp8.flax as mf
from jax_mxfp8.flax import functional as F

VARIANTS = ("mxfp8", "bf16_policy", "stock")
FULL = dict(d=2048, heads=16, t=4096, b=4)
SMOKE = dict(d=128, heads=4, t=64, b=2)
LR = 1e-3
DOT_TYPES = re.compile(
    r"stablehlo.dot_general [^:]*: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\) -> tensor<[^>]*x(\w+)>"
)


class StockBlock(nnx.Module):
    """The reference block in plain Flax: BF16 dots (nnx.Linear dtype=bf16), jax.nn attention."""

    def __init__(self, d: int, heads: int, *, rngs: nnx.Rngs):
        bf = dict(dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=rngs)
        self.heads, self.head_dim = heads, d // heads
        self.norm1 = nnx.RMSNorm(d, epsilon=1e-6, **bf)
        self.qkv = nnx.Linear(d, 3 * d, use_bias=False, **bf)
        self.out = nnx.Linear(d, d, use_bias=False, **bf)
        self.norm2 = nnx.RMSNorm(d, epsilon=1e-6, **bf)
        self.up = nnx.Linear(d, 4 * d, **bf)
        self.down = nnx.Linear(4 * d, d, **bf)
        self.implementation = "cudnn" if jax.default_backend() == "gpu" else None

    def __call__(self, x):
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(self.norm1(x)).reshape(b, t, 3 * self.heads, self.head_dim), 3, axis=2)
        pos = jnp.broadcast_to(jnp.arange(t), (b, t))
        q, k = F.rope(q, pos), F.rope(k, pos)
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=self.implementation)
        x = x + self.out(o.reshape(b, t, d))
        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


def build(variant: str, d: int, heads: int):
    rngs = nnx.Rngs(0)
    if variant == "stock":
        return StockBlock(d, heads, rngs=rngs)
    policy = mf.PrecisionPolicy() if variant == "mxfp8" else mf.PrecisionPolicy.bf16()
    return mf.TransformerBlock(d, heads, policy=policy, name="block", rngs=rngs)


def make_step(model):
    graphdef, params = nnx.split(model)
    is_stock = isinstance(model, StockBlock)

    def loss_fn(p, x, ct):
        m = nnx.merge(graphdef, p)
        y = m(x) if is_stock else m(x, is_causal=True)
        return jnp.sum(y.astype(jnp.bfloat16) * ct, dtype=jnp.float32)

    def step(p, x, ct):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, ct)
        return loss, jax.tree.map(lambda a, g: a - LR * g.astype(a.dtype), p, grads)

    return jax.jit(step), params


def hlo_summary(lowered, compiled) -> dict:
    dots = collections.Counter(" x ".join(m[:2]) + " -> " + m[2] for m in DOT_TYPES.findall(lowered.as_text()))
    targets = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', compiled.as_text()))
    return dict(lowered_dot_general_dtypes=dict(dots), compiled_custom_calls=dict(targets))


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/h200_train_step.json",
        smoke="d 128, 4 heads, T 64, B 2, 2 calls x 2 batches: proves the script on CPU (numbers mean nothing)",
        calls="steps per batch (default 30; smoke 2)",
        batches="batches (default 3; smoke 2)",
    )
    ap.add_argument("--hlo", action="store_true", help="record dot dtypes and custom calls of each step")
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument("--trace-steps", type=int, default=0, help="profile this many steps per variant (0: none)")
    args = harness.parse(ap, argv)
    harness.counts(args, calls={"full": 30, "smoke": 2}, batches={"full": 3, "smoke": 2})
    cfg = SMOKE if args.smoke else FULL
    out_path = Path(args.out)
    meta = harness.metadata(
        args,
        kernels=not args.smoke,
        timing="one call = one training step",
        flax=getattr(sys.modules.get("flax"), "__version__", None),
        shape=cfg,
        step="jit(value_and_grad(sum(block(x) * ct)) + SGD), causal, bf16 activations, float32 parameters",
        variants=__doc__.split("\n\n")[1],
    )
    print(f"device: {meta['device_kind']}, backend {meta['backend']}, jax {meta['jax']}, shape {cfg}", flush=True)
    kx, kc = jax.random.split(jax.random.key(1))
    shape = (cfg["b"], cfg["t"], cfg["d"])
    x = jax.random.normal(kx, shape, jnp.float32).astype(jnp.bfloat16)
    ct = jax.random.normal(kc, shape, jnp.float32).astype(jnp.bfloat16)
    tokens = cfg["b"] * cfg["t"]
    results = {}
    budget = harness.TimeBudget(None)
    for variant in VARIANTS:
        if args.only and variant not in args.only.split(","):
            continue
        res = results.setdefault(variant, {})
        try:
            step, params = make_step(build(variant, cfg["d"], cfg["heads"]))
            t0 = time.perf_counter()
            lowered = step.lower(params, x, ct)
            compiled = lowered.compile()  # compiled once; timed below without a second compile
            res["compile_s"] = round(time.perf_counter() - t0, 2)
            loss, _ = compiled(params, x, ct)
            res["loss"] = float(loss)
            s = timeit(compiled, (params, x, ct), args.calls, args.batches)
            res.update(step_ms=round(s * 1e3, 3), tokens_per_s=round(tokens / s, 1))
            if args.hlo:
                res["hlo"] = hlo_summary(lowered, compiled)
            if args.trace_steps:
                res["profile"] = profile_calls(compiled, (params, x, ct), args.trace_steps)
            del step, params, lowered, compiled
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res["error"] = repr(e)[:800]
        summary = {k: v for k, v in res.items() if k not in ("hlo", "profile")}
        print(f"  {variant:12s} {json.dumps(summary)}", flush=True)
        if "profile" in res:
            cats = ", ".join(f"{c} {ms:.3f}" for c, ms in res["profile"]["categories_ms"].items())
            print(f"  {'':12s} GPU ms per step {res['profile']['gpu_ms']:.3f}: {cats}", flush=True)
        meta["elapsed_s"] = round(budget.elapsed(), 1)
        harness.write_json(out_path, meta, results=results)
    stock_ms = results.get("stock", {}).get("step_ms")
    print("\n| variant | ms/step | tokens/s | vs stock (time) | loss |\n| --- | --- | --- | --- | --- |")
    for variant, res in results.items():
        if "error" in res:
            print(f"| {variant} | ERROR {res['error'][:80]} | | | |")
            continue
        ratio = res["step_ms"] / stock_ms if stock_ms else None
        res["time_vs_stock"] = None if ratio is None else round(ratio, 3)
        print(
            f"| {variant} | {res['step_ms']:.3f} | {res['tokens_per_s']:.0f} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | {res['loss']:.4g} |"
        )
    harness.write_json(out_path, meta, results=results)
    print(f"wrote {out_path} ({meta.get('elapsed_s')} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
