"""Flax NNX/Linen modules, the precision policy and the stock-Flax adapters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import jax_mxfp8
import jax_mxfp8.flax as mf
from jax_mxfp8.metrics import sqnr_db
from tests.quantize import mx_oracle


def _x(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _oracle_linear(x, kernel):
    """x @ kernel with both operands MX-quantized along the contracted axis (independent NumPy oracle)."""
    qx = mx_oracle.quantize(np.asarray(x, np.float32), axis=-1)
    qk = mx_oracle.quantize(np.asarray(kernel, np.float32), axis=0)
    return mx_oracle.dequantize(qx.data, qx.scale, qx.axes, qx.fmt).astype(np.float64) @ mx_oracle.dequantize(
        qk.data, qk.scale, qk.axes, qk.fmt
    ).astype(np.float64)


def test_mx_linear_shapes_params_and_numerics():
    layer = mf.MXLinear(64, 96, rngs=nnx.Rngs(0))
    assert layer.kernel[...].shape == (64, 96) and layer.kernel[...].dtype == jnp.float32
    assert sum(p.size for p in jax.tree.leaves(nnx.state(layer, nnx.Param))) == 64 * 96 + 96
    x = _x(1, (2, 5, 64))
    y = layer(x)
    assert y.shape == (2, 5, 96) and y.dtype == jnp.float32
    expect = _oracle_linear(x.reshape(10, 64), layer.kernel[...]).reshape(2, 5, 96)
    assert sqnr_db(expect, y) > 100
    bf = mf.MXLinear(64, 96, precision=mf.BF16, use_bias=False, rngs=nnx.Rngs(0))
    ref = np.asarray(x.astype(jnp.bfloat16), np.float64) @ np.asarray(bf.kernel[...].astype(jnp.bfloat16), np.float64)
    assert sqnr_db(ref, bf(x)) > 100
    with pytest.raises(ValueError, match="features"):
        layer(_x(2, (4, 32)))


def test_rmsnorm_output_feeds_linear_bit_identically():
    norm, layer = mf.MXRMSNorm(64), mf.MXLinear(64, 32, rngs=nnx.Rngs(0))
    x = _x(3, (8, 64))
    h, h_q = norm(x)
    assert isinstance(h_q, jax_mxfp8.MXArray)
    np.testing.assert_array_equal(layer(h, x_quantized=h_q), layer(h))
    assert mf.MXRMSNorm(64, precision=mf.BF16)(x)[1] is None


def test_attention_gqa_params_and_jagged_equals_dense_for_one_sequence():
    attn = mf.MXAttention(64, num_heads=4, num_kv_heads=2, head_dim=32, rngs=nnx.Rngs(0))
    assert attn.qkv.kernel[...].shape == (64, (4 + 2 * 2) * 32)
    assert attn.out.kernel[...].shape == (4 * 32, 64)
    x = _x(4, (1, 96, 64))
    cu = jnp.array([0, 96], jnp.int32)
    dense = nnx.jit(lambda m, x: m(x, is_causal=True))(attn, x)  # one program each (eager: many small ones)
    jagged = nnx.jit(lambda m, x: m(x, cu_seqlens=cu, max_seqlen=96))(attn, x[0])
    np.testing.assert_array_equal(dense[0], jagged)
    with pytest.raises(ValueError, match="num_kv_heads"):
        mf.MXAttention(64, num_heads=4, num_kv_heads=3, rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_transformer_block_jagged_isolation_and_grads():
    blk = mf.TransformerBlock(64, 2, rngs=nnx.Rngs(0))
    x = _x(5, (100, 64))
    cu = jnp.array([0, 30, 70, 100], jnp.int32)
    y = blk(x, cu_seqlens=cu, max_seqlen=40)
    x2 = x.at[40:50].add(1.0)  # perturb the second sequence only
    y2 = blk(x2, cu_seqlens=cu, max_seqlen=40)
    np.testing.assert_array_equal(y[:30], y2[:30])
    np.testing.assert_array_equal(y[70:], y2[70:])
    assert not np.array_equal(y[30:70], y2[30:70])
    grads = nnx.grad(lambda m: jnp.sum(m(x, cu_seqlens=cu, max_seqlen=40) ** 2))(blk)
    leaves = jax.tree.leaves(nnx.state(grads, nnx.Param))
    assert all(np.all(np.isfinite(g)) for g in leaves) and all(np.abs(g).sum() > 0 for g in leaves)


@pytest.mark.slow
def test_linen_modules_match_nnx_math():
    x = _x(6, (2, 64, 64))
    dense = mf.linen.MXDense(32)
    params = dense.init(jax.random.key(0), x)
    kernel = params["params"]["kernel"]
    expect = _oracle_linear(x.reshape(-1, 64), kernel).reshape(2, 64, 32)
    assert sqnr_db(expect, dense.apply(params, x)) > 100
    block = mf.linen.TransformerBlock(num_heads=2)
    bparams = block.init(jax.random.key(1), x)
    y = block.apply(bparams, x)
    assert y.shape == x.shape and np.all(np.isfinite(y))
    g = jax.grad(lambda p: jnp.sum(block.apply(p, x) ** 2))(bparams)
    assert all(np.all(np.isfinite(a)) for a in jax.tree.leaves(g))


def test_policy_rules_and_table():
    policy = mf.PrecisionPolicy.mxfp8(bf16_layers=("blocks.3.*", "lm_head"), grad_rounding="stochastic")
    assert policy.for_layer("blocks.0.attn").gemm == "mxfp8"
    assert policy.for_layer("blocks.0.attn").grad_rounding == "stochastic"
    assert policy.for_layer("blocks.3.mlp").gemm == "bf16"
    assert policy.for_layer("lm_head").attention == "bf16"
    last_wins = mf.PrecisionPolicy(rules=(("blocks.*", mf.BF16), ("blocks.1.*", mf.MXFP8)))
    assert last_wins.for_layer("blocks.1.mlp").gemm == "mxfp8" and last_wins.for_layer("blocks.2.mlp").gemm == "bf16"
    table = policy.table(["blocks.0.attn", "blocks.3.mlp", "lm_head"])
    assert "| blocks.0.attn | mxfp8 (wgrad mxfp8, SR grads) | mxfp8 |" in table
    assert "| blocks.3.mlp | bf16 | - |" in table
    with pytest.raises(ValueError, match="gemm"):
        mf.LayerPrecision(gemm="fp4")
    with pytest.raises(ValueError, match="grad_rounding"):
        mf.LayerPrecision(grad_rounding="up")


def test_stochastic_rounding_policy_draws_fresh_keys():
    layer = mf.MXLinear(64, 32, precision=mf.LayerPrecision(grad_rounding="stochastic"), rngs=nnx.Rngs(0, quant=1))
    x = _x(7, (16, 64))

    @nnx.jit  # one program (eager: many small ones); the rounding stream's state still advances per call
    def grad_kernel(layer):
        return nnx.grad(lambda m: jnp.sum(jnp.sin(m(x))))(layer).kernel[...]

    g1, g2 = grad_kernel(layer), grad_kernel(layer)
    assert not np.array_equal(g1, g2)  # a new rounding key per call


def test_stock_nnx_modules_with_adapters():
    mha = nnx.MultiHeadAttention(
        num_heads=2, in_features=64, qkv_features=64, attention_fn=mf.attention_fn(), decode=False, rngs=nnx.Rngs(0)
    )
    ref = nnx.MultiHeadAttention(num_heads=2, in_features=64, qkv_features=64, decode=False, rngs=nnx.Rngs(0))
    x = _x(8, (2, 64, 64))
    mask = nnx.make_causal_mask(jnp.ones((2, 64)))
    out, expect = mha(x, mask=mask), ref(x, mask=mask)
    assert 20 < sqnr_db(expect, out) < 60  # MXFP8 attention vs float32 attention, same weights
    dropping = nnx.MultiHeadAttention(
        num_heads=2, in_features=64, attention_fn=mf.attention_fn(), dropout_rate=0.1, decode=False, rngs=nnx.Rngs(0)
    )
    with pytest.raises(ValueError, match="dropout"):
        dropping(x, deterministic=False)
    linear = nnx.Linear(64, 32, dot_general=mf.dot_general(weight_grad="bf16"), rngs=nnx.Rngs(0))
    assert (
        sqnr_db(
            _oracle_linear(x.reshape(-1, 64), linear.kernel[...]) + np.asarray(linear.bias[...]),
            linear(x).reshape(-1, 32),
        )
        > 100
    )


def test_stock_linen_modules_with_adapters():
    x = _x(9, (2, 64, 64))
    dense = nn.Dense(32, dot_general=mf.dot_general())
    p = dense.init(jax.random.key(0), x)
    assert sqnr_db(_oracle_linear(x.reshape(-1, 64), p["params"]["kernel"]), dense.apply(p, x).reshape(-1, 32)) > 100
    mha = nn.MultiHeadDotProductAttention(num_heads=2, attention_fn=mf.attention_fn())
    ref = nn.MultiHeadDotProductAttention(num_heads=2)
    p = mha.init(jax.random.key(1), x)
    assert 20 < sqnr_db(ref.apply(p, x), mha.apply(p, x)) < 60


def test_attention_fn_rejects_what_it_cannot_honour():
    fn = mf.attention_fn()
    q = _x(10, (1, 32, 2, 32))
    with pytest.raises(ValueError, match="sowing"):
        fn(q, q, q, module=object())
    with pytest.raises(ValueError, match="does not support"):
        fn(q, q, q, some_new_flag=True)
