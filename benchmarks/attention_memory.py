#!/usr/bin/env python3
"""Compiled memory of the MXFP8 attention reference: temp buffers grow linearly in sequence length.

For each T = S in --lengths (B=1, N=8, H=128, bf16, causal and not) compiles the forward and the
forward+backward (jax.value_and_grad of sum(O * W) with a random W: a constant cotangent would be
constant-folded by XLA) and reports `memory_analysis()` sizes. With --run T it also executes the
forward+backward at that length once and reports the wall time.

Usage: python benchmarks/attention_memory.py [--lengths 8192 32768] [--run 32768] [--out FILE]
"""

from __future__ import annotations

import time

import harness
import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8 as mx

N, H = 8, 128
GIB = 2.0**30


def fns(causal):
    def fwd(q, k, v):
        return mx.dot_product_attention(q, k, v, is_causal=causal)

    def loss(q, k, v, w):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * w)

    return jax.jit(fwd), jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def sizes(compiled):
    m = compiled.memory_analysis()
    return dict(
        temp_gib=m.temp_size_in_bytes / GIB,
        argument_gib=m.argument_size_in_bytes / GIB,
        output_gib=m.output_size_in_bytes / GIB,
    )


def main(argv=None) -> int:
    ap = harness.parser(__doc__, __file__, out="benchmarks/results/attention_memory.json")
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--run", type=int, default=0, help="also execute fwd+bwd (causal) at this length")
    args = harness.parse(ap, argv)

    rows = []
    for t in args.lengths:
        sd = jax.ShapeDtypeStruct((1, t, N, H), jnp.bfloat16)
        for causal in (False, True):
            fwd, fwd_bwd = fns(causal)
            start = time.perf_counter()
            row = dict(T=t, S=t, causal=causal)
            row["fwd"] = sizes(fwd.lower(sd, sd, sd).compile())
            row["fwd_bwd"] = sizes(fwd_bwd.lower(sd, sd, sd, sd).compile())
            row["compile_seconds"] = round(time.perf_counter() - start, 1)
            # What a materialised float32 T x S score matrix alone would take, for scale.
            row["dense_scores_f32_gib"] = N * t * t * 4 / GIB
            rows.append(row)
            print(
                f"T=S={t:6d} {'causal' if causal else 'full  '}  fwd temp {row['fwd']['temp_gib']:.3f} GiB"
                f"  fwd+bwd temp {row['fwd_bwd']['temp_gib']:.3f} GiB  (args {row['fwd_bwd']['argument_gib']:.3f},"
                f" outputs {row['fwd_bwd']['output_gib']:.3f}; a dense f32 T x S would be"
                f" {row['dense_scores_f32_gib']:.0f} GiB)",
                flush=True,
            )
    run = None
    if args.run:
        t = args.run
        rng = np.random.default_rng(0)
        q, k, v, w = (jnp.asarray(rng.standard_normal((1, t, N, H)), jnp.bfloat16) for _ in range(4))
        _, fwd_bwd = fns(True)
        compiled = fwd_bwd.lower(q, k, v, w).compile()
        start = time.perf_counter()
        loss, grads = compiled(q, k, v, w)
        jax.block_until_ready(grads)
        secs = time.perf_counter() - start
        finite = bool(np.isfinite(float(loss))) and all(
            bool(jnp.all(jnp.isfinite(g.astype(jnp.float32)))) for g in grads
        )
        run = dict(T=t, causal=True, seconds=round(secs, 1), finite=finite)
        print(f"ran causal fwd+bwd at T=S={t}: {secs:.1f} s, finite={finite}")

    meta = harness.metadata(args, shape=dict(B=1, N=N, K=N, H=H, dtype="bfloat16"))
    harness.write_json(args.out, meta, rows=rows, run=run)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
