"""Differentiating the MX ops' backward (grad of grad, HVPs) raises instead of returning a silent zero,
and first-order gradients are bit-identical to the unguarded custom_vjp rules (ops/no_second_order.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.ops import attention as attn_mod
from jax_mxfp8.ops import mx_dot_general as dot_mod

DN = (((1,), (0,)), ((), ()))
RNG = np.random.default_rng(20261201)
X = jnp.asarray(RNG.standard_normal((32, 64)), jnp.float32)
W = jnp.asarray(RNG.standard_normal((64, 32)), jnp.float32)
Q = jnp.asarray(RNG.standard_normal((1, 32, 2, 64)), jnp.float32)
PACKED = jnp.asarray(RNG.standard_normal((40, 2, 64)), jnp.float32)
CU = jnp.asarray([0, 17, 40], jnp.int32)


def _dot_loss(x):
    return jnp.sum(mx.mx_dot_general(x, W, DN) ** 2)


def _attn_loss(q):
    return jnp.sum(mx.dot_product_attention(q, q, q, is_causal=True, implementation="xla") ** 2)


def _varlen_loss(x):
    out = mx.varlen_attention(x, x, x, CU, CU, max_seqlen_q=23, max_seqlen_k=23, implementation="xla")
    return jnp.sum(out**2)


CASES = [
    ("mx_dot_general", _dot_loss, X),
    ("dot_product_attention", _attn_loss, Q),
    ("varlen_attention", _varlen_loss, PACKED),
]


@pytest.mark.parametrize("op,loss,x", CASES, ids=[c[0] for c in CASES])
def test_second_order_raises_naming_the_op(op, loss, x):
    # varlen_attention's XLA path runs dot_product_attention's custom_vjp, which names itself
    name = "dot_product_attention" if op == "varlen_attention" else op
    with pytest.raises(NotImplementedError, match=f"{name}: second-order differentiation"):
        jax.grad(lambda x: jnp.sum(jax.grad(loss)(x)))(x)
    with pytest.raises(NotImplementedError, match="second-order"):
        jax.jvp(jax.grad(loss), (x,), (x,))  # Hessian-vector product
    assert np.isfinite(float(jnp.sum(jax.grad(loss)(x))))  # first order still works


def test_jvp_of_vjp_in_the_cotangent_raises():
    _, vjp = jax.vjp(lambda x: mx.mx_dot_general(x, W, DN), X)
    g = jnp.ones((32, 32))
    with pytest.raises(NotImplementedError, match="mx_dot_general"):
        jax.jvp(vjp, (g,), (g,))


def test_second_order_elsewhere_is_unaffected():
    def f(x, y):
        return _dot_loss(x) + jnp.sum(y**3)

    h = jax.hessian(f, argnums=1)(X, jnp.arange(3.0))
    np.testing.assert_array_equal(h, np.diag(6 * np.arange(3.0)))


def _unguarded(fn, fwd, bwd, nondiff):
    raw = jax.custom_vjp(fn.fun, nondiff_argnums=nondiff)
    raw.defvjp(fwd, bwd)
    return raw


def test_first_order_gradients_are_bit_identical():
    raw_dot = _unguarded(dot_mod._mx_dot, dot_mod._mx_dot_fwd, dot_mod._mx_dot_bwd, (5, 6, 7, 8))
    args = (None, None, None, DN, np.dtype(np.float32), mx.MXDotConfig(), None, None)

    def both(f):
        return jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w, *args))), (0, 1)))(X, W)

    for a, b in zip(both(dot_mod._mx_dot), both(raw_dot), strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))

    raw_attn = _unguarded(attn_mod._mx_attention, attn_mod.mx_attention_fwd, attn_mod.mx_attention_bwd, (0,))
    static = attn_mod.AttentionStatic(
        config=mx.AttentionConfig(),
        scale=0.125,
        is_causal=True,
        is_mx=(False,) * 3,
        out_dtype=np.dtype(np.float32),
        group=2,
    )
    k = Q[:, :, :1]

    def attn(f):
        return jax.jit(jax.grad(lambda q, k: jnp.sum(jnp.sin(f(static, q, k, k, None, None, None, None)[0])), (0, 1)))(
            Q, k
        )

    for a, b in zip(attn(attn_mod._mx_attention), attn(raw_attn), strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
