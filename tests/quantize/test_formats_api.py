"""API behaviour of quantize / dequantize / MXArray: argument errors, and the MXArray as a pytree under jit, vmap,
tree_map, device_put and grad. Expected values come from the NumPy oracle, never from the library itself."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from tests.quantize import mx_oracle as orc
from tests.quantize.mx_testutil import data_bytes, lib_dequantize, log_uniform_blocks, scale_bytes


def _x(shape, axes, seed=0):
    return log_uniform_blocks(np.random.default_rng(seed), shape, axes, -6, 6, spread=8)


# ---------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, kwargs, axis_named",
    [
        ((8, 48), {}, 1),
        ((48, 64), {"axis": 0}, 0),
        ((4, 64, 40), {"axis": -1}, 2),
        ((64, 16), {"block": "square"}, 1),
        ((48, 64), {"block": "square"}, 0),
        ((3, 64, 64, 33), {"block": "square", "axis": (1, 3)}, 3),
        ((2, 0), {}, 1),  # zero-size: not a positive multiple
    ],
)
def test_indivisible_axis_raises_naming_the_axis(shape, kwargs, axis_named):
    x = jnp.ones(shape, jnp.float32)
    with pytest.raises(ValueError) as e:
        mx.quantize(x, **kwargs)
    msg = str(e.value)
    assert re.search(rf"\baxis\b\D*\b({axis_named}|{axis_named - len(shape)})\b", msg), msg
    assert "32" in msg


@pytest.mark.parametrize("in_dtype", [jnp.int32, jnp.int8, jnp.uint8, jnp.bool_, jnp.float8_e4m3fn])
def test_unsupported_input_dtype_raises(in_dtype):
    with pytest.raises(ValueError, match="dtype"):
        mx.quantize(jnp.ones((2, 32), in_dtype))


@pytest.mark.parametrize("elem", [jnp.float16, jnp.bfloat16, jnp.float32, jnp.int8, jnp.float8_e4m3fnuz, "e4m3"])
def test_unsupported_element_dtype_raises(elem):
    with pytest.raises(ValueError, match="dtype"):
        mx.quantize(jnp.ones((2, 32)), dtype=elem)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"block": "col"}, "block"),
        ({"block": "ROW"}, "block"),
        ({"scale_rounding": "nearest"}, "scale_rounding"),
        ({"scale_rounding": "ceil"}, "scale_rounding"),
        ({"rounding": "truncate"}, "rounding"),
        ({"rng": jax.random.key(0)}, "rng"),  # a key with rounding="nearest" is a mistake, not ignored
        ({"axis": 2}, "axis"),
        ({"axis": (0, 1)}, "axis"),  # two axes for row blocks
        ({"block": "square", "axis": (1, 1)}, "axis"),
        ({"block": "square", "axis": 0}, "axis"),
    ],
)
def test_bad_options_raise(kwargs, word):
    with pytest.raises(ValueError, match=word):
        mx.quantize(jnp.ones((32, 64)), **kwargs)


def test_errors_raise_under_jit_too():
    f = jax.jit(lambda x: mx.quantize(x))
    with pytest.raises(ValueError, match="axis"):
        f(jnp.ones((4, 40)))


# ---------------------------------------------------------------------------------------------------------
# Pytree behaviour
# ---------------------------------------------------------------------------------------------------------


def test_mxarray_is_a_pytree_with_static_axes_and_block():
    x = _x((64, 64), (0, 1))
    q = jax.jit(lambda v: mx.quantize(v, block="square"))(x)
    leaves, treedef = jax.tree.flatten(q)
    assert len(leaves) == 2
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.uint8)}
    r = jax.tree.unflatten(treedef, leaves)
    assert isinstance(r, mx.MXArray) and r.axes == (-2, -1) and r.block == "square"
    assert q.shape == (64, 64) and q.ndim == 2 and q.dtype == jnp.float8_e4m3fn and q.positive_axes() == (0, 1)
    # tree_map over leaves keeps the metadata; slicing a non-blocked leading axis stays a valid MXArray.
    y = _x((6, 64), (1,))
    q = jax.jit(mx.quantize)(jnp.asarray(y))
    sliced = jax.tree.map(lambda leaf: leaf[2:4], q)
    assert isinstance(sliced, mx.MXArray) and sliced.axes == (-1,) and sliced.block == "row"
    ref = orc.quantize(y[2:4])
    np.testing.assert_array_equal(data_bytes(sliced), ref.data)
    np.testing.assert_array_equal(lib_dequantize(sliced), orc.dequantize(ref.data, ref.scale, ref.axes, ref.fmt))


def test_device_put_and_jit_roundtrip():
    y = _x((8, 64), (1,))
    q = jax.device_put(jax.jit(lambda v: mx.quantize(v, dtype=jnp.float8_e5m2))(y), jax.devices("cpu")[0])
    assert isinstance(q, mx.MXArray) and q.dtype == jnp.float8_e5m2
    q2 = jax.jit(lambda a: a)(q)  # an MXArray passes through jit unchanged
    ref = orc.quantize(y, dtype=jnp.float8_e5m2)
    np.testing.assert_array_equal(data_bytes(q2), ref.data)
    np.testing.assert_array_equal(scale_bytes(q2), ref.scale)
    assert q2.axes == (-1,) and q2.block == "row"


@pytest.mark.parametrize(
    "inner_shape, kwargs, inner_axes",
    [
        ((16, 64), {}, (1,)),
        ((64, 16), {"axis": 0}, (0,)),
        ((32, 64), {"block": "square"}, (0, 1)),
    ],
)
def test_vmap_batches_leaves_and_keeps_axes(inner_shape, kwargs, inner_axes):
    """vmap adds a leading batch axis to data and scale; negative axes still point at the blocked axes."""
    B = 3
    x = np.stack([_x(inner_shape, inner_axes, seed=s) for s in range(B)])
    q = jax.jit(jax.vmap(lambda v: mx.quantize(v, **kwargs)))(x)
    assert q.data.shape == x.shape
    assert q.axes == tuple(a - len(inner_shape) for a in inner_axes)
    batched_axes = tuple(a + 1 for a in inner_axes)
    assert q.positive_axes() == batched_axes
    ref = orc.quantize(x, axis=batched_axes if len(batched_axes) == 2 else batched_axes[0], block=q.block)
    np.testing.assert_array_equal(data_bytes(q), ref.data)
    np.testing.assert_array_equal(scale_bytes(q), ref.scale)
    want = orc.dequantize(ref.data, ref.scale, ref.axes, ref.fmt)
    np.testing.assert_array_equal(lib_dequantize(q), want)  # dequantize of the batched MXArray (whole)
    per_item = jax.jit(jax.vmap(mx.dequantize))(q)  # and of each item under vmap
    np.testing.assert_array_equal(np.asarray(per_item), want)


def test_vmap_over_stochastic_keys_and_in_axes_none():
    x = jnp.asarray(_x((4, 64), (1,)))
    keys = jax.random.split(jax.random.key(0), 5)
    q = jax.jit(jax.vmap(lambda k: mx.quantize(x, rounding="stochastic", rng=k)))(keys)
    assert q.data.shape == (5, 4, 64) and q.scale.shape == (5, 4, 2) and q.axes == (-1,)
    q1 = jax.jit(mx.quantize)(x)
    out = jax.jit(jax.vmap(lambda a, b: mx.dequantize(a) * b, in_axes=(None, 0)))(q1, jnp.arange(3.0))
    ref = orc.quantize(np.asarray(x))
    want = orc.dequantize(ref.data, ref.scale, ref.axes, ref.fmt)
    np.testing.assert_array_equal(np.asarray(out), np.arange(3.0, dtype=np.float32)[:, None, None] * want)


# ---------------------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_dtype", [jnp.float32, jnp.bfloat16])
def test_fake_quantize_gradient_is_straight_through(in_dtype):
    """d/dx sum(w * fake_quantize(x)) == w exactly, whatever the block scale (the cotangent never passes through
    an FP8 cast). Autodiff through the FP8 cast would round w to the E4M3 grid at the scale, flush it to 0 for
    small x and overflow it to NaN for large x."""
    rng = np.random.default_rng(5)
    magnitude = np.logspace(-30, 30, 32)[:, None]  # one per row: row blocks see scales from 2**-108 to 2**91
    x = jnp.asarray(rng.standard_normal((32, 64)) * magnitude, jnp.float32).astype(in_dtype)
    w = jnp.asarray(rng.standard_normal((32, 64)), in_dtype)
    fq = mx.formats.fake_quantize
    g = jax.jit(jax.grad(lambda v: jnp.sum(w * fq(v))))(x)
    assert g.dtype == in_dtype
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
    # Also with square blocks, E5M2, floor, and stochastic rounding with a key (the key gets no cotangent).
    key = jax.random.key(0)
    kw = dict(block="square", axis=(0, 1), dtype=jnp.float8_e5m2, scale_rounding="floor", rounding="stochastic")
    g2 = jax.jit(jax.grad(lambda v: jnp.sum(w * fq(v, rng=key, **kw))))(x)
    np.testing.assert_array_equal(np.asarray(g2, np.float32), np.asarray(w, np.float32))
    # The forward value is unchanged by the custom gradient: bytes of the oracle.
    ref = orc.quantize(np.asarray(x), scale_rounding="up")
    want = orc.dequantize(ref.data, ref.scale, ref.axes, ref.fmt).astype(np.asarray(x).dtype)
    np.testing.assert_array_equal(np.asarray(jax.jit(fq)(x), np.float32), want.astype(np.float32))


def test_grad_through_quantize_is_zero_and_finite():
    """quantize is documented as non-differentiable (zero gradient): FP8 leaves cannot carry an exact cotangent.
    grad of sum(dequantize(quantize(x))) must at least be well defined: zeros, never NaN."""
    for magnitude in (1e-3, 1.0, 1e30):
        x = jnp.asarray(np.random.default_rng(6).standard_normal((4, 64)) * magnitude, jnp.float32)
        g = jax.jit(jax.grad(lambda v: jnp.sum(mx.dequantize(mx.quantize(v)))))(x)
        np.testing.assert_array_equal(np.asarray(g), np.zeros((4, 64), np.float32))


def test_grad_with_mxarray_as_nondifferentiated_argument():
    y = _x((8, 64), (1,))
    q = jax.jit(mx.quantize)(jnp.asarray(y))
    w = jnp.asarray(np.random.default_rng(2).standard_normal((8, 64)), jnp.float32)
    loss = lambda w, a: jnp.sum(w * mx.dequantize(a))
    gw = jax.jit(jax.grad(loss))(w, q)
    ref = orc.quantize(y)
    np.testing.assert_array_equal(np.asarray(gw), orc.dequantize(ref.data, ref.scale, ref.axes, ref.fmt))
    v, gw2 = jax.jit(jax.value_and_grad(loss, argnums=0))(w, q)
    np.testing.assert_array_equal(np.asarray(gw2), np.asarray(gw))


def test_fake_quantize_is_dequantize_of_quantize_in_input_dtype():
    y = _x((4, 64), (1,)).astype(jnp.bfloat16)
    out = jax.jit(lambda v: mx.formats.fake_quantize(v, scale_rounding="floor", axis=[-1]))(jnp.asarray(y))
    assert out.dtype == jnp.bfloat16
    ref = orc.quantize(y, scale_rounding="floor")
    want = orc.dequantize(ref.data, ref.scale, ref.axes, ref.fmt).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(out, np.float32), want.astype(np.float32))
