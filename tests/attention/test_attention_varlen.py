"""varlen_attention: packed jagged sequences against the float64 emulation, one sequence at a time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from tests.attention.attention_oracle import EmuConfig, mx_attention, sqnr_db
from tests.attention.attention_testutil import assert_bits_equal, assert_finite, fresh_rng

AGREEMENT_DB = 55.0


def _packed(rng, lens_q, lens_k, n, n_kv, h, gap=0):
    """Packed inputs; `gap` unused rows sit after the last sequence (outputs there must be 0)."""
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1] + gap, n, h)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], n_kv, h)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], n_kv, h)).astype(np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    return cu_q, cu_k, q, k, v, do


def _emulate_one(q, k, v, do, cfg, causal):
    """The emulation of one sequence: rows padded to a multiple of 32 with explicit lengths."""
    lq, lk = q.shape[0], k.shape[0]

    def pad(x, n):
        p = -(-max(n, 1) // 32) * 32
        return np.pad(x, ((0, p - n), (0, 0), (0, 0)))[None]

    out = mx_attention(pad(q, lq), pad(k, lk), pad(v, lk), pad(do, lq), cfg=cfg, causal=causal, q_len=[lq], kv_len=[lk])
    o, _, dq, dk, dv = (x[0] for x in out)
    return o[:lq], dq[:lq], dk[:lk], dv[:lk]


@pytest.mark.parametrize(
    "cfg_kw, is_causal",
    [({}, True), ({}, False), (dict(qkv_blocks="row", p_scale="block"), True), (dict(causal_safe=True), True)],
)
def test_varlen_matches_emulation(cfg_kw, is_causal):
    rng = fresh_rng()
    lens_q, lens_k = [37, 64, 1, 90], [37, 70, 33, 90]
    if is_causal:
        lens_k = lens_q
    cu_q, cu_k, q, k, v, do = _packed(rng, lens_q, lens_k, n=4, n_kv=2, h=64, gap=5)

    def f(q, k, v):
        return mx.varlen_attention(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max_seqlen_q=90,
            max_seqlen_k=90,
            is_causal=is_causal,
            config=mx.AttentionConfig(**cfg_kw),
        )

    o, vjp = jax.vjp(f, q, k, v)
    dq, dk, dv = vjp(jnp.asarray(do))
    assert o.shape == q.shape and o.dtype == q.dtype
    assert_finite(o, dq, dk, dv)
    assert np.all(np.asarray(o)[cu_q[-1] :] == 0) and np.all(np.asarray(dq)[cu_q[-1] :] == 0)
    for b in range(len(lens_q)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want = _emulate_one(q[sq], k[sk], v[sk], do[sq], EmuConfig(**cfg_kw), is_causal)
        got = (np.asarray(o)[sq], np.asarray(dq)[sq], np.asarray(dk)[sk], np.asarray(dv)[sk])
        for label, x, w in zip(("O", "dQ", "dK", "dV"), got, want, strict=True):
            assert sqnr_db(x, w) >= AGREEMENT_DB, f"sequence {b}: {label}"


def test_varlen_equals_dense_with_lengths():
    """A packed batch gives the dense op's result on the same sequences padded with lengths, bit for bit."""
    rng = fresh_rng()
    lens = [64, 20, 50]
    cu, _, q, k, v, _ = _packed(rng, lens, lens, n=2, n_kv=1, h=64)
    got = mx.varlen_attention(q, k, v, cu, cu, max_seqlen_q=64, max_seqlen_k=64, is_causal=True)

    def pad(x):
        return np.stack([np.pad(x[cu[b] : cu[b + 1]], ((0, 64 - lens[b]), (0, 0), (0, 0))) for b in range(3)])

    lengths = np.array(lens, np.int32)
    dense = mx.dot_product_attention(
        pad(q), pad(k), pad(v), is_causal=True, query_seq_lengths=lengths, key_value_seq_lengths=lengths
    )
    want = np.concatenate([np.asarray(dense)[b, : lens[b]] for b in range(3)])
    assert_bits_equal(got, want)


def test_varlen_mxarray_and_empty_sequences():
    rng = fresh_rng()
    lens = [40, 0, 24]
    cu, _, q, k, v, _ = _packed(rng, lens, lens, n=2, n_kv=2, h=64)
    qm = mx.quantize(jnp.asarray(q), axis=-1, block="row")
    km = mx.quantize(jnp.asarray(k), axis=-1, block="row")
    vm = mx.quantize(jnp.asarray(v), axis=-1, block="row")
    cfg = mx.AttentionConfig(causal_safe=True)  # Q, K, V in 1x32 head_dim blocks, like the MXArrays
    got = mx.varlen_attention(qm, km, vm, cu, cu, max_seqlen_q=40, max_seqlen_k=40, config=cfg)
    want = mx.varlen_attention(q, k, v, cu, cu, max_seqlen_q=40, max_seqlen_k=40, config=cfg)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.bfloat16)))
    with pytest.raises(ValueError, match="blocked along head_dim only"):
        mx.varlen_attention(
            mx.quantize(jnp.asarray(q), axis=(-3, -1), block="square"), k, v, cu, cu, max_seqlen_q=40, max_seqlen_k=40
        )


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(max_seqlen_q=30), "max_seqlen_q=30 is smaller than the longest sequence"),
        (dict(max_seqlen_k=0), "max_seqlen_k"),
        (dict(cu_seqlens_q=np.array([0, 40, 30, 64], np.int32)), "cu_seqlens_q"),
        (dict(cu_seqlens_k=np.array([0, 64], np.int32)), "same B"),
        (dict(cu_seqlens_q=np.array([0.0, 40.0, 50.0, 64.0])), "cu_seqlens_q must be an integer array"),
        (dict(q=np.zeros((64, 2, 40), np.float32)), "q has head_dim 40|k has head_dim"),
        (dict(q=np.zeros((1, 64, 2, 64), np.float32)), "q must have rank 3"),
        (dict(v=np.zeros((64, 1, 64), np.float32)), "v must have k's shape"),
        (dict(implementation="pallas"), "implementation"),
    ],
)
def test_varlen_bad_arguments(kw, match):
    rng = fresh_rng()
    cu, _, q, k, v, _ = _packed(rng, [40, 10, 14], [40, 10, 14], n=2, n_kv=2, h=64)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=40, max_seqlen_k=40)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        mx.varlen_attention(**args)
