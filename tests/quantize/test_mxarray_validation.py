"""MXArray validates its fields at construction (ValueError naming the field), not in pytree unflattening."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.ops.cotangents import zero_cotangent

X = jnp.asarray(np.linspace(-3, 3, 4 * 64, dtype=np.float32).reshape(4, 64))


@pytest.fixture(scope="module")
def q():
    return mx.quantize(X)


def _bad_cases(q):
    sq = mx.quantize(jnp.ones((64, 64)), block="square")
    return [
        (dict(scale=q.scale.astype(jnp.float32)), "scale has dtype float32"),
        (dict(scale=q.scale[:, :1]), r"scale has shape \(4, 1\).*needs scale shape \(4, 2\)"),
        (dict(scale=q.scale[None]), "scale has shape"),
        (dict(data=q.data.astype(jnp.float32)), "data has dtype float32"),
        (dict(data=jnp.zeros((4, 48), jnp.float8_e4m3fn), scale=jnp.zeros((4, 1), jnp.uint8)), "not a multiple of 32"),
        (dict(block="bogus"), "block='bogus'"),
        (dict(block="square"), r"axes=\(-1,\): block='square' takes exactly 2"),
        (dict(axes=(5,)), "axes=.*negative"),
        (dict(axes=(1,)), "axes=.*negative"),
        (dict(axes=(-3,)), "axes=.*out of range"),
        (dict(axes=(-1, -2)), "block='row' takes exactly 1"),
        (dict(axes="a"), "axes="),
        (dict(axes=(-1.0,)), "axes="),
        (dict(data=sq.data, scale=sq.scale, axes=(-1, -1), block="square"), "same axis twice"),
    ]


def test_bad_fields_raise_value_error_naming_the_field(q):
    for change, match in _bad_cases(q):
        fields = dict(data=q.data, scale=q.scale, axes=q.axes, block=q.block) | change
        with pytest.raises(ValueError, match=match):
            mx.MXArray(**fields)


def test_bad_scale_shape_no_longer_reaches_a_reshape_error(q):
    with pytest.raises(ValueError, match="scale"):
        mx.dequantize(mx.MXArray(q.data, q.scale[:, :1], (-1,), "row"))


def test_valid_arrays_and_transformations_still_work(q):
    assert mx.MXArray(q.data, q.scale, [-1], "row").axes == (-1,)  # a list is normalised to a (static) tuple
    np.testing.assert_array_equal(jax.jit(mx.dequantize)(q), mx.dequantize(q))
    qs = jax.vmap(lambda x: mx.quantize(x))(jnp.stack([X, 2 * X]))  # batched leaves
    assert qs.scale.shape == (2, 4, 2) and qs.axes == (-1,)
    np.testing.assert_array_equal(jax.vmap(mx.dequantize)(qs)[1], mx.dequantize(mx.quantize(2 * X)))
    # unflattening with other leaves: float0 cotangents, scalars, placeholders, shape structs, key paths
    assert zero_cotangent(q).scale.dtype == jax.dtypes.float0
    assert jax.tree.map(jnp.sum, q).data.shape == ()
    assert jax.tree.map(lambda _: None, q).data is None
    assert jax.eval_shape(lambda x: mx.quantize(x), X).scale.shape == (4, 2)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(q)[0]]
    assert paths == [".data", ".scale"]
    # an MXArray operand of a differentiated op gets a (zero, float0) cotangent without tripping the checks
    w = jnp.ones((64, 8), jnp.float32)
    g = jax.grad(lambda w: jnp.sum(mx.mx_dot_general(q, w, (((1,), (0,)), ((), ())))))(w)
    assert g.shape == w.shape
