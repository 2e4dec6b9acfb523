#!/usr/bin/env python3
"""XLA MXFP8 attention reference on a GPU: forward and forward+backward TFLOP/s next to cuDNN BF16.

Same bf16 inputs for both: jax_mxfp8.dot_product_attention(implementation="xla") and
jax.nn.dot_product_attention(implementation="cudnn"). FLOPs: forward 4*B*N*T*S*H (half when causal),
forward+backward 3.5x forward. The backward is jax.grad of sum(O * W) with a random bf16 W for both (a
constant cotangent would let XLA constant-fold the dO quantization). Timing (benchmarks/harness.py):
enqueue --calls calls, block once, divide; median of --batches batches. Also records compile seconds,
the reference's compiled temp memory and, as a sanity check, SQNR of the reference against cuDNN.
JSON is rewritten after every case, so a run cut short still returns what it measured.

Usage: python benchmarks/attention_reference_h200.py [--out DIR] [--smoke]
  (--smoke, alias --tiny: B1 T256 N2 H64, 3 calls, for trying the script on CPU; cuDNN is skipped off-GPU)
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
import numpy as np
from harness import timeit

import jax_mxfp8 as mx


def sqnr(ref, x) -> float:
    ref, x = np.asarray(ref, np.float64), np.asarray(x, np.float64)
    if not np.all(np.isfinite(x)):
        return float("nan")
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - x) ** 2), 1e-300)))


def build(attn, causal):
    def fwd(q, k, v):
        return attn(q, k, v, causal)

    def loss(q, k, v, w):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def ours(q, k, v, causal):
    return mx.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")


def cudnn(q, k, v, causal):
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out=os.environ.get("OUT", "benchmarks/results"),
        out_help="folder for h200_attention_reference.json (default: $OUT if set, else benchmarks/results)",
        smoke="B1 T256 N2 H64, 3 calls (a CPU try of the script; numbers mean nothing)",
        smoke_aliases=("--tiny",),
        calls="calls per batch (default 30; 3 smoke)",
        batches="batches (default 3)",
    )
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--h", type=int, default=128)
    args = harness.parse(ap, argv)
    harness.counts(args, calls={"full": 30, "smoke": 3}, batches=3)
    if args.smoke:
        args.b, args.t, args.n, args.h = 1, 256, 2, 64
    b, t, n, h = args.b, args.t, args.n, args.h
    on_gpu = jax.default_backend() == "gpu"
    out_path = Path(args.out) / "h200_attention_reference.json"
    meta = harness.metadata(
        args,
        shape=dict(B=b, T=t, S=t, N=n, K=n, H=h, dtype="bfloat16"),
        flops="fwd 4*B*N*T*S*H (x0.5 causal); fwd+bwd 3.5 x fwd",
    )
    result = dict(cases=[])
    rng = np.random.default_rng(0)
    q, k, v, w = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16) for _ in range(4))
    impls = {"mxfp8_xla_reference": ours}
    if on_gpu:
        impls["cudnn_bf16"] = cudnn
    for causal in (False, True):
        fwd_flops = 4 * b * n * t * t * h * (0.5 if causal else 1.0)
        case = dict(causal=causal, fwd_flops=fwd_flops)
        outs = {}
        for name, attn in impls.items():
            try:
                fwd, fwd_bwd = build(attn, causal)
                start = time.perf_counter()
                cf = fwd.lower(q, k, v).compile()
                cb = fwd_bwd.lower(q, k, v, w).compile()
                compile_s = time.perf_counter() - start
                outs[name] = (np.asarray(cf(q, k, v), np.float32), [np.asarray(g, np.float32) for g in cb(q, k, v, w)])
                jax.block_until_ready(cb(q, k, v, w))
                tf = timeit(cf, (q, k, v), args.calls, args.batches)
                tb = timeit(cb, (q, k, v, w), args.calls, args.batches)
                entry = dict(
                    fwd_ms=tf * 1e3,
                    fwd_bwd_ms=tb * 1e3,
                    fwd_tflops=fwd_flops / tf / 1e12,
                    fwd_bwd_tflops=3.5 * fwd_flops / tb / 1e12,
                    compile_s=round(compile_s, 1),
                )
                mem = cb.memory_analysis()
                if mem is not None:
                    entry["fwd_bwd_temp_gib"] = mem.temp_size_in_bytes / 2**30
                case[name] = entry
            except Exception as e:  # keep going: record the failure in the JSON
                traceback.print_exc()
                case[name] = dict(error=repr(e)[:500])
            print(f"causal={causal} {name}: {case[name]}", flush=True)
            result["cases"] = [c for c in result["cases"] if c["causal"] != causal] + [case]
            harness.write_json(out_path, meta, **result)
        if len(outs) == 2:
            (o1, g1), (o2, g2) = outs["mxfp8_xla_reference"], outs["cudnn_bf16"]
            case["sqnr_reference_vs_cudnn_db"] = dict(
                O=sqnr(o2, o1), dQ=sqnr(g2[0], g1[0]), dK=sqnr(g2[1], g1[1]), dV=sqnr(g2[2], g1[2])
            )
            print(f"causal={causal} SQNR reference vs cuDNN bf16: {case['sqnr_reference_vs_cudnn_db']}", flush=True)
        harness.write_json(out_path, meta, **result)

    print(f"\n{'case':8s} {'impl':22s} {'fwd TFLOP/s':>12s} {'fwd+bwd TFLOP/s':>16s} {'fwd ms':>9s} {'f+b ms':>9s}")
    for case in result["cases"]:
        for name in impls:
            e = case.get(name, {})
            if "fwd_tflops" in e:
                print(
                    f"{'causal' if case['causal'] else 'full':8s} {name:22s} {e['fwd_tflops']:12.1f}"
                    f" {e['fwd_bwd_tflops']:16.1f} {e['fwd_ms']:9.2f} {e['fwd_bwd_ms']:9.2f}"
                )
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
