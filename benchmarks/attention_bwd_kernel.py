#!/usr/bin/env python3
"""Times the Hopper MXFP8 attention backward kernel alone next to jax.grad of cuDNN BF16 attention.

The kernel: one `jax_mxfp8_attention_bwd` FFI call on operands prepared once (bf16 MX values, head-major,
float32 LSE and delta; the pre-pass is not timed); the sdp_fp8 variants (production) take
`jax_mxfp8_attention_bwd_fp8` with FP8 copies made by casting the same N(0, 1) values (fp8_inputs: right for
timing, not MX values), the dv_f16 ones dO in float16. cuDNN: the backward half of
jax.nn.dot_product_attention(implementation="cudnn") in bfloat16 (jax.vjp once, then the jitted VJP
function on a random cotangent), same shapes.

FLOPs: backward = 2.5 x forward = 2.5 * 4 * B * N * T * S * H (five T x S x H GEMMs: S, dP, dV, dK, dQ),
halved for causal. Production and the two comparison schedules (TUNES: registry COMPARISONS, tune 17 on BF16
wgmma only and PREVIOUS, production without dv_f16; in the library when built with --with-tunes) are timed;
"kernel_s" is the fastest. The dQ modes (MODES: dq_accum "fp16" with e = 12, deterministic "fp32" and "fp16";
kernels/sm90/attention_bwd_dq.py) are timed on the same inputs, with their dq's SQNR against the float32 dq of
the first BF16-only tune timed ("kernel_<mode>_dq_db"; the modes run all GEMMs on BF16 wgmma, so dk, dv are the
same math; time tune 17 for it: --tunes 0,17). Mode "pblock": the p_scale="block" variant (registry BLOCK_P:
production's schedule without p_scaled, P quantized per 32 queries of each key).
Timing: benchmarks/harness.py (the same inputs for every tune and mode of a shape).
Usage: python benchmarks/attention_bwd_kernel.py [--out results.json] [--calls 10] [--batches 5] [--tunes 0,17]
             [--shapes 0,2] [--modes none|fp16,det,fp16_det,pblock] [--time-budget S]
       ncu -k regex:attention_bwd --launch-skip 1 --launch-count 1 python benchmarks/attention_bwd_kernel.py --profile 0
"""

from __future__ import annotations

import math
import sys

import harness
import jax
import jax.numpy as jnp
import numpy as np
from harness import timeit

from jax_mxfp8.kernels import registry
from jax_mxfp8.kernels.registry.attention_bwd import COMPARISONS, DQ_MODES
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.primitives import library

SHAPES = [
    dict(b=4, t=4096, n=16, n_kv=16, h=128, causal=False),
    dict(b=4, t=4096, n=16, n_kv=16, h=128, causal=True),
    dict(b=4, t=4096, n=16, n_kv=16, h=64, causal=False),
]


def bwd_flops(b, t, n, h, causal, **_) -> float:
    f = 2.5 * 4.0 * b * n * t * t * h
    return f / 2 if causal else f


TUNES = tuple(sorted({0, *(t for tunes in COMPARISONS.values() for t in tunes)}))
MODES = {"fp16": DQ_MODES[0], "det": DQ_MODES[1], "fp16_det": DQ_MODES[2], "pblock": dict(p_scale="block")}
DQ_E = 12  # dq_accum "fp16": the default dq_fp16_scale_log2


