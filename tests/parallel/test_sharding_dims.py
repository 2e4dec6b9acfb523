"""mx_dot_general keeps sharded free dimensions apart, on 8 CPU devices.

Activations (B, T, D) sharded over batch AND sequence, P("data", "model", None) on a 2x4 mesh, with a
replicated weight: lax.dot_general needs no collective in the forward and only the weight-gradient
all-reduce in the backward; flattening (B, T) into the MX GEMM's rows would force an all-gather
(reference/gemm_dims.py keeps them apart). The same program must also run on meshes with Explicit axes
(jax.make_mesh's default), which refuse that flattening reshape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp8 as mx
from tests.parallel.sharding_testutil import collectives, mesh, put

DN = (((2,), (0,)), ((), ()))
SHAPE_X, SHAPE_W = (4, 256, 128), (128, 96)  # 64 sequence rows per device: whole 32-row blocks


def _loss(dot):
    return lambda x, w: jnp.sum(jnp.sin(dot(x, w, DN)))


def _xw():
    return (
        jax.random.normal(jax.random.key(91), SHAPE_X, jnp.float32),
        jax.random.normal(jax.random.key(92), SHAPE_W, jnp.float32),
    )


def _unsharded():
    x, w = _xw()
    out = jax.jit(lambda x, w: mx.mx_dot_general(x, w, DN))(x, w)
    return out, jax.jit(jax.grad(_loss(mx.mx_dot_general), (0, 1)))(x, w)


def test_batch_and_sequence_sharded_activations_need_no_gather():
    m = mesh((2, 4), ("data", "model"))
    x, w = _xw()
    xs, ws = put(x, m, "data", "model", None), put(w, m)
    fwd = collectives(lambda x, w: mx.mx_dot_general(x, w, DN), xs, ws)
    assert fwd == collectives(lambda x, w: jax.lax.dot_general(x, w, DN), xs, ws) == []
    grad = sorted(collectives(jax.grad(_loss(mx.mx_dot_general), (0, 1)), xs, ws))
    assert grad == sorted(collectives(jax.grad(_loss(jax.lax.dot_general), (0, 1)), xs, ws)), grad
    assert {op for op, _ in grad} <= {"all-reduce"}
    want, (gx1, gw1) = _unsharded()
    np.testing.assert_array_equal(jax.jit(lambda x, w: mx.mx_dot_general(x, w, DN))(xs, ws), want)
    gx, gw = jax.jit(jax.grad(_loss(mx.mx_dot_general), (0, 1)))(xs, ws)
    np.testing.assert_array_equal(gx, gx1)
    np.testing.assert_allclose(gw, gw1, rtol=1e-5, atol=1e-4)  # the all-reduce sums in another order


def test_explicit_axis_mesh():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices")
    m = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    x, w = _xw()
    xs = jax.device_put(x, NamedSharding(m, P("data", "model", None)))
    ws = jax.device_put(w, NamedSharding(m, P()))
    out = jax.jit(lambda x, w: mx.mx_dot_general(x, w, DN))(xs, ws)
    assert out.sharding.spec == P("data", "model", None)
    gx, gw = jax.jit(jax.grad(_loss(mx.mx_dot_general), (0, 1)))(xs, ws)
    assert gx.sharding.spec == P("data", "model", None) and gw.sharding.spec == P(None, None)
    want, (gx1, gw1) = _unsharded()
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(gx, gx1)
    np.testing.assert_allclose(gw, gw1, rtol=1e-5, atol=1e-4)
    # 2-D activations (the layout the 3-D path would serve elsewhere), bf16 weight gradient
    x2 = jax.device_put(x.reshape(-1, x.shape[-1]), NamedSharding(m, P("data", None)))
    dn2 = (((1,), (0,)), ((), ()))
    g2 = jax.jit(jax.grad(lambda x, w: jnp.sum(mx.mx_dot_general(x, w, dn2, weight_grad="bf16")), (0, 1)))(x2, ws)
    assert g2[0].sharding.spec == P("data", None) and g2[1].sharding.spec == P(None, None)


def _out_shape(x_shape, w_shape, dn):
    """lax.dot_general's output shape: batch dims, lhs free dims, rhs free dims."""
    return jax.eval_shape(lambda x, w: jax.lax.dot_general(x, w, dn), jnp.zeros(x_shape), jnp.zeros(w_shape)).shape


