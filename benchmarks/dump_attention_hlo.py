"""Writes the optimized HLO of one attention forward+backward (ours, kernel path) and lists its fusions' roots.

The fusion names in a profile (benchmarks/profile_attention_step.py: loop_convert_fusion_3, ...) are XLA's
instruction names; this prints, for each fusion of the compiled module, its name, result shape and the ops
inside it, so that the glue between our kernels can be attributed to the code that produced it.

Run (GPU): python benchmarks/dump_attention_hlo.py --out $OUT/attention_fwd_bwd.hlo.txt
"""

from __future__ import annotations

import re
import sys

import harness
import jax
import jax.numpy as jnp

import jax_mxfp8 as mx


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="attention_fwd_bwd.hlo.txt",
        out_help="the optimized HLO text (default attention_fwd_bwd.hlo.txt at the repository root)",
    )
    ap.add_argument("--shape", default="4,4096,16,128", help="B,T,N,H")
    ap.add_argument("--causal", action="store_true")
    args = harness.parse(ap, argv)
    b, t, n, h = (int(x) for x in args.shape.split(","))
    x = jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16)

    def attention(q, k, v):
        return mx.dot_product_attention(q, k, v, is_causal=args.causal, implementation="cuda")

    f = jax.jit(lambda q, k, v, ct: jax.vjp(attention, q, k, v)[1](ct))
    text = f.lower(x, x, x, x).compile().as_text()
    with open(args.out, "w") as fh:
        fh.write(text)
    # "%name = type fusion(...), kind=kLoop, calls=%fused_computation..." lines of the entry computation
    for m in re.finditer(r"^\s*(?:ROOT )?%(\S+) = (\S+) fusion\(.*?calls=%(\S+?)[,\s]", text, re.M):
        name, shape, comp = m.groups()
        body = re.search(rf"^%{re.escape(comp)} .*?\n}}", text, re.M | re.S)
        ops = sorted(set(re.findall(r"= \S+ ([a-z\-]+)\(", body.group(0)))) if body else []
        print(f"{name:40s} {shape:60s} {' '.join(ops)[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
