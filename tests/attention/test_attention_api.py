"""MXFP8 attention API: argument checks, implementation choice, jit / vmap / grad, MXArray inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from tests.attention.attention_oracle import mx_attention, sqnr_db
from tests.attention.attention_testutil import assert_bits_equal, fresh_rng, normal_inputs


def _inputs(b=1, t=64, s=64, n=2, n_kv=1, h=64):
    return normal_inputs(fresh_rng(), b=b, t=t, s=s, n=n, n_kv=n_kv, h=h)


# ---------------------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------------------


def _call(**over):
    q, k, v, _ = _inputs()
    args = dict(query=q, key=k, value=v)
    args.update(over)
    return mx.dot_product_attention(**args)


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(query=np.zeros((1, 64, 2, 48), np.float32)), "query.*head_dim 48"),
        (
            dict(
                query=np.zeros((1, 64, 2, 288), np.float32),
                key=np.zeros((1, 64, 1, 288), np.float32),
                value=np.zeros((1, 64, 1, 288), np.float32),
            ),
            "query.*head_dim 288",
        ),
        (dict(query=np.zeros((1, 40, 2, 64), np.float32)), "query sequence length T=40"),
        (
            dict(key=np.zeros((1, 40, 1, 64), np.float32), value=np.zeros((1, 40, 1, 64), np.float32)),
            "key sequence length S=40",
        ),
        (dict(value=np.zeros((1, 64, 2, 64), np.float32)), "value must have key's shape"),
        (
            dict(
                query=np.zeros((1, 64, 3, 64), np.float32),
                key=np.zeros((1, 64, 2, 64), np.float32),
                value=np.zeros((1, 64, 2, 64), np.float32),
            ),
            "query has 3 heads",
        ),
        (dict(key=np.zeros((1, 64, 1, 32), np.float32)), "key of shape"),
        (dict(query=np.zeros((1, 64, 2, 64), np.int32)), "query has dtype int32"),
        (dict(query=np.zeros((1, 64, 2, 64), jnp.bfloat16)), "has dtype float32 but query has dtype bfloat16"),
        (dict(query=np.zeros((64, 64), np.float32)), "query must have rank"),
        (dict(mask=np.ones((1, 2, 64, 64), np.float32)), "mask must be boolean"),
        (dict(mask=np.ones((1, 3, 64, 64), bool)), "mask of shape"),
        (dict(bias=np.ones((1, 2, 64, 32), np.float32)), "bias of shape"),
        (dict(bias=np.ones((1, 2, 64, 64), np.int32)), "bias must be floating"),
        (dict(query_seq_lengths=np.ones((2,), np.int32)), "query_seq_lengths"),
        (dict(key_value_seq_lengths=np.ones((1,), np.float32)), "key_value_seq_lengths"),
        (dict(scale=float("nan")), "scale"),
        (dict(is_causal="yes"), "is_causal"),
        (dict(config="square"), "config"),
        (dict(implementation="triton"), "implementation"),
    ],
)
def test_bad_arguments_raise_value_error(over, match):
    with pytest.raises(ValueError, match=match):
        _call(**over)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(qkv_blocks="col"), "qkv_blocks"),
        (dict(p_scale="amax"), "p_scale"),
        (dict(dq_accum="bf16"), "dq_accum"),
        (dict(scale_rounding="down"), "scale_rounding"),
        (dict(kv_tile=48), "kv_tile"),
        (dict(kv_tile=0), "kv_tile"),
        (dict(causal_safe=1), "causal_safe"),
    ],
)
def test_bad_config_raises_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        mx.AttentionConfig(**kw)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the error where no kernel can run")
def test_cuda_implementation_reports_why_not_available():
    with pytest.raises(RuntimeError, match="implementation='cuda' was requested but"):
        _call(implementation="cuda")
    q, k, v, _ = _inputs()
    with pytest.raises(RuntimeError, match="implementation='cuda'"):
        mx.varlen_attention(q[0], k[0], v[0], [0, 64], [0, 64], max_seqlen_q=64, max_seqlen_k=64, implementation="cuda")


def test_mxarray_with_cross_head_blocks_rejected():
    q, k, v, _ = _inputs()
    qm = mx.quantize(jnp.asarray(np.zeros((1, 64, 32, 64), np.float32)), axis=(-2, -1), block="square")
    with pytest.raises(ValueError, match="query is an MXArray blocked along axes"):
        mx.dot_product_attention(qm, k, v)


# ---------------------------------------------------------------------------------------------------------
# Transformations
# ---------------------------------------------------------------------------------------------------------


def test_implementation_none_and_xla_agree_and_jit_matches_eager():
    q, k, v, _ = _inputs(b=2, n=4, n_kv=2)
    a = mx.dot_product_attention(q, k, v, is_causal=True)
    b = mx.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    c = jax.jit(lambda q, k, v: mx.dot_product_attention(q, k, v, is_causal=True))(q, k, v)
    assert a.shape == q.shape and a.dtype == q.dtype
    assert_bits_equal(a, b)
    assert sqnr_db(c, a) >= 90  # jit may fuse differently; a rare E4M3 rounding flip is allowed


def test_vmap_matches_batched_call():
    q, k, v, do = _inputs(b=3, n=2, n_kv=2)

    def single(q, k, v):  # unbatched (T, N, H) inputs
        return mx.dot_product_attention(q, k, v, is_causal=True)

    got = jax.vmap(single)(q, k, v)
    want = mx.dot_product_attention(q, k, v, is_causal=True)
    assert_bits_equal(got, want)
    # vmap over an extra leading axis of batched inputs, with gradients
    q2, k2, v2, do2 = (x.reshape((3, 1) + x.shape[1:]) for x in (q, k, v, do))

    def loss(q, k, v, do):
        return jnp.sum(mx.dot_product_attention(q, k, v, is_causal=True) * do)

    gv = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(q2, k2, v2, do2)
    gb = jax.jit(
        jax.grad(lambda q, k, v: jnp.sum(mx.dot_product_attention(q, k, v, is_causal=True) * do), argnums=(0, 1, 2))
    )(q, k, v)
    for a, b in zip(gv, gb, strict=True):
        assert sqnr_db(np.asarray(a).reshape(b.shape), b) >= 90


def test_grad_under_jit_matches_emulation():
    q, k, v, do = _inputs(b=1, t=96, s=128, n=4, n_kv=2)

    def loss(q, k, v):
        return jnp.sum(mx.dot_product_attention(q, k, v, is_causal=True) * do)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    want = mx_attention(q, k, v, do, causal=True)[2:]
    for g, w in zip(grads, want, strict=True):
        assert sqnr_db(g, w) >= 55


def test_unbatched_inputs():
    q, k, v, _ = _inputs(b=1)
    o, lse = mx.dot_product_attention(q[0], k[0], v[0], return_residual="lse")
    o4, lse4 = mx.dot_product_attention(q, k, v, return_residual="lse")
    assert o.shape == q.shape[1:] and lse.shape == (2, 64)
    assert_bits_equal(o, o4[0])
    assert_bits_equal(lse, lse4[0])


# ---------------------------------------------------------------------------------------------------------
# Pre-quantized inputs
# ---------------------------------------------------------------------------------------------------------


def test_mxarray_inputs_match_raw_inputs():
    q, k, v, do = _inputs(b=2, n=4, n_kv=2)
    # The default config quantizes Q, K, V in 32x32 blocks over (sequence, head_dim): axes (-3, -1) of BTNH.
    qm, km, vm = (mx.quantize(jnp.asarray(x), axis=(-3, -1), block="square") for x in (q, k, v))
    got = mx.dot_product_attention(qm, km, vm, is_causal=True)
    want = mx.dot_product_attention(q, k, v, is_causal=True)
    assert got.dtype == jnp.bfloat16  # no input dtype to follow
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.bfloat16)))
    # Mixed: a quantized query is a constant; gradients still reach key and value.
    got = mx.dot_product_attention(qm, k, v, is_causal=True)
    assert_bits_equal(got, want)

    def loss(k, v):
        return jnp.sum(mx.dot_product_attention(qm, k, v, is_causal=True) * do)

    def loss_raw(k, v):
        return jnp.sum(mx.dot_product_attention(q, k, v, is_causal=True) * do)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(k, v)
    grads_raw = jax.jit(jax.grad(loss_raw, argnums=(0, 1)))(k, v)
    for a, b in zip(grads, grads_raw, strict=True):
        assert_bits_equal(a, b)


def test_mxarray_row_blocked_inputs():
    q, k, v, do = _inputs(b=1, n=2, n_kv=2)
    qm = mx.quantize(jnp.asarray(q), axis=-1, block="row")
    km = mx.quantize(jnp.asarray(k), axis=-1, block="row")
    cfg = mx.AttentionConfig(qkv_blocks="row")
    got = mx.dot_product_attention(qm, km, v, config=cfg)
    want = mx.dot_product_attention(q, k, v, config=cfg)
    assert_bits_equal(got, want)
