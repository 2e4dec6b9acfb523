"""Where one attention forward+backward's GPU time goes: ours (MXFP8, kernel path) vs cuDNN BF16, kernel by kernel.

For each shape (B4 T4k N16 H128 non-causal and B2 T8k causal): times
jit(lambda q, k, v, ct: jax.vjp(attention, q, k, v)[1](ct)) for ours (jax_mxfp8.dot_product_attention,
implementation="cuda") and cuDNN BF16 (jax.nn, implementation="cudnn") by the timing rule of
benchmarks/harness.py (random bf16 cotangent; enqueue --calls, block once, median of --batches), then traces
--trace-steps calls with
jax.profiler and sums the GPU kernels' time per call by kernel and by category (gpu_trace.py: our kernels by
module, cudnn, cublas, xla fusions, memcpy/memset). The gap between the step time and our attention kernels'
time is the glue (quantize, producer passes, the backward's pre-pass, dq/dk/dv casts and transposes).

It also times the backward's pre-pass alone (primitives/attention_bwd.bwd_operands on square MXArrays): the
bfloat16 operands in XLA (path None, "prepass_xla_s"), through the realign + dequantize calls (the kernel
path's, "prepass_calls_s"), and the latter with the sdp_fp8 copies instead of the bfloat16 V ("prepass_sdp_fp8_s":
the producer work of an sdp_fp8 variant without dv_f16), and with dO in float16 for dV as well
("prepass_dv_f16_s": production's).

Run (GPU):   python benchmarks/profile_attention_step.py --out benchmarks/results/h200_profile_attention_step.json
Smoke (CPU): python benchmarks/profile_attention_step.py --smoke --out $OUT/p.json  (tiny shape, emulated)
"""

from __future__ import annotations

import collections
import math
import sys
import tempfile

import harness
import jax
import jax.numpy as jnp
import numpy as np
from gpu_trace import category, gpu_kernel_times
from harness import timeit

import jax_mxfp8 as mx
from jax_mxfp8.ops.attention_core import square_sequence_major
from jax_mxfp8.primitives import attention_bwd as abwd

SHAPES = (dict(b=4, t=4096, n=16, h=128, causal=False), dict(b=2, t=8192, n=16, h=128, causal=True))
SMOKE = (dict(b=1, t=128, n=2, h=64, causal=True),)


def fwd_bwd(attention):
    """jit of the forward + backward with the forward's residuals, on a given cotangent."""
    return jax.jit(lambda q, k, v, ct: jax.vjp(attention, q, k, v)[1](ct))


