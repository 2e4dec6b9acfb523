"""The packed targets of the Blackwell attention backward (primitives/attention_bwd_sm100.py with
attention_sm100_packed.PackedSequenceTables), path "emulated", against the dense targets run on each sequence
alone:

* the packed pre-pass: dO's E4M3 rows and each sequence's scale chunks (both orientations) equal the dense
  pre-pass of that sequence bit for bit; Delta to float32 rounding;
* the packed backward: each sequence's dq, dk, dv equal the dense backward of that sequence alone to float32
  rounding (XLA may order a float32 reduction differently for the two shapes), and a NaN in one sequence's keys
  leaves the other sequences' gradients unchanged bit for bit.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_mxfp8.primitives import attention_bwd_sm100 as bwd
from jax_mxfp8.primitives import attention_sm100_operands as ops
from jax_mxfp8.primitives import attention_sm100_packed as packed
from tests.attention.attention_testutil import fresh_rng

LQ, LK = [100, 256, 64], [250, 200, 37]
N, KH, H, WIDTH = 2, 1, 64, 256
CQ = np.concatenate([[0], np.cumsum(LQ)]).astype(np.int32)
CK = np.concatenate([[0], np.cumsum(LK)]).astype(np.int32)
NCH_Q, NCH_K = 5, 5  # >= the chunk totals 1 + 2 + 1 and 2 + 2 + 1


def _inputs(rng):
    x = {name: rng.standard_normal((1, sum(LQ), N, H)).astype(np.float32) for name in ("q", "do", "o")}
    x |= {name: rng.standard_normal((1, sum(LK), KH, H)).astype(np.float32) for name in ("k", "v")}
    x["lse"] = (np.log(200.0) + rng.standard_normal((1, N, sum(LQ)))).astype(np.float32)
    return x


def _tables():
    return packed.packed_tables(
        jnp.asarray(CQ), jnp.asarray(CK), causal=True, n_chunks_q=NCH_Q, n_chunks_k=NCH_K
    )  # fmt: skip


def _packed(x):
    t = _tables()
    chq, chk = packed.chunk_starts(jnp.asarray(LQ)), packed.chunk_starts(jnp.asarray(LK))

    def pack(a, cu, c, n):
        return packed.pack_operand(jnp.asarray(a), jnp.asarray(cu), c, max_len=WIDTH, n_chunks=n)

    q, k, v = pack(x["q"], CQ, chq, NCH_Q), pack(x["k"], CK, chk, NCH_K), pack(x["v"], CK, chk, NCH_K)
    dlse = jnp.zeros((1, N, sum(LQ)), jnp.float32)
    do_op, delta = bwd.bwd_prepass_sm100(
        jnp.asarray(x["do"]), jnp.asarray(x["o"]), dlse, t, path="emulated", max_len_q=WIDTH
    )  # fmt: skip
    variant = bwd.find_variant(head_dim=H, causal=True, packed=True)
    grads = bwd.attention_bwd_sm100(
        q, k, v, do_op, jnp.asarray(x["lse"]), delta, t, variant=variant, scale=H**-0.5, path="emulated",
        max_len_q=WIDTH, max_len_k=WIDTH,
    )  # fmt: skip
    return do_op, delta, [np.asarray(g) for g in grads]


def _pad_rows(a, axis: int):
    """Zero rows after the sequence up to a multiple of 32 (the dense targets' row granularity)."""
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, -a.shape[axis] % 32)
    return jnp.pad(jnp.asarray(a), pad)


def _alone(x, s):
    """The dense targets' operands of sequence s alone (batch 1, its rows, zero rows up to a multiple of 32)."""
    q, do, o = (_pad_rows(x[n][:, CQ[s] : CQ[s + 1]], 1) for n in ("q", "do", "o"))
    k, v = (_pad_rows(x[n][:, CK[s] : CK[s + 1]], 1) for n in ("k", "v"))
    lse = _pad_rows(x["lse"][:, :, CQ[s] : CQ[s + 1]], 2)
    lens = jnp.asarray([[LQ[s]], [LK[s]]], jnp.int32)
    do_op, delta = bwd.bwd_prepass_sm100(do, o, jnp.zeros_like(lse), lens, path="emulated")
    q_op, k_op, v_op = (ops.sm100_operand(ops.quantize_square(a)) for a in (q, k, v))
    return do_op, delta, q_op, k_op, v_op, lse, lens


def test_packed_prepass_equals_each_sequence_alone():
    x = _inputs(fresh_rng())
    do_op, delta, _ = _packed(x)
    chq = np.asarray(packed.chunk_starts(jnp.asarray(LQ)))
    for s in range(3):
        d1, delta1, *_ = _alone(x, s)
        np.testing.assert_array_equal(
            np.asarray(do_op.data[0, CQ[s] : CQ[s + 1]]).view(np.uint8),
            np.asarray(d1.data[0, : LQ[s]]).view(np.uint8),
        )
        n = -(-LQ[s] // 128)
        np.testing.assert_array_equal(np.asarray(do_op.sf_hd[0, :, chq[s] : chq[s] + n]), np.asarray(d1.sf_hd[0]))
        np.testing.assert_array_equal(np.asarray(do_op.sf_seq[0, :, :, chq[s] : chq[s] + n]), np.asarray(d1.sf_seq[0]))
        np.testing.assert_allclose(
            np.asarray(delta[0, :, CQ[s] : CQ[s + 1]]), np.asarray(delta1[0, :, : LQ[s]]), rtol=1e-6, atol=1e-6
        )


def test_packed_backward_equals_each_sequence_alone_and_isolates_nan():
    x = _inputs(fresh_rng())
    _, _, (dq, dk, dv) = _packed(x)
    variant = bwd.find_variant(head_dim=H, causal=True)
    for s in range(3):
        do_op, delta, q_op, k_op, v_op, lse, lens = _alone(x, s)
        g = bwd.attention_bwd_sm100(
            q_op, k_op, v_op, do_op, lse, delta, lens, variant=variant, scale=H**-0.5, path="emulated"
        )  # fmt: skip
        np.testing.assert_allclose(dq[0, CQ[s] : CQ[s + 1]], np.asarray(g[0])[0, : LQ[s]], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(dk[0, CK[s] : CK[s + 1]], np.asarray(g[1])[0, : LK[s]], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(dv[0, CK[s] : CK[s + 1]], np.asarray(g[2])[0, : LK[s]], rtol=1e-6, atol=1e-6)
    x["k"][0, CK[1] + 7, 0, 9] = np.nan  # sequence 1
    _, _, (dq2, dk2, dv2) = _packed(x)
    for s in (0, 2):
        np.testing.assert_array_equal(dq2[0, CQ[s] : CQ[s + 1]], dq[0, CQ[s] : CQ[s + 1]])
        np.testing.assert_array_equal(dk2[0, CK[s] : CK[s + 1]], dk[0, CK[s] : CK[s + 1]])
        np.testing.assert_array_equal(dv2[0, CK[s] : CK[s + 1]], dv[0, CK[s] : CK[s + 1]])
    assert np.any(np.isnan(dq2[0, CQ[1] : CQ[2]]))