def kernel_fn(shape, rng, tune=0, mode=None, inputs=None):
    """(jit of one kernel call -> (dq, dk, dv, dq_sem) as the kernel leaves them (dq_accum "fp16": dq holds
    dQ * 2^DQ_E in float16); its inputs: `inputs`, else kernel_inputs(shape, rng)), or (None, None) when the
    variant is not registered or not in the library (the comparison schedules: build_library.py --with-tunes)."""
    b, t, n, n_kv, h = shape["b"], shape["t"], shape["n"], shape["n_kv"], shape["h"]
    variant = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=shape["causal"], tune=tune, **(mode or {}))
    if variant is None or not library.has_kernel(variant.name):
        return None, None
    outs = (
        jax.ShapeDtypeStruct((b, n, t, h), jnp.float16 if variant.dq_accum == "fp16" else jnp.float32),
        jax.ShapeDtypeStruct((b, n_kv, t, h), jnp.float32),
        jax.ShapeDtypeStruct((b, n_kv, t, h), jnp.float32),
        jax.ShapeDtypeStruct((b, n, t // 32), jnp.int32),
    )
    call = jax.ffi.ffi_call("jax_mxfp8_attention_bwd" + ("_fp8" if variant.sdp_fp8 else ""), outs)
    e = DQ_E if variant.dq_accum == "fp16" else 0
    attrs = dict(kernel=variant.name, scale=np.float32(1.0 / math.sqrt(h)), dq_scale_log2=np.int32(e))
    inputs = inputs if inputs is not None else kernel_inputs(shape, rng)
    if variant.sdp_fp8:  # v8 in v's place, then q8, k8, do8, qs, ks, vs, dos
        q8, k8, v8, do8, qs, ks, vs, dos = fp8_inputs(inputs, h)
        do = inputs[3].astype(jnp.float16) if variant.dv_f16 else inputs[3]  # dv_f16: dO 2^-shift (timing: shift 0)
        inputs = (inputs[0], inputs[1], v8, do, *inputs[4:], q8, k8, do8, qs, ks, vs, dos)
    return jax.jit(lambda *a: call(*a, **attrs)), inputs


def fp8_inputs(inputs, h: int) -> tuple[jax.Array, ...]:
    """The sdp_fp8 variants' extra operands for timing: q, k, v, do rounded to float8_e4m3fn (exponent 0: the
    inputs are N(0, 1)), factors tau log2(e) for qs and 1 for ks, vs, dos (the same S and dP up to the rounding)."""
    q, k, v, do = inputs[:4]
    f8 = [x.astype(jnp.float8_e4m3fn) for x in (q, k, v, do)]
    ones = lambda x: jnp.ones((x.shape[0], x.shape[1], x.shape[2] // 32), jnp.float32)  # noqa: E731
    qs = ones(q) * np.float32(math.log2(math.e) / math.sqrt(h))
    return (*f8, qs, ones(k), ones(v), ones(do))


def kernel_inputs(shape, rng) -> tuple[jax.Array, ...]:
    """The kernel call's operands (q, k, v, do, lse, delta, lens) for `shape`, random from rng."""
    b, t, n, n_kv, h = shape["b"], shape["t"], shape["n"], shape["n_kv"], shape["h"]
    bf = jnp.bfloat16
    q = jnp.asarray(rng.standard_normal((b, n, t, h)), bf)
    k = jnp.asarray(rng.standard_normal((b, n_kv, t, h)), bf)
    v = jnp.asarray(rng.standard_normal((b, n_kv, t, h)), bf)
    do = jnp.asarray(rng.standard_normal((b, n, t, h)), bf)
    # a plausible LSE (log of the row sum of exp(S) for |S| ~ 1) and delta
    lse = jnp.asarray(np.full((b, n, t), math.log(t), np.float32))
    delta = jnp.asarray(rng.standard_normal((b, n, t)).astype(np.float32) * 0.1)
    lens = jnp.asarray(np.full((2, b), t, np.int32))
    return q, k, v, do, lse, delta, lens


def cudnn_fn(shape, rng):
    b, t, n, n_kv, h = shape["b"], shape["t"], shape["n"], shape["n_kv"], shape["h"]
    bf = jnp.bfloat16
    q = jnp.asarray(rng.standard_normal((b, t, n, h)), bf)
    k = jnp.asarray(rng.standard_normal((b, t, n_kv, h)), bf)
    v = jnp.asarray(rng.standard_normal((b, t, n_kv, h)), bf)
    ct = jnp.asarray(rng.standard_normal((b, t, n, h)), bf)

    def fwd(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=shape["causal"], implementation="cudnn")

    _, vjp = jax.vjp(fwd, q, k, v)
    return jax.jit(lambda f, c: f(c)), (vjp, ct)


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/h200_attention_bwd_kernel.json",
        time_budget=None,
        calls="calls per batch (default 10)",
        batches="batches (default 5)",
    )
    ap.add_argument("--profile", type=int, default=None, metavar="TUNE", help="run that tuning 4 times (ncu)")
    ap.add_argument("--causal", action="store_true", help="with --profile: the causal shape")
    ap.add_argument("--shape", type=int, default=None, help="with --profile: SHAPES index (overrides --causal)")
    ap.add_argument("--tunes", default=None, help="comma-separated tunings to time (default: all registered)")
    ap.add_argument("--shapes", default=None, help="comma-separated SHAPES indices, in this order (default: all)")
    ap.add_argument("--modes", default=None, help="dQ modes (MODES keys) to time, or 'none' (default: all)")
    args = harness.parse(ap, argv)
    harness.counts(args, calls=10, batches=5)
    shapes = SHAPES if args.shapes is None else [SHAPES[int(i)] for i in args.shapes.split(",")]
    tunes = TUNES if args.tunes is None else tuple(int(t) for t in args.tunes.split(","))
    modes = MODES if args.modes is None else {k: MODES[k] for k in args.modes.split(",") if k != "none"}
    library.load_library()
    rng = np.random.default_rng(0)
    if args.profile is not None:
        shape = SHAPES[args.shape if args.shape is not None else (1 if args.causal else 0)]
        fn, a = kernel_fn(shape, rng, args.profile)
        for _ in range(4):
            jax.block_until_ready(fn(*a))
        return 0
    rows = []
    meta = harness.metadata(args, kernels=True, flops="2.5 * 4 * B * N * T * S * H (/2 causal)")
    budget = harness.TimeBudget(args.time_budget)
    print(
        f"{'shape':34s} {'tune':>4s} {'kernel ms':>10s} {'TFLOP/s':>8s} {'cuDNN ms':>9s} {'TFLOP/s':>8s} {'ratio':>6s}"
    )
    for shape in shapes:
        flops = bwd_flops(**shape)
        row = dict(shape=shape, flops=flops)
        skip = budget.exceeded()
        if skip:
            rows.append(dict(row, skipped=skip))
            continue
        inputs = kernel_inputs(shape, rng)  # the same inputs for every tune and mode of this shape
        dq0 = None
        for tune in tunes:
            fn, a = kernel_fn(shape, rng, tune, inputs=inputs)
            if fn is not None:
                out = jax.block_until_ready(fn(*a))
                h, causal = shape["h"], shape["causal"]
                variant = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=causal, tune=tune)
                if dq0 is None and not variant.sdp_fp8:  # the dQ modes' same-math baseline
                    dq0 = np.asarray(out[0], np.float64)
                row[f"kernel_t{tune}_s"] = timeit(fn, a, args.calls, args.batches)
        timed = [(row[f"kernel_t{t}_s"], t) for t in tunes if f"kernel_t{t}_s" in row]
        if timed:
            row["kernel_s"], row["kernel_best_tune"] = min(timed)
        for key, mode in modes.items():
            fn, a = kernel_fn(shape, rng, 0, mode, inputs=inputs)
            if fn is not None:
                e = DQ_E if mode.get("dq_accum") == "fp16" else 0
                dq = np.asarray(jax.block_until_ready(fn(*a))[0], np.float64) * 2.0**-e
                row[f"kernel_{key}_s"] = timeit(fn, a, args.calls, args.batches)
                if dq0 is not None:
                    row[f"kernel_{key}_dq_db"] = sqnr_db(dq0, dq)
        try:
            fn, a = cudnn_fn(shape, rng)
            jax.block_until_ready(fn(*a))
            row["cudnn_s"] = timeit(fn, a, args.calls, args.batches)
        except Exception as e:  # noqa: BLE001 - recorded in the JSON
            row["cudnn_error"] = f"{type(e).__name__}: {e}"[:300]
        for key in ("kernel", "cudnn"):
            if f"{key}_s" in row:
                row[f"{key}_tflops"] = flops / row[f"{key}_s"] / 1e12
        name = "B{b} T{t} N{n} K{n_kv} H{h}{c}".format(**shape, c=" causal" if shape["causal"] else "")
        cs = row.get("cudnn_s", float("nan"))
        for tune in tunes:
            if f"kernel_t{tune}_s" not in row:
                continue  # not registered
            kt = row[f"kernel_t{tune}_s"]
            print(
                f"{name:34s} {tune:4d} {kt * 1e3:10.3f} {flops / kt / 1e12:8.1f} {cs * 1e3:9.3f} "
                f"{row.get('cudnn_tflops', float('nan')):8.1f} {cs / kt:6.2f}"
            )
        for key in modes:
            if f"kernel_{key}_s" in row:
                kt, db = row[f"kernel_{key}_s"], row.get(f"kernel_{key}_dq_db", float("nan"))
                print(
                    f"{name:34s} {key:>8s} {kt * 1e3:10.3f} {flops / kt / 1e12:8.1f} {cs * 1e3:9.3f} "
                    f"{row.get('cudnn_tflops', float('nan')):8.1f} {cs / kt:6.2f}  dq vs BF16 fp32 {db:.1f} dB"
                )
        rows.append(row)
        harness.write_json(args.out, meta, rows=rows)  # after every shape: a run cut short keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
