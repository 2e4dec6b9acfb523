"""Quantize real data to MXFP8, multiply with mx_dot_general, and print the SQNR against float64.

Run: python examples/quickstart.py [--m 1024 --k 4096 --n 1024]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8
from jax_mxfp8.metrics import sqnr_db


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--m", type=int, default=1024)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    ka, kb = jax.random.split(jax.random.key(args.seed))
    a = jax.random.normal(ka, (args.m, args.k), jnp.float32)
    b = jax.random.normal(kb, (args.k, args.n), jnp.float32)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)

    qa = jax_mxfp8.quantize(a, axis=-1)
    print(f"quantized a: {qa}; scale bytes in [{int(qa.scale.min())}, {int(qa.scale.max())}]")
    print(f"SQNR of dequantize(quantize(a)) vs a: {sqnr_db(a, jax_mxfp8.dequantize(qa)):.2f} dB")

    dn = (((1,), (0,)), ((), ()))
    mx = jax.jit(lambda a, b: jax_mxfp8.mx_dot_general(a, b, dn, preferred_element_type=jnp.float32))
    bf16 = jax.jit(
        lambda a, b: jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    )
    for name, f in (("mxfp8 mx_dot_general", mx), ("bf16 dot", bf16)):
        t0 = time.perf_counter()
        out = jax.block_until_ready(f(a, b))
        dt = time.perf_counter() - t0
        shape = f"({args.m}x{args.k})@({args.k}x{args.n})"
        print(f"{name:22s} {shape}: SQNR vs float64 {sqnr_db(exact, out):6.2f} dB  ({dt:.2f} s incl. compile)")


if __name__ == "__main__":
    main()
