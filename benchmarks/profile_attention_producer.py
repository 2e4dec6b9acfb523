#!/usr/bin/env python3
"""Where the Hopper attention forward's end-to-end time goes: each stage of the producer pass timed alone.

  python benchmarks/profile_attention_producer.py [--shape B,T,N,H] [--out FILE.json]

Stages (each jitted on its own; timing rule of benchmarks/harness.py), bf16 BTNH inputs:
  quantize_seq_major   the three square MX quantizations of the kernel path (the CUDA kernel on the
                       (B*T, N*H) view of the caller's layout; ops.attention_core.square_sequence_major)
  quantize_head_major  the former path: bf16 transpose to (B, N, T, H), then the same kernel
  prepare_seq_major    primitives.attention_fwd.prepare_sequence_major, as ops.attention_core runs it (exponents
                       in XLA, the realign kernel for the FP8 re-encode + transposes + V'^T permutation)
  prepare_head_major   the XLA formulation (prepare) on head-major MXArrays
  realign_kernel_q/v   the realign kernel alone on Q / V (zero shifts)
  align_q/v_xla        prepare's XLA Q re-encode alone / V re-encode + transpose alone (head-major input)
  kernel               the attention kernel alone on prepared operands (it writes O in BTNH)
  e2e                  jax_mxfp8.dot_product_attention(..., implementation="cuda") forward
Needs the kernel library and an sm_90 GPU (prints why not otherwise).
"""

from __future__ import annotations

import functools
import sys

import harness
import jax
import jax.numpy as jnp
from harness import timeit

import jax_mxfp8 as mx
from jax_mxfp8.ops import attention_core as attn_ops
from jax_mxfp8.primitives import attention_fwd as afwd
from jax_mxfp8.primitives import attention_operands as operands
from jax_mxfp8.primitives import attention_realign as realign_call
from jax_mxfp8.primitives import library


def stages(b: int, t: int, n: int, h: int, causal: bool) -> dict:
    """name -> (fn, args) for every stage; inputs drawn once."""
    key = jax.random.key(0)
    q, k, v = (jax.random.normal(jax.random.fold_in(key, i), (b, t, n, h), jnp.bfloat16) for i in range(3))
    scale = h**-0.5

    def seq_major(x):
        return attn_ops.square_sequence_major(x, None, "up")

    def head_major(x):
        return mx.quantize(x.transpose(0, 2, 1, 3), axis=(-2, -1), block="square")

    def prep_seq(qa, ka, va):
        return operands.prepare_sequence_major(qa, ka, va, scale=scale, q_len=None, kv_len=None)

    def prep_hm(qa, ka, va):
        return operands.prepare(qa, ka, va, scale=scale, q_len=None, kv_len=None)

    sq = jax.block_until_ready(jax.jit(lambda *a: tuple(seq_major(x) for x in a))(q, k, v))
    hm = jax.block_until_ready(jax.jit(lambda *a: tuple(head_major(x) for x in a))(q, k, v))
    ops = jax.block_until_ready(jax.jit(prep_seq)(*sq))
    zero_shift = jnp.zeros((b, t // 32, n, h // 32), jnp.int8)
    return {
        "quantize_seq_major": (lambda *a: tuple(seq_major(x) for x in a), (q, k, v)),
        "quantize_head_major": (lambda *a: tuple(head_major(x) for x in a), (q, k, v)),
        "prepare_seq_major": (prep_seq, sq),
        "prepare_head_major": (prep_hm, hm),
        "realign_kernel_q": (lambda d, sh: realign_call.realign(d, sh, "rows", "cuda"), (sq[0].data, zero_shift)),
        "realign_kernel_v": (lambda d, sh: realign_call.realign(d, sh, "v", "cuda"), (sq[2].data, zero_shift)),
        "align_q_xla": (lambda a: operands.align_rows(a.data, a.scale), (hm[0],)),
        "align_v_xla": (lambda a: operands.align_v(a.data, a.scale), (hm[2],)),
        "kernel": (functools.partial(afwd.attention_fwd, causal=causal, t=t), (ops,)),
        "e2e": (
            lambda q, k, v: mx.dot_product_attention(q, k, v, is_causal=causal, implementation="cuda"),
            (q, k, v),
        ),
    }


def main(argv=None) -> int:
    ap = harness.parser(__doc__, __file__, calls="calls per batch (default 30)", batches="batches (default 3)")
    ap.add_argument("--out", default=None, help="JSON results (default: none written)")
    ap.add_argument("--shape", default="4,4096,16,128", help="B,T,N,H")
    ap.add_argument("--causal", action="store_true")
    args = harness.parse(ap, argv)
    harness.counts(args, calls=30, batches=3)
    ok, why = library.kernels_runnable(afwd.ARCHS)
    if not ok:
        print(f"cannot run: {why}")
        return 1
    b, t, n, h = (int(x) for x in args.shape.split(","))
    rows = {}
    for name, (fn, fargs) in stages(b, t, n, h, args.causal).items():
        f = jax.jit(fn)
        jax.block_until_ready(f(*fargs))
        rows[name] = timeit(f, fargs, args.calls, args.batches) * 1e3
        print(f"{name:20s} {rows[name]:8.3f} ms", flush=True)
    rows["producer_seq_major"] = rows["quantize_seq_major"] + rows["prepare_seq_major"]
    rows["producer_head_major"] = rows["quantize_head_major"] + rows["prepare_head_major"]
    print(
        f"\nB{b} T{t} N{n} H{h} causal={args.causal}: producer (sum of stages) sequence-major "
        f"{rows['producer_seq_major']:.3f} ms, head-major {rows['producer_head_major']:.3f} ms; "
        f"e2e {rows['e2e']:.3f} ms = kernel {rows['kernel']:.3f} + rest {rows['e2e'] - rows['kernel']:.3f}"
    )
    if args.out:
        meta = harness.metadata(args, kernels=afwd.ARCHS, shape=dict(b=b, t=t, n=n, h=h, causal=args.causal))
        harness.write_json(args.out, meta, ms=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
