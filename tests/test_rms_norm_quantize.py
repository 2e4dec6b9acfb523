"""rms_norm_quantize: output vs float64, MXArray bit-identical to a separate quantize, gradients, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mx_oracle
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.metrics import sqnr_db


def _inputs(seed, shape, dtype):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = (jax.random.normal(kx, shape) * 3.0 + 0.5).astype(dtype)
    w = (1.0 + 0.1 * jax.random.normal(kw, shape[-1:])).astype(jnp.float32)
    return x, w


def _rms_norm_f64(x, w, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(w, np.float64)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_output_and_quantized_output(dtype):
    x, w = _inputs(0, (4, 16, 256), dtype)
    y, y_mx = jax.jit(jax_mxfp8.rms_norm_quantize)(x, w)
    assert y.dtype == dtype and y_mx.data.shape == x.shape and y_mx.scale.shape == (4, 16, 8)
    # y is float64 RMSNorm rounded once to the output dtype (up to float32 arithmetic)
    assert sqnr_db(_rms_norm_f64(x, w, 1e-6), y) > (60 if dtype == jnp.float32 else 45)
    # the MXArray is exactly what the independent oracle makes of y
    q = mx_oracle.quantize(np.asarray(y.astype(jnp.float32)), axis=-1)
    np.testing.assert_array_equal(np.asarray(y_mx.data).view(np.uint8), q.data)
    np.testing.assert_array_equal(np.asarray(y_mx.scale), q.scale)


def test_gradients_match_autodiff_of_float64_formula():
    x, w = _inputs(1, (8, 64), jnp.float32)
    g = jax.random.normal(jax.random.key(2), x.shape)
    _, vjp = jax.vjp(lambda x, w: jax_mxfp8.rms_norm_quantize(x, w)[0], x, w)
    dx, dw = vjp(g)
    # independent reference: central finite differences are too noisy; use the closed form in float64
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    r = 1.0 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + 1e-6)
    gw = g64 * w64
    expect_dx = r * gw - x64 * r**3 * np.mean(gw * x64, -1, keepdims=True)
    expect_dw = np.sum(g64 * x64 * r, 0)
    assert sqnr_db(expect_dx, dx) > 60 and sqnr_db(expect_dw, dw) > 60
    # and the two agree with jax autodiff of the plain formula
    auto = jax.grad(lambda x: jnp.sum(g * (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w)))(x)
    assert sqnr_db(auto, dx) > 60


def test_feeds_mx_dot_general_without_a_second_quantize():
    x, w = _inputs(3, (64, 128), jnp.float32)
    kernel = jax.random.normal(jax.random.key(4), (128, 32))
    dn = (((1,), (0,)), ((), ()))

    def fused(x):
        y, y_mx = jax_mxfp8.rms_norm_quantize(x, w)
        return jnp.sum(jax_mxfp8.mx_dot_general(y, kernel, dn, lhs_quantized=y_mx) ** 2)

    def separate(x):
        y, _ = jax_mxfp8.rms_norm_quantize(x, w)
        return jnp.sum(jax_mxfp8.mx_dot_general(y, kernel, dn) ** 2)

    # each side one program (eager dispatch compiled ~30 s of small programs on CI's CPU)
    assert jax.jit(fused)(x) == jax.jit(separate)(x)
    np.testing.assert_array_equal(jax.jit(jax.grad(fused))(x), jax.jit(jax.grad(separate))(x))


@pytest.mark.parametrize(
    "x_shape,w_shape,dtype,match",
    [
        ((4, 48), (48,), jnp.float32, "multiple of the MX block"),
        ((4, 64), (32,), jnp.float32, "weight has shape"),
        ((4, 64), (64,), jnp.int32, "dtype"),
    ],
)
def test_bad_inputs(x_shape, w_shape, dtype, match):
    with pytest.raises(ValueError, match=match):
        jax_mxfp8.rms_norm_quantize(jnp.ones(x_shape, dtype), jnp.ones(w_shape))
