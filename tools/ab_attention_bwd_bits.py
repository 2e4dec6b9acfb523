#!/usr/bin/env python3
"""Bit-for-bit A/B of the attention backward kernels of two library builds, on the GPU (the runtime side of
tools/compare_sass.py, for kernel changes that must not change results).

    python tools/ab_attention_bwd_bits.py dump OUT.npz        run from the root of each tree (its jax_mxfp8 and
                                                              jax_mxfp8/_lib are the ones imported)
    python tools/ab_attention_bwd_bits.py compare A.npz B.npz

`dump` computes dq, dk, dv (jax.grad of sum(o * ct), implementation="cuda") of fixed-seed inputs: causal and
non-causal dense batches at H128 and H64, GQA with per-batch lengths, the deterministic dQ mode, cotangents
scaled by 2^-118 and 2^-124 (dS block scales in the subnormal range), a NaN cotangent block, and packed
jagged batches through varlen_attention (causal and not). `compare` prints per array whether the bits are
equal and the SQNR, and fails (exit 1) when dk, dv or any deterministic-mode array differs: those are
computed in a fixed order by each CTA; dq of the default mode is summed by atomics in a run-dependent order.
AB_IMPL=xla AB_SMALL=1 runs the same cases small on the XLA reference (a CPU smoke run of the script).
"""

import argparse
import os
import sys
import zlib

import numpy as np

from jax_mxfp8.metrics import sqnr_db

IMPL = os.environ.get("AB_IMPL", "cuda")
SMALL = os.environ.get("AB_SMALL") == "1"
DETERMINISTIC = "meta:deterministic_cases"
"""The dump's entry naming the cases run in the deterministic dQ mode (their dq must be bitwise equal too)."""


def cases():
    import jax
    import jax.numpy as jnp

    import jax_mxfp8 as jm
    from jax_mxfp8 import AttentionConfig

    out = {}

    det_cases = []

    def grads(name, b, t, n, kh, h, causal, det, ct_scale=1.0, nan_block=False, lens=None):
        if det:
            det_cases.append(name)
        if SMALL:
            b, t = 1, 256
            lens = None if lens is None else [256, 160]
            b = 2 if lens else 1
        key = jax.random.PRNGKey(zlib.crc32(name.encode()))
        kq, kk, kv, kc = jax.random.split(key, 4)
        q = jax.random.normal(kq, (b, t, n, h), jnp.bfloat16)
        k = jax.random.normal(kk, (b, t, kh, h), jnp.bfloat16)
        v = jax.random.normal(kv, (b, t, kh, h), jnp.bfloat16)
        ct = jax.random.normal(kc, (b, t, n, h), jnp.float32) * ct_scale
        if nan_block:
            ct = ct.at[0, 64:96, 0, 0:32].set(jnp.nan)
        ct = ct.astype(jnp.bfloat16)
        cfg = AttentionConfig(deterministic=det)
        kw = {}
        if lens is not None:
            kw = dict(query_seq_lengths=jnp.array(lens, jnp.int32), key_value_seq_lengths=jnp.array(lens, jnp.int32))

        def f(q, k, v):
            o = jm.dot_product_attention(q, k, v, is_causal=causal, implementation=IMPL, config=cfg, **kw)
            return jnp.sum(o.astype(jnp.float32) * ct.astype(jnp.float32))

        g = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)
        for nm, x in zip(("dq", "dk", "dv"), g):
            out[f"{name}:{nm}"] = np.asarray(x.astype(jnp.float32))

    grads("causal_b2t4k_det", 2, 4096, 16, 16, 128, True, True)
    grads("causal_b2t4k", 2, 4096, 16, 16, 128, True, False)
    grads("causal_gqa_lens", 2, 8000, 6, 3, 128, True, True, lens=[8000, 5000])
    grads("noncausal_b2t2k_det", 2, 2048, 8, 8, 128, False, True)
    grads("noncausal_h64", 2, 2048, 8, 8, 64, False, True)
    grads("causal_h64", 2, 2048, 8, 8, 64, True, True)
    grads("tiny_ds_det", 1, 1024, 4, 4, 128, False, True, ct_scale=2.0**-118)
    grads("tinier_ds_det", 1, 1024, 4, 4, 128, True, True, ct_scale=2.0**-124)
    grads("nan_block_det", 1, 1024, 4, 4, 128, False, True, nan_block=True)

    # packed (varlen) causal and non-causal
    seqs = [70, 129, 200] if SMALL else [700, 2048, 129, 1500, 3000]
    cu = np.concatenate([[0], np.cumsum(seqs)]).astype(np.int32)
    tot = int(cu[-1])
    for causal in (True, False):
        key = jax.random.PRNGKey(7 + causal)
        kq, kk, kv, kc = jax.random.split(key, 4)
        q = jax.random.normal(kq, (tot, 8, 128), jnp.bfloat16)
        k = jax.random.normal(kk, (tot, 4, 128), jnp.bfloat16)
        v = jax.random.normal(kv, (tot, 4, 128), jnp.bfloat16)
        ct = jax.random.normal(kc, (tot, 8, 128), jnp.bfloat16)

        def fv(q, k, v, causal=causal, ct=ct):
            o = jm.varlen_attention(
                q,
                k,
                v,
                jnp.asarray(cu),
                jnp.asarray(cu),
                max_seqlen_q=max(seqs),
                max_seqlen_k=max(seqs),
                is_causal=causal,
                implementation=IMPL,
            )
            return jnp.sum(o.astype(jnp.float32) * ct.astype(jnp.float32))

        g = jax.jit(jax.grad(fv, argnums=(0, 1, 2)))(q, k, v)
        for nm, x in zip(("dq", "dk", "dv"), g):
            out[f"varlen_{'causal' if causal else 'full'}:{nm}"] = np.asarray(x.astype(jnp.float32))
    out[DETERMINISTIC] = np.array(det_cases)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("dump", help="compute the cases with this tree's library").add_argument("out", help="OUT.npz")
    cmp = sub.add_parser("compare", help="compare two dumps")
    cmp.add_argument("a", help="A.npz")
    cmp.add_argument("b", help="B.npz")
    args = ap.parse_args()
    if args.cmd == "dump":
        np.savez(args.out, **cases())
        return
    a, b = np.load(args.a), np.load(args.b)
    det = set(a[DETERMINISTIC].tolist()) if DETERMINISTIC in a.files else set()
    bad = 0
    for k in sorted(f for f in a.files if f != DETERMINISTIC):
        x, y = a[k], b[k]
        same = np.array_equal(x.view(np.uint32), y.view(np.uint32))
        sqnr = sqnr_db(np.nan_to_num(x), np.nan_to_num(y))  # NaN positions (counted below) compare as 0
        nan = int(np.isnan(x).sum()), int(np.isnan(y).sum())
        print(f"{k:28s} bitwise={same!s:5s} sqnr={sqnr:8.1f} dB nan={nan} absmax={np.nanmax(np.abs(x)):.3e}")
        must = ":dk" in k or ":dv" in k or "_det" in k or k.split(":")[0] in det
        bad += must and not same
    print("A/B bit check:", "PASS" if not bad else f"FAIL ({bad} arrays that must be bitwise equal differ)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