def profile(fn, args, steps: int) -> dict:
    """GPU kernel time per call of fn(*args) over `steps` traced calls: total, by category, the longest 12."""
    with tempfile.TemporaryDirectory() as d:
        try:
            with jax.profiler.trace(d):
                out = None
                for _ in range(steps):
                    out = fn(*args)
                jax.block_until_ready(out)
            kernels, _ = gpu_kernel_times(d)
        except Exception as e:  # noqa: BLE001 - a profiler that cannot start (no CUPTI) leaves the timings
            return dict(trace_error=f"{type(e).__name__}: {e}"[:300])
    per_call = {k: (ns / steps / 1e6, n // steps) for k, (ns, n) in kernels.items()}
    cats: dict[str, float] = collections.defaultdict(float)
    for k, (ms, _) in per_call.items():
        cats[category(k)] += ms
    top = sorted(per_call.items(), key=lambda kv: -kv[1][0])[:12]
    return dict(
        gpu_ms=sum(ms for ms, _ in per_call.values()),
        launches=sum(n for _, n in per_call.values()),
        categories_ms=dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        top_kernels=[dict(name=k[:140], ms=ms, count=n, category=category(k)) for k, (ms, n) in top],
    )


def prepass_times(sh, rng, args, path: str) -> dict:
    """Seconds of the backward's pre-pass alone: in XLA, through the calls, and with the sdp_fp8 copies."""
    b, t, n, h = sh["b"], sh["t"], sh["n"], sh["h"]
    bf = jnp.bfloat16
    x = lambda: jnp.asarray(rng.standard_normal((b, t, n, h)), bf)  # noqa: E731
    q, k, v, do, o = (x() for _ in range(5))
    lse = jnp.full((b, n, t), math.log(t), jnp.float32)
    tau = 1.0 / math.sqrt(h)

    def prepass(ops_path, fp8_path, do_f16):
        def run(q, k, v, do, o, lse):
            mxs = [square_sequence_major(a, None, "up", path) for a in (q, k, v, do)]
            kw = dict(q_len=None, kv_len=None, fp8_path=fp8_path, scale=tau, path=ops_path, do_f16=do_f16)
            return abwd.bwd_operands(*mxs, do, o, lse, None, **kw)

        return jax.jit(run)

    out = {}
    variants = (
        ("prepass_xla_s", None, None, False),
        ("prepass_calls_s", path, None, False),
        ("prepass_sdp_fp8_s", path, path, False),
        ("prepass_dv_f16_s", path, path, True),  # production's: dO in float16 for dV
    )
    for key, ops_path, fp8_path, do_f16 in variants:
        fn = prepass(ops_path, fp8_path, do_f16)
        jax.block_until_ready(fn(q, k, v, do, o, lse))
        out[key] = timeit(fn, (q, k, v, do, o, lse), args.calls, args.batches)
    return out


def run_shape(sh, args) -> dict:
    b, t, n, h, causal = sh["b"], sh["t"], sh["n"], sh["h"], sh["causal"]
    rng = np.random.default_rng(0)
    bf = jnp.bfloat16
    q, k, v, ct = (jnp.asarray(rng.standard_normal((b, t, n, h)), bf) for _ in range(4))
    impl = "emulated" if args.smoke else "cuda"
    impls = {
        "ours": lambda q, k, v: mx.dot_product_attention(q, k, v, is_causal=causal, implementation=impl),
        "cudnn_bf16": lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation="xla" if args.smoke else "cudnn"
        ),
    }
    flops = 3.5 * 4.0 * b * n * t * t * h * (0.5 if causal else 1.0)
    row = dict(shape=sh, flops=flops)
    for name, attention in impls.items():
        fn = fwd_bwd(attention)
        jax.block_until_ready(fn(q, k, v, ct))
        s = timeit(fn, (q, k, v, ct), args.calls, args.batches)
        row[name] = dict(step_ms=s * 1e3, tflops=flops / s / 1e12, **profile(fn, (q, k, v, ct), args.trace_steps))
    row.update(prepass_times(sh, rng, args, "emulated" if args.smoke else "cuda"))
    return row


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/h200_profile_attention_step.json",
        smoke="tiny shape, kernels emulated (any backend); 1 call, 1 batch, 1 traced step",
        time_budget=None,
        calls="calls per batch (default 10; smoke 1)",
        batches="batches (default 3; smoke 1)",
    )
    ap.add_argument("--trace-steps", type=int, default=None, help="traced calls (default 5; smoke 1)")
    args = harness.parse(ap, argv)
    harness.counts(args, calls={"full": 10, "smoke": 1}, batches={"full": 3, "smoke": 1})
    args.trace_steps = args.trace_steps or (1 if args.smoke else 5)
    meta = harness.metadata(
        args,
        kernels=not args.smoke,
        timing="jit(jax.vjp(attention, q, k, v)[1](ct)), random bf16 cotangent",
        flops="3.5 * 4 * B * N * T^2 * H (x0.5 causal)",
        trace_steps=args.trace_steps,
    )
    budget = harness.TimeBudget(args.time_budget)
    rows = []
    for sh in SMOKE if args.smoke else SHAPES:
        if budget.exceeded():
            rows.append(dict(shape=sh, skipped=budget.exceeded()))
            continue
        row = run_shape(sh, args)
        rows.append(row)
        name = "B{b} T{t} N{n} H{h}{c}".format(**sh, c=" causal" if sh["causal"] else "")
        ours, cudnn = row["ours"], row["cudnn_bf16"]
        print(f"\n{name}: ours {ours['step_ms']:.3f} ms ({ours['tflops']:.0f} TFLOP/s), cuDNN BF16 "
              f"{cudnn['step_ms']:.3f} ms ({cudnn['tflops']:.0f}); pre-pass in XLA {row['prepass_xla_s'] * 1e3:.3f} ms,"
              f" through the calls {row['prepass_calls_s'] * 1e3:.3f} ms, with the sdp_fp8 copies "
              f"{row['prepass_sdp_fp8_s'] * 1e3:.3f} ms, and dO in float16 "
              f"{row['prepass_dv_f16_s'] * 1e3:.3f} ms")  # fmt: skip
        for impl in ("ours", "cudnn_bf16"):
            r = row[impl]
            if "categories_ms" not in r:
                print(f"  {impl}: {r.get('trace_error')}")
                continue
            cats = ", ".join(f"{c} {ms:.3f}" for c, ms in r["categories_ms"].items())
            print(f"  {impl}: GPU {r['gpu_ms']:.3f} ms in {r['launches']} launches: {cats}")
            for kern in r["top_kernels"]:
                print(f"    {kern['ms']:8.3f} ms x{kern['count']:<3d} {kern['category']:22s} {kern['name'][:90]}")
        harness.write_json(args.out, meta, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
