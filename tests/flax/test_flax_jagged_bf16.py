"""The BF16 twin of jagged attention (jax_mxfp8.flax.functional.jagged_attention with a BF16 policy): a
padded batch with sequence lengths through jax.nn.dot_product_attention, never a T_total x T_total mask.

Checked against a float64 NumPy softmax per sequence on the bf16-rounded inputs (bf16 output tolerance),
with empty sequences, GQA, causal and non-causal, rows outside every sequence 0, finite gradients, and the
compiled program holding no (T_total, T_total) array.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