def test_dims_layout_equals_the_3d_reference():
    """gemm_dims keeps the 3-D reference's numerics: several free and contracting dims, a ragged last
    free dimension (M flattened there), batch dims, bf16 weight gradients."""
    from jax_mxfp8.config.gemm import MXDotConfig
    from jax_mxfp8.reference import gemm, gemm_dims

    rng = np.random.default_rng(93)
    cases = [
        ((3, 2, 40, 64), (64, 2, 24), (((3,), (0,)), ((), ())), MXDotConfig()),  # free (3, 2, 40): ragged 40
        ((2, 64, 4, 32), (2, 4, 32, 48), (((2, 3), (1, 2)), ((0,), (0,))), MXDotConfig()),  # batch, 2 contract
        ((2, 96, 64), (64, 33), (((2,), (0,)), ((), ())), MXDotConfig(weight_grad="bf16")),
    ]
    for xs, ws, dn, config in cases:
        x, w = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in (xs, ws))
        lhs_l, rhs_l = gemm.operand_layouts(x.shape, w.shape, dn)
        b, m, n = (int(np.prod(d)) for d in (lhs_l.dims(lhs_l.batch), lhs_l.dims(lhs_l.free), rhs_l.dims(rhs_l.free)))
        g = jnp.asarray(rng.standard_normal(_out_shape(x.shape, w.shape, dn)), jnp.float32)

        # Each side is one program (eager dispatch compiled ~100 s of small programs on the 2-core CI).
        @jax.jit
        def dims_side(x, w, g, lhs_l=lhs_l, rhs_l=rhs_l, config=config):
            out = gemm_dims.forward(x, w, lhs_l, rhs_l, config)
            return out, gemm_dims.backward(x, w, g, lhs_l, rhs_l, config, None)

        @jax.jit
        def three_d_side(x, w, g, lhs_l=lhs_l, rhs_l=rhs_l, config=config, bmn=(b, m, n)):
            x3, w3 = lhs_l.to_3d(x), rhs_l.to_3d(w)
            out3 = gemm.mx_dot_forward(x3, w3, config, lhs_q3=None, rhs_q3=None)
            dx3, dw3 = gemm.mx_dot_backward(x3, w3, g.reshape(bmn), config, None)
            return out3, lhs_l.from_3d(dx3), rhs_l.from_3d(dw3)

        out, (dx, dw) = dims_side(x, w, g)
        out3, dx3, dw3 = three_d_side(x, w, g)
        assert out.shape == g.shape
        np.testing.assert_allclose(out, out3.reshape(out.shape), rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(dx, dx3, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(dw, dw3, rtol=1e-6, atol=1e-5)


def test_explicit_axis_mesh_attention_and_square_quantize():
    """The attention reference (square-block quantize reshapes) on an Explicit-axis mesh, batch over "data"
    and heads over "model"; results equal the unsharded ones."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices")
    m = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    q = jax.random.normal(jax.random.key(94), (2, 128, 4, 64), jnp.float32)
    qe = jax.device_put(q, NamedSharding(m, P("data", None, "model", None)))

    def loss(q):
        return jnp.sum(jnp.sin(mx.dot_product_attention(q, 0.5 * q, q, is_causal=True)))

    sq = jax.jit(lambda q: mx.quantize(q, axis=(-3, -1), block="square"))
    a, b = sq(qe), sq(q)
    np.testing.assert_array_equal(np.asarray(a.data, np.float32), np.asarray(b.data, np.float32))
    np.testing.assert_array_equal(a.scale, b.scale)
    g = jax.jit(jax.grad(loss))(qe)
    assert g.sharding.spec == P("data", None, "model", None)
    np.testing.assert_allclose(g, jax.jit(jax.grad(loss))(q), rtol=1e-5, atol=1e-5)
