#!/usr/bin/env python3
"""Agreement of ring attention (8 CPU devices) with single-device MXFP8 attention and float64 attention.

For each AttentionConfig option and masking (non-causal; causal with the zigzag load balance; causal with
contiguous chunks): SQNR (dB) of the ring's O, LSE, dQ, dK, dV against the single-device
`jax_mxfp8.dot_product_attention`, and the SQNR of both against float64 unquantized attention (loss
sum(O * dO), q, k, v, dO ~ N(0, 1); GQA with N = 4 query heads on K = 2 KV heads).

Usage: python benchmarks/ring_attention_sqnr.py [--t 1024] [--h 64] [--seeds 2] [--out FILE]
Prints a table and writes JSON (default benchmarks/results/ring_attention_sqnr.json).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import sys  # noqa: E402
import time  # noqa: E402

import harness  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(harness.ROOT))  # the tests package: its float64 attention oracle

import jax_mxfp8 as mx  # noqa: E402
from jax_mxfp8.metrics import sqnr_db  # noqa: E402
from jax_mxfp8.parallel import ring_attention  # noqa: E402
from tests.attention.attention_oracle import exact_attention  # noqa: E402

CONFIGS = {
    "default": {},
    "qkv_blocks=row": dict(qkv_blocks="row"),
    "p_scale=block": dict(p_scale="block"),
    "dq_accum=fp16": dict(dq_accum="fp16"),
    "causal_safe": dict(causal_safe=True),
}
MASKINGS = {"non-causal": (False, True), "causal zigzag": (True, True), "causal contiguous": (True, False)}
NAMES = ("o", "lse", "dq", "dk", "dv")


def fwd_bwd(f, do):
    def run(q, k, v):
        (o, lse), vjp = jax.vjp(f, q, k, v)
        return (o, lse, *vjp((do, jnp.zeros_like(lse))))

    return jax.jit(run)


def main(argv=None) -> int:
    ap = harness.parser(__doc__, __file__, out="benchmarks/results/ring_attention_sqnr.json")
    ap.add_argument("--t", type=int, default=1024)
    ap.add_argument("--h", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS))
    args = harness.parse(ap, argv)
    mesh = jax.make_mesh((8,), ("seq",), axis_types=(jax.sharding.AxisType.Auto,))
    shape_q, shape_kv = (1, args.t, 4, args.h), (1, args.t, 2, args.h)
    rows = []
    for cname in args.configs:
        config = mx.AttentionConfig(**CONFIGS[cname])
        for mname, (causal, balance) in MASKINGS.items():
            acc = {}
            t0 = time.time()
            for seed in range(args.seeds):
                rng = np.random.default_rng(seed)
                q, do = (rng.standard_normal(shape_q).astype(np.float32) for _ in range(2))
                k, v = (rng.standard_normal(shape_kv).astype(np.float32) for _ in range(2))

                def ring(q, k, v, causal=causal, balance=balance, config=config):
                    return ring_attention(
                        q,
                        k,
                        v,
                        mesh=mesh,
                        axis_name="seq",
                        is_causal=causal,
                        load_balance=balance,
                        config=config,
                        return_residual=True,
                    )

                def single(q, k, v, causal=causal, config=config):
                    return mx.dot_product_attention(q, k, v, is_causal=causal, config=config, return_residual="lse")

                r = [np.asarray(x, np.float64) for x in fwd_bwd(ring, do)(q, k, v)]
                s = [np.asarray(x, np.float64) for x in fwd_bwd(single, do)(q, k, v)]
                e = exact_attention(q, k, v, do, causal=causal)
                for name, a, b, c in zip(NAMES, r, s, e, strict=True):
                    for key, val in (
                        ("ring_vs_single", sqnr_db(b, a)),
                        ("ring_vs_f64", sqnr_db(c, a)),
                        ("single_vs_f64", sqnr_db(c, b)),
                    ):
                        acc.setdefault((name, key), []).append(val)
            row = {"config": cname, "masking": mname}
            row.update({f"{name}:{key}": float(np.min(v)) for (name, key), v in acc.items()})
            rows.append(row)
            print(
                f"{cname:15s} {mname:18s} ({time.time() - t0:4.1f}s)  ring vs single (min over seeds): "
                + "  ".join(f"{n} {row[f'{n}:ring_vs_single']:.1f}" for n in NAMES)
                + " | vs f64 ring/single: "
                + "  ".join(
                    f"{n} {row[f'{n}:ring_vs_f64']:.2f}/{row[f'{n}:single_vs_f64']:.2f}"
                    for n in ("o", "dq", "dk", "dv")
                ),
                flush=True,
            )
    meta = harness.metadata(args, t=args.t, h=args.h, heads=[4, 2], seeds=args.seeds, devices=8)
    harness.write_json(args.out, meta, rows=rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
