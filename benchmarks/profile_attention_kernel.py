"""Runs the Hopper attention forward kernel alone a few times on fixed prepared operands, for Nsight Compute.

  ncu --clock-control none -k regex:attention_fwd --launch-skip 2 --launch-count 1 \\
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
      python benchmarks/profile_attention_kernel.py --tune 1

(B, T, N, H) = (4, 4096, 16, 128) by default, non-causal. The operands are made once before the runs:
jax_mxfp8.quantize in square blocks of head-major bf16 N(0, 1) inputs, then the producer pass
(primitives.attention_operands.prepare). --tune picks a comparison schedule (in the library when built with
tools/build_library.py --with-tunes). --smoke runs a tiny shape through the kernel's emulation (path
"emulated") on any backend: a CPU check of the script, nothing to profile.
"""

from __future__ import annotations

import functools

import harness
import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8 as mx
from jax_mxfp8.primitives import attention_fwd as kern
from jax_mxfp8.primitives import attention_operands as operands


def main(argv=None) -> int:
    ap = harness.parser(__doc__, __file__, smoke="B1 T128 N2 H64 through the emulation (path 'emulated')")
    ap.add_argument("--shape", default="4,4096,16,128", help="B,T,N,H")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--tune", type=int, default=0)
    ap.add_argument("--runs", type=int, default=4)
    args = harness.parse(ap, argv)
    b, t, n, h = (1, 128, 2, 64) if args.smoke else (int(x) for x in args.shape.split(","))
    path = "emulated" if args.smoke else "cuda"
    rng = np.random.default_rng(0)
    x = [jnp.asarray(rng.standard_normal((b, n, t, h)), jnp.bfloat16) for _ in range(3)]
    q, k, v = (mx.quantize(y, axis=(-2, -1), block="square") for y in x)
    prepare = functools.partial(operands.prepare, scale=h**-0.5, q_len=None, kv_len=None)
    ops = jax.block_until_ready(jax.jit(prepare)(q, k, v))
    f = jax.jit(functools.partial(kern.attention_fwd, causal=args.causal, t=t, tune=args.tune, path=path))
    for _ in range(args.runs):
        jax.block_until_ready(f(ops))
    print(f"ran the kernel {args.runs} times (tune={args.tune}, B{b} T{t} N{n} H{h}, causal={args.causal}, {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
