"""The BF16 linear of the Flax modules (flax/functional.bf16_linear): BF16 operands in the backward GEMMs too."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jax_mxfp8.flax import functional as F

DOT = re.compile(r"stablehlo.dot_general [^:]*: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)")


def _inputs(seed=0):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(k1, (2, 16, 64)).astype(jnp.bfloat16)
    kernel = jax.random.normal(k2, (64, 96)) / 8  # float32 parameter
    bias = jax.random.normal(k3, (96,))
    ct = jax.random.normal(k4, (2, 16, 96)).astype(jnp.bfloat16)
    return x, kernel, bias, ct


def _plain(x, kernel, bias):
    """The formula the modules used before: autodiff hands its backward float32 operands."""
    y = lax.dot_general(
        x.astype(jnp.bfloat16),
        kernel.astype(jnp.bfloat16),
        (((2,), (0,)), ((), ())),
        preferred_element_type=jnp.float32,
    )
    return (y + bias).astype(x.dtype)


def _loss(f):
    return lambda x, kernel, bias, ct: jnp.sum(f(x, kernel, bias) * ct, dtype=jnp.float32)


def test_values_and_gradients_match_autodiff_of_the_plain_formula():
    x, kernel, bias, ct = _inputs()
    ours = jax.jit(jax.value_and_grad(_loss(lambda x, k, b: F.bf16_linear(x, k, b, np.dtype(x.dtype))), (0, 1, 2)))
    ref = jax.jit(jax.value_and_grad(_loss(_plain), (0, 1, 2)))
    (v, grads), (v_ref, grads_ref) = ours(x, kernel, bias, ct), ref(x, kernel, bias, ct)
    np.testing.assert_array_equal(v, v_ref)  # the same forward computation
    # same exact bf16 x bf16 products (the cotangent is already bf16); only the summation order may differ:
    # float32 dbias to ~1e-6; dx and dkernel (both rounded to bf16) to one bf16 ulp after the final rounding
    # (measured on XLA:CPU: bit-identical)
    for g, r, rtol in zip(grads, grads_ref, (2.0**-7, 2.0**-7, 1e-6)):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("use_bias", [True, False])
def test_backward_gemms_take_bf16_operands(use_bias):
    x, kernel, bias, ct = _inputs(1)
    bias = bias if use_bias else None
    f = _loss(lambda x, k, b: F.bf16_linear(x, k, b, np.dtype(jnp.bfloat16)))
    txt = jax.jit(jax.grad(f, (0, 1))).lower(x, kernel, bias, ct).as_text()
    dots = DOT.findall(txt)
    assert len(dots) == 2 and all(d == ("bf16", "bf16") for d in dots), dots
    plain = jax.jit(jax.grad(_loss(_plain), (0, 1))).lower(x, kernel, jnp.zeros(96), ct).as_text()
    assert ("f32", "f32") in DOT.findall(plain)  # what the custom_vjp is for
