"""broadcast_query_attention vs the tiled query (varlen_attention on q tiled B times), forward and forward+backward.

The recommender's case: one candidate query sequence (Tq rows) against B user histories packed
with cu_seqlens_k. Both run on the kernel path ("cuda"; --smoke: tiny shapes on the XLA path, numbers mean
nothing). The tiled baseline tiles the query inside the timed function, as a caller would. Backward timed
with a random cotangent (timing rule: benchmarks/harness.py). Prints a table, writes JSON with --out.

  python benchmarks/broadcast_attention.py [--smoke] [--kernel-bwd] [--out results.json] [--time-budget S]

--kernel-bwd: also the backward kernel call alone (broadcast_q variant vs production on the tiled query,
same operands) and XLA's sum over B of a per-row float32 dq, to split the op's backward time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
import numpy as np
from harness import timeit

import jax_mxfp8 as mx

SHAPES = (  # (B histories, history lengths U[lo, hi], Tq candidates, N, K, H)
    (64, (512, 4096), 256, 4, 4, 128),
    (256, (128, 1024), 64, 8, 2, 128),
    (32, (1024, 8192), 512, 4, 4, 64),
)
SMOKE = ((3, (40, 130), 40, 2, 1, 64),)


def _inputs(rng, b, lens_range, tq, n, n_kv, h):
    lens = rng.integers(lens_range[0], lens_range[1] + 1, size=b)
    tk = int(lens.sum())
    q = jnp.asarray(rng.standard_normal((tq, n, h)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((tk, n_kv, h)), jnp.bfloat16) for _ in range(2))
    do = jnp.asarray(rng.standard_normal((b, tq, n, h)), jnp.bfloat16)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    return q, k, v, do, cu_k, int(lens.max()), lens


def _fns(impl: str, b: int, tq: int, max_k: int):
    cu_q = jnp.arange(b + 1, dtype=jnp.int32) * tq

    def broadcast(q, k, v, cu_k):
        return mx.broadcast_query_attention(q, k, v, cu_k, max_seqlen_k=max_k, implementation=impl)

    def tiled(q, k, v, cu_k):
        o = mx.varlen_attention(
            jnp.tile(q, (b, 1, 1)), k, v, cu_q, cu_k, max_seqlen_q=tq, max_seqlen_k=max_k, implementation=impl
        )
        return o.reshape(b, tq, *q.shape[1:])

    def with_bwd(f):
        def run(q, k, v, do, cu_k):
            o, vjp = jax.vjp(lambda q, k, v: f(q, k, v, cu_k), q, k, v)
            return o, vjp(do)

        return jax.jit(run)

    fwd = {"broadcast": jax.jit(broadcast), "tiled": jax.jit(tiled)}
    fb = {"broadcast": with_bwd(broadcast), "tiled": with_bwd(tiled)}
    return fwd, fb


def _kernel_bwd_row(rng, b, lens, tq, n, n_kv, h, calls, batches) -> dict:
    """The backward kernel call alone on the padded batch (operand values random, lengths the shape's): the
    broadcast_q variant (q (1, N, Tp, H), dq summed over the batch in the kernel) vs the production variant
    on the tiled q (dq per row), and XLA's sum over B of such a per-row float32 dq (what the in-kernel sum
    removes from the op's backward)."""
    from jax_mxfp8.primitives import attention_bwd as abwd
    from jax_mxfp8.primitives import library

    tp, sp = -(-tq // 128) * 128, -(-int(lens.max()) // 128) * 128
    bf = lambda shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    lse = jnp.asarray(rng.standard_normal((b, n, tp)) + np.log(sp), jnp.float32)
    lens2 = jnp.stack([jnp.full((b,), tq, jnp.int32), jnp.asarray(lens, jnp.int32)])
    ops = abwd.BwdOperands(bf((1, n, tp, h)), bf((b, n_kv, sp, h)), bf((b, n_kv, sp, h)), bf((b, n, tp, h)), lse,
                           jnp.asarray(rng.standard_normal((b, n, tp)), jnp.float32), lens2)  # fmt: skip
    tiled = abwd.BwdOperands(jnp.broadcast_to(ops.q, (b, n, tp, h)) + 0, *ops.args()[1:])
    row = {}
    # the tiled query on the broadcast variants' BF16-wgmma schedule (tune 17; production's sdp_fp8 would need
    # the FP8 copies, which these random operands do not have)
    for name, bq, x in (("bcast", True, ops), ("tiled", False, tiled)):
        var, why = abwd.kernel_variant(head_dim=h, causal=False, broadcast_q=bq, tune=0 if bq else 17)
        assert var is not None, why
        if not library.has_kernel(var.name):
            print(f"{var.name} is not in the library (tools/build_library.py --with-tunes): not timed")
            continue
        f = jax.jit(lambda ops, var=var: abwd.attention_bwd(ops, variant=var, scale=h**-0.5))
        jax.block_until_ready(f(x))
        row[f"kernel_bwd_{name}_ms"] = 1e3 * timeit(f, (x,), calls, batches)
    dq_rows = jnp.zeros((b, n, tp, h), jnp.float32) + 1.0
    total = jax.jit(lambda d: jnp.sum(d, axis=0, keepdims=True))
    jax.block_until_ready(total(dq_rows))
    row["xla_dq_sum_ms"] = 1e3 * timeit(total, (dq_rows,), calls, batches)
    return row


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        smoke="tiny shapes on the XLA path (CPU plumbing check)",
        time_budget=None,
        calls="calls per batch (default 10; 1 smoke)",
        batches="batches (default 5; 1 smoke)",
    )
    ap.add_argument("--out", type=Path, default=None, help="JSON results (default: none written)")
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="run only the first N shapes")
    ap.add_argument("--kernel-bwd", action="store_true", help="also time the backward kernel calls alone (GPU)")
    args = harness.parse(ap, argv)
    harness.counts(args, calls={"full": 10, "smoke": 1}, batches={"full": 5, "smoke": 1})
    impl = "xla" if args.smoke else "cuda"
    calls, batches = args.calls, args.batches
    meta = harness.metadata(args, kernels=not args.smoke, implementation=impl, unit="ms")
    budget = harness.TimeBudget(args.time_budget)
    rng = np.random.default_rng(0)
    rows = []
    for b, lens_range, tq, n, n_kv, h in SMOKE if args.smoke else SHAPES[: args.shapes]:
        if budget.exceeded():
            print(f"B{b} Tq{tq}: skipped ({budget.exceeded()})")
            continue
        q, k, v, do, cu_k, max_k, lens = _inputs(rng, b, lens_range, tq, n, n_kv, h)
        fwd, fb = _fns(impl, b, tq, max_k)
        row = dict(b=b, lens_range=list(lens_range), tq=tq, n=n, n_kv=n_kv, h=h, tokens_k=int(lens.sum()))
        for name in ("broadcast", "tiled"):
            jax.block_until_ready((fwd[name](q, k, v, cu_k), fb[name](q, k, v, do, cu_k)))  # compile first
            row[f"{name}_fwd_ms"] = 1e3 * timeit(fwd[name], (q, k, v, cu_k), calls, batches)
            row[f"{name}_fwd_bwd_ms"] = 1e3 * timeit(fb[name], (q, k, v, do, cu_k), calls, batches)
        o_b, (dq_b, _, _) = fb["broadcast"](q, k, v, do, cu_k)
        o_t, (dq_t, _, _) = fb["tiled"](q, k, v, do, cu_k)
        row["o_bits_equal"] = bool(np.array_equal(np.asarray(o_b, np.float32), np.asarray(o_t, np.float32)))
        ref = np.asarray(dq_t, np.float64)
        err = np.asarray(dq_b, np.float64) - ref
        row["dq_sqnr_db"] = float(10 * np.log10(np.sum(ref**2) / max(np.sum(err**2), 1e-300)))
        if args.kernel_bwd and not args.smoke:
            row.update(_kernel_bwd_row(rng, b, lens, tq, n, n_kv, h, calls, batches))
        rows.append(row)
        if args.out:  # after every shape: a run cut short keeps what it measured
            harness.write_json(args.out, meta, rows=rows)
    cols = ("fwd bcast", "fwd tiled", "f+b bcast", "f+b tiled")
    print(f"{'shape':34} " + " ".join(f"{c:>10}" for c in cols) + f" {'O bits':>7} {'dQ dB':>6}")
    for r in rows:
        name = f"B{r['b']} U{r['lens_range']} Tq{r['tq']} N{r['n']}/{r['n_kv']} H{r['h']}"
        print(
            f"{name:34} {r['broadcast_fwd_ms']:10.3f} {r['tiled_fwd_ms']:10.3f} {r['broadcast_fwd_bwd_ms']:10.3f} "
            f"{r['tiled_fwd_bwd_ms']:10.3f} {str(r['o_bits_equal']):>7} {r['dq_sqnr_db']:6.1f}"
        )
        if "kernel_bwd_bcast_ms" in r and "kernel_bwd_tiled_ms" in r:
            print(
                f"  backward kernel call alone: broadcast_q {r['kernel_bwd_bcast_ms']:.3f} ms, tune 17 (BF16) on the "
                f"tiled q {r['kernel_bwd_tiled_ms']:.3f} ms; XLA sum of a per-row f32 dq {r['xla_dq_sum_ms']:.3f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
