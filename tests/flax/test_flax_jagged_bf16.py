"""The BF16 attention of the Flax layer. Its jagged twin (jax_mxfp8.flax.functional.jagged_attention with a
BF16 policy): a padded batch with sequence lengths through jax.nn.dot_product_attention, never a
T_total x T_total mask; checked against a float64 NumPy softmax per sequence on the bf16-rounded inputs
(bf16 output tolerance), with empty sequences, GQA, causal and non-causal, rows outside every sequence 0,
finite gradients, and the compiled program holding no (T_total, T_total) array; on the GPU (marked gpu)
cuDNN's fused attention runs it, forward and backward.

Query rows with no valid key (mask, lengths): 0 with zero gradients as the MXFP8 path gives, every other row
and every gradient bit-identical to jax.nn.dot_product_attention's; the modules agree across precisions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_mxfp8.flax as mf
from jax_mxfp8.flax import functional as F
from jax_mxfp8.flax.policy import PrecisionPolicy

LENS = [5, 0, 37, 64, 20]
T_TOTAL = 160
BF16 = PrecisionPolicy.bf16().for_layer("attn")


def _inputs():
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((T_TOTAL, 4, 32)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((T_TOTAL, 2, 32)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((T_TOTAL, 2, 32)), jnp.float32)
    cu = np.concatenate([[0], np.cumsum(LENS)]).astype(np.int32)
    return q, k, v, cu


def _reference(q, k, v, cu, causal: bool) -> np.ndarray:
    qb, kb, vb = (np.asarray(a.astype(jnp.bfloat16).astype(jnp.float32), np.float64) for a in (q, k, v))
    out = np.zeros(qb.shape)
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        for n in range(qb.shape[1]):
            sc = qb[s:e, n] @ kb[s:e, n // 2].T / np.sqrt(qb.shape[-1])
            if causal:
                sc = np.where(np.tril(np.ones((e - s, e - s))) > 0, sc, -np.inf)
            if e > s:
                p = np.exp(sc - sc.max(1, keepdims=True))
                out[s:e, n] = (p / p.sum(1, keepdims=True)) @ vb[s:e, n // 2]
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_per_sequence(causal):
    q, k, v, cu = _inputs()
    out = F.jagged_attention(q, k, v, jnp.asarray(cu), max(LENS), BF16, is_causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    out = np.asarray(out, np.float64)
    np.testing.assert_allclose(out, _reference(q, k, v, cu, causal), atol=2e-2, rtol=0)
    assert np.all(out[cu[-1] :] == 0)  # rows outside every sequence


def test_gradients_and_no_quadratic_mask():
    q, k, v, cu = _inputs()
    cu = jnp.asarray(cu)

    def loss(q, k, v):
        return jnp.sum(F.jagged_attention(q, k, v, cu, 64, BF16, is_causal=True) ** 2)

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g)))
        assert np.all(np.asarray(g)[int(cu[-1]) :] == 0)  # padding rows get no gradient
    text = jax.jit(jax.grad(loss)).lower(q, k, v).as_text()
    assert f"{T_TOTAL}x{T_TOTAL}" not in text  # the padded batch's (5, N, 64, 64) scores, not T_total^2


@pytest.mark.gpu
def test_bf16_jagged_attention_runs_cudnn():
    """On the GPU: cuDNN's fused attention on the padded batch, forward and backward (no T_total x T_total
    scores)."""
    cu = jnp.array([0, 300, 1000, 1024], jnp.int32)
    q = jax.random.normal(jax.random.key(0), (1024, 8, 128), jnp.bfloat16)
    kv = jax.random.normal(jax.random.key(1), (1024, 2, 128), jnp.bfloat16)
    prec = PrecisionPolicy.bf16().for_layer("attn")

    def loss(q, k, v):
        return jnp.sum(F.jagged_attention(q, k, v, cu, 704, prec, is_causal=True).astype(jnp.float32) ** 2)

    text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).as_text()
    assert "__cudnn$fmha" in text  # cuDNN's fused attention, forward and backward
    assert "1024x1024" not in text
    val, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, kv, kv)
    assert jnp.isfinite(val) and all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


# ------------------------------------------------------------------------- rows with no valid key
def _keyless_mask(per_head: bool) -> np.ndarray:
    """(2, 4|1, 32, 32) random boolean mask (True = attend) with whole query rows False."""
    rng = np.random.default_rng(7)
    mask = rng.random((2, 4 if per_head else 1, 32, 32)) < 0.3
    mask[0, :, 3] = mask[1, -1, 17] = mask[1, 0, 30] = False
    return mask


def _jax_nn(q, k, v, **kw):
    return jax.nn.dot_product_attention(*(a.astype(jnp.bfloat16) for a in (q, k, v)), **kw)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_rows_without_a_key_are_zero_the_rest_is_jax_nn_bit_for_bit(causal, per_head):
    """Under mask (and causality) a query row with no valid key gives 0 and sends no gradient anywhere (the
    MXFP8 answer; jax.nn gives the mean of V); the other rows and all gradients equal jax.nn's bits (its
    gradients taken with the keyless rows' cotangent zeroed)."""
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((2, 32, 4, 32),) + ((2, 32, 2, 32),) * 2)
    w = jnp.asarray(rng.standard_normal((2, 32, 4, 32)), jnp.float32)
    mask = _keyless_mask(per_head)
    keys = mask & (np.tril(np.ones((32, 32), bool)) if causal else True)
    has_key = np.broadcast_to(keys.any(-1), (2, 4, 32)).transpose(0, 2, 1)[..., None]  # (B, T, N, 1), NumPy
    assert 0 < (~has_key).sum() < has_key.size // 4
    ours = lambda q, k, v: F.attention(q, k, v, BF16, is_causal=causal, mask=jnp.asarray(mask))  # noqa: E731
    ref = lambda q, k, v: _jax_nn(q, k, v, mask=jnp.asarray(mask), is_causal=causal).astype(jnp.float32)  # noqa: E731
    out, expect = np.asarray(ours(q, k, v)), np.asarray(ref(q, k, v))
    assert np.all(np.where(has_key, out == expect, out == 0))
    assert not np.allclose(expect[~np.broadcast_to(has_key, expect.shape)], 0)  # jax.nn's mean of V there
    g = jax.grad(lambda *a: jnp.sum(ours(*a) * w), (0, 1, 2))(q, k, v)
    g_ref = jax.grad(lambda *a: jnp.sum(ref(*a) * (w * has_key)), (0, 1, 2))(q, k, v)
    for a, b in zip(g, g_ref, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.all(np.asarray(g[0])[np.broadcast_to(~has_key, q.shape)] == 0)


def test_rows_without_a_key_by_lengths_are_zero():
    """The lengths route: a sequence with no key gives 0 on all its rows, rows past the query length 0, the
    rest jax.nn's bits."""
    rng = np.random.default_rng(4)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 32, 2, 32)), jnp.float32) for _ in range(3))
    lens = dict(query_seq_lengths=jnp.asarray([32, 20]), key_value_seq_lengths=jnp.asarray([0, 17]))
    out = np.asarray(F.bf16_attention(q, k, v, is_causal=False, **lens).astype(jnp.float32))
    expect = np.asarray(_jax_nn(q, k, v, **lens).astype(jnp.float32))
    assert np.all(out[0] == 0) and np.all(out[1, 20:] == 0)
    np.testing.assert_array_equal(out[1, :20], expect[1, :20])
    assert not np.allclose(expect[0], 0)


@pytest.mark.parametrize("precision", [mf.MXFP8, mf.BF16], ids=["mxfp8", "bf16"])
def test_attention_module_gives_zero_on_rows_without_a_key_under_each_precision(precision):
    """MXAttention(mask=...): a query row masked for every head gives 0 (no out bias) under both precisions,
    with finite parameter gradients."""
    attn = mf.MXAttention(64, 2, precision=precision, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(5).standard_normal((2, 32, 64)), jnp.float32)
    mask = jnp.asarray(np.ones((2, 1, 32, 32), bool)).at[0, :, 5].set(False).at[1, :, 0].set(False)
    out = np.asarray(attn(x, mask=mask))
    assert np.all(out[0, 5] == 0) and np.all(out[1, 0] == 0)
    assert np.all(np.abs(out[0, :5]).sum(-1) > 0) and np.all(np.abs(out[1, 1:]).sum(-1) > 0)
    grads = nnx.grad(lambda m: jnp.sum(m(x, mask=mask) ** 2))(attn)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree_util.tree_leaves(grads))
