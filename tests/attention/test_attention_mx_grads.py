"""dK, dV as MXArrays for the QKV projection's backward GEMMs (ops/attention_grads.py).

Exact contract: the MXGradient's row / col MXArrays equal quantize(dK) along features / tokens of the
ordinary path's dK, dV (input dtype), bit for bit; and feeding them to mx_dot_general gives the projection
gradients autodiff through mx_dot_general gives (the same MX operands).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.ops.attention_grads import dot_product_attention_vjp, varlen_attention_vjp
from tests.attention.attention_testutil import check_mx_gradient, fresh_rng

T, S, N, NK, H = 64, 96, 2, 1, 64


def test_qkv_projection_backward_uses_them():
    """The documented use: dX, dW of a K projection from dk.row / dk.col equal autodiff through mx_dot_general."""
    rng = fresh_rng()
    d = 64
    x = jnp.asarray(rng.standard_normal((S, d)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((d, NK * H)) / 8, jnp.bfloat16)
    q, v, do = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in [(T, N, H), (S, NK, H), (T, N, H)])
    proj = lambda x, w: mx.mx_dot_general(x, w, (((1,), (0,)), ((), ())), implementation="xla").reshape(S, NK, H)

    @jax.jit
    def ours(x, w):
        _, vjp = dot_product_attention_vjp(q, proj(x, w), v, implementation="xla")
        _, dk, _ = vjp(do)
        gemm = functools.partial(mx.mx_dot_general, implementation="xla", preferred_element_type=jnp.bfloat16)
        dx = gemm(dk.row, w, (((1,), (1,)), ((), ())))  # contracts features: row blocks
        dw = gemm(x, dk.col, (((0,), (0,)), ((), ())))  # contracts tokens: col blocks
        return dx, dw

    @jax.jit
    def autodiff(x, w):
        f = lambda x, w: mx.dot_product_attention(q, proj(x, w), v, implementation="xla")
        _, vjp = jax.vjp(f, x, w)
        return vjp(do)

    for a, b in zip(ours(x, w), autodiff(x, w), strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_varlen_mx_grads_and_bad_inputs():
    rng = fresh_rng()
    lq, lk = (40, 24), (50, 46)  # T_total_k = 96: a multiple of 32
    q = jnp.asarray(rng.standard_normal((sum(lq), N, H)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((sum(lk), NK, H)), jnp.bfloat16) for _ in range(2))
    do = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    cu_q, cu_k = (jnp.asarray(np.concatenate([[0], np.cumsum(x)]), jnp.int32) for x in (lq, lk))
    kw = dict(max_seqlen_q=max(lq), max_seqlen_k=max(lk), implementation="xla")
    _, vjp = varlen_attention_vjp(q, k, v, cu_q, cu_k, **kw)
    _, dk_mx, dv_mx = vjp(do)
    _, vjp_ref = jax.vjp(lambda *a: mx.varlen_attention(*a, cu_q, cu_k, **kw), q, k, v)
    _, dk, dv = vjp_ref(do)
    check_mx_gradient(dk_mx, dk, sum(lk))
    check_mx_gradient(dv_mx, dv, sum(lk))
    with pytest.raises(ValueError, match="multiple of 32"):
        k1, v1 = (jnp.concatenate([x, x[:1]]) for x in (k, v))  # 97 packed rows
        varlen_attention_vjp(q, k1, v1, cu_q, cu_k, **kw)[1](do)
    with pytest.raises(ValueError, match="d_out must have"):
        vjp(do[:-1])
    with pytest.raises(ValueError, match="MXArray"):
        dot_product_attention_vjp(q, mx.quantize(k, axis=-1), v)
    with pytest.raises(ValueError, match="scale_rounding"):
        dot_product_attention_vjp(q, k, v, grad_scale_rounding="down")
