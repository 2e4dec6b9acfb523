"""Runs the Hopper attention kernel alone a few times on fixed prepared operands, for Nsight Compute.

  ncu --clock-control none -k regex:attention_fwd --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
      python benchmarks/profile_attention_kernel.py --tune 2

(B, T, N, H) = (4, 4096, 16, 128) by default, non-causal; the producer pass runs once before.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8 as mx
from jax_mxfp8.primitives import attention_fwd as kern


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="4,4096,16,128", help="B,T,N,H")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--tune", type=int, default=0)
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    b, t, n, h = (int(x) for x in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = [jnp.asarray(rng.standard_normal((b, n, t, h)), jnp.bfloat16) for _ in range(3)]
    q, k, v = (mx.quantize(y, axis=(-2, -1), block="square") for y in x)
    ops = jax.block_until_ready(
        jax.jit(functools.partial(kern.prepare, scale=h**-0.5, q_len=None, kv_len=None))(q, k, v)
    )
    f = jax.jit(functools.partial(kern.attention_fwd, causal=args.causal, t=t, tune=args.tune))
    for _ in range(args.runs):
        jax.block_until_ready(f(ops))
    print(f"ran the kernel {args.runs} times (tune={args.tune}, B{b} T{t} N{n} H{h}, causal={args.causal})")


if __name__ == "__main__":
    main()
