"""Information flow: the causal leak of sequence-spanning blocks, causal_safe, padding, jagged sequences.

All comparisons are bit for bit on finite arrays (NaN never passes).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jax_mxfp8 as mx
from tests.attention.attention_testutil import assert_bits_equal, assert_finite, fresh_rng, lib_fwd_bwd, normal_inputs


def _perturb_future(rng, x, t0):
    y = x.copy()
    y[:, t0:] = y[:, t0:] * 8.0 + rng.standard_normal(y[:, t0:].shape).astype(y.dtype)
    return y


@pytest.mark.parametrize("qkv_blocks", ["square", "row"])
def test_causal_safe_outputs_ignore_future_positions(qkv_blocks):
    rng = fresh_rng()
    q, k, v, _ = normal_inputs(rng, b=1, t=128, s=128, n=2, n_kv=1, h=64)
    cfg = mx.AttentionConfig(qkv_blocks=qkv_blocks, causal_safe=True)
    t0 = 70  # not a block boundary: positions 64..69 share 32-row blocks with perturbed 70..95
    o1, lse1 = mx.dot_product_attention(q, k, v, is_causal=True, config=cfg, return_residual="lse")
    q2, k2, v2 = (_perturb_future(rng, x, t0) for x in (q, k, v))
    o2, lse2 = mx.dot_product_attention(q2, k2, v2, is_causal=True, config=cfg, return_residual="lse")
    assert_bits_equal(o1[:, :t0], o2[:, :t0])
    assert_bits_equal(lse1[..., :t0], lse2[..., :t0])
    assert not np.array_equal(np.asarray(o1[:, t0:]), np.asarray(o2[:, t0:]))


@pytest.mark.parametrize("qkv_blocks, operand", [("square", "q"), ("square", "k"), ("square", "v"), ("row", "v")])
def test_default_blocks_leak_future_positions(qkv_blocks, operand):
    """Documents the leak causal_safe fixes: 32-row blocks let later positions move earlier outputs."""
    rng = fresh_rng()
    q, k, v, _ = normal_inputs(rng, b=1, t=128, s=128, n=2, n_kv=1, h=64)
    cfg = mx.AttentionConfig(qkv_blocks=qkv_blocks)
    t0 = 70
    args = dict(q=q, k=k, v=v)
    o1 = mx.dot_product_attention(q, k, v, is_causal=True, config=cfg)
    args[operand] = args[operand].copy()
    args[operand][:, t0] *= 1000.0  # one future row raises its block's amax
    o2 = mx.dot_product_attention(args["q"], args["k"], args["v"], is_causal=True, config=cfg)
    assert_finite(o1, o2)
    assert not np.array_equal(np.asarray(o1[:, 64:t0]), np.asarray(o2[:, 64:t0]))
    np.testing.assert_array_equal(np.asarray(o1[:, :64]), np.asarray(o2[:, :64]))  # earlier blocks untouched


def test_padding_contents_never_matter():
    """Positions past the sequence lengths (even NaN/Inf) change no valid output or gradient."""
    rng = fresh_rng()
    q, k, v, do = normal_inputs(rng, b=2, t=96, s=128, n=2, n_kv=1, h=64)
    q_len, kv_len = np.array([50, 96], np.int32), np.array([128, 70], np.int32)
    ref = lib_fwd_bwd(q, k, v, do, q_len=q_len, kv_len=kv_len, is_causal=True)
    q2, k2, v2, do2 = (x.copy() for x in (q, k, v, do))
    q2[0, 50:] = np.nan
    do2[0, 50:] = 1e30
    k2[1, 70:] = np.inf
    v2[1, 70:] = np.nan
    got = lib_fwd_bwd(q2, k2, v2, do2, q_len=q_len, kv_len=kv_len, is_causal=True)
    for a, b in zip(ref, got, strict=True):
        a, b = a.copy(), b.copy()
        a[np.isneginf(a)] = b[np.isneginf(b)] = 0.0  # LSE of padded rows is -inf on both sides
        assert_bits_equal(a, b)


def _packed(rng, lens_q, lens_k, n, n_kv, h):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], n, h)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], n_kv, h)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], n_kv, h)).astype(np.float32)
    do = rng.standard_normal((cu_q[-1], n, h)).astype(np.float32)
    return cu_q, cu_k, q, k, v, do


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_jagged_sequences_are_isolated(is_causal):
    rng = fresh_rng()
    lens = [45, 7, 96, 33]
    cu_q, cu_k, q, k, v, do = _packed(rng, lens, lens, n=4, n_kv=2, h=64)
    cfg = mx.AttentionConfig(p_scale="block")

    @jax.jit
    def run(q, k, v, do):
        def f(q, k, v):
            return mx.varlen_attention(
                q, k, v, cu_q, cu_k, max_seqlen_q=96, max_seqlen_k=96, is_causal=is_causal, config=cfg
            )

        o, vjp = jax.vjp(f, q, k, v)
        return (o, *vjp(do))

    base = run(q, k, v, do)
    victim = 2
    sl = slice(cu_q[victim], cu_q[victim + 1])
    q2, k2, v2, do2 = (x.copy() for x in (q, k, v, do))
    for x in (q2, k2, v2, do2):
        x[sl] = 5.0 * rng.standard_normal(x[sl].shape)
    pert = run(q2, k2, v2, do2)
    keep = np.ones(cu_q[-1], bool)
    keep[sl] = False
    for a, b in zip(base, pert, strict=True):
        assert_bits_equal(np.asarray(a)[keep], np.asarray(b)[keep])
        assert not np.array_equal(np.asarray(a)[sl], np.asarray(b)[sl])
