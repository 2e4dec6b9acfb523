"""The BF16 linear of the Flax modules (flax/functional.bf16_linear): BF16 operands in the backward GEMMs too,
FP32 accumulation, and GEMMs that write the dtype their result is rounded to."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jax_mxfp8.flax import functional as F

DOT = re.compile(r"stablehlo.dot_general [^:]*: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)")
DOT_OUT = re.compile(
    r"stablehlo.dot_general [^:]*: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\) -> tensor<[^>]*x(\w+)>"
)


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


def _bf16(a) -> np.ndarray:
    """float64 -> nearest bfloat16 (ties to even), back in float64."""
    return np.asarray(np.asarray(a, np.float64).astype(np.float32).astype(jnp.bfloat16), np.float64)


def _assert_one_rounding(y, ref64, what, min_equal=0.99):
    """y is ref64 (float64) accumulated in float32 and rounded to bfloat16: bf16(y) equals bf16(ref64)
    except where float32 accumulation order decides a near-tie, and y is within one bf16 ulp (2^-7
    relative) everywhere. (A float32 y passes unrounded: XLA may drop a bf16 -> f32 convert pair.) A bf16
    accumulator fails: pairwise bf16 sums of 4096 terms round ~1 in 8 outputs differently, sequential
    ones are off by tens of percent."""
    y = np.asarray(y, np.float64)
    np.testing.assert_allclose(y, ref64, rtol=2.0**-7, atol=1e-6, err_msg=what)
    equal = np.mean(_bf16(y) == _bf16(ref64))
    assert equal >= min_equal, f"{what}: only {equal:.4f} of the outputs are the one rounding of the product"


@pytest.mark.parametrize("use_bias", [True, False])
def test_forward_rounds_the_float32_product_once_then_adds_the_bias(use_bias):
    x, kernel, bias, _ = _inputs()
    bias = bias if use_bias else None
    y = jax.jit(lambda x, k, b: F.bf16_linear(x, k, b, np.dtype(jnp.bfloat16)))(x, kernel, bias)
    assert y.dtype == jnp.bfloat16
    p64 = np.asarray(x, np.float64) @ _bf16(kernel)  # exact products of the bf16 operands, float64 sum
    if bias is None:
        _assert_one_rounding(y, p64, "no bias")
    else:
        # the GEMM writes bf16(p); the float32 bias is added to that and the sum rounded again
        ref = _bf16(np.asarray(_bf16(p64), np.float32) + np.asarray(bias, np.float32))
        np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=2.0**-7, atol=1e-6)
        assert np.mean(np.asarray(y, np.float64) == ref) >= 0.99


def test_float32_output_adds_the_bias_before_its_only_rounding():
    x, kernel, bias, _ = _inputs()
    x = x.astype(jnp.float32)  # exactly the bf16 values; out dtype float32
    y = jax.jit(lambda x, k, b: F.bf16_linear(x, k, b, np.dtype(jnp.float32)))(x, kernel, bias)
    ref = np.asarray(x, np.float64) @ _bf16(kernel) + np.asarray(bias, np.float64)
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=1e-5, atol=1e-5)


def test_gradients_match_autodiff_of_the_plain_formula():
    x, kernel, bias, ct = _inputs()
    ours = jax.jit(jax.grad(_loss(lambda x, k, b: F.bf16_linear(x, k, b, np.dtype(x.dtype))), (0, 1, 2)))
    ref = jax.jit(jax.grad(_loss(_plain), (0, 1, 2)))
    grads, grads_ref = ours(x, kernel, bias, ct), ref(x, kernel, bias, ct)
    # same exact bf16 x bf16 products (the cotangent is already bf16), each gradient rounded once; only the
    # summation order may differ: float32 dbias to ~1e-6; dx and dkernel (both rounded to bf16) to one bf16
    # ulp after the final rounding
    for g, r, rtol in zip(grads, grads_ref, (2.0**-7, 2.0**-7, 1e-6)):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), rtol=rtol, atol=1e-6)


def test_gemms_accumulate_in_float32():
    """K = 4096 positive terms: a bf16 accumulator (sequential or pairwise) would be off by several ulps
    of the result; float32 accumulation with one rounding to bf16 is the float64 sum rounded once."""
    k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
    x = jax.random.uniform(k1, (4096, 32), minval=0.5, maxval=1.5).astype(jnp.bfloat16)
    kernel = jax.random.uniform(k2, (32, 4096), minval=0.5, maxval=1.5)  # float32 parameter
    g = jax.random.uniform(k3, (4096, 4096), minval=0.5, maxval=1.5).astype(jnp.bfloat16)
    # forward contracts D_in = 32 here; x^T (32, 4096) as the input contracts 4096
    y = jax.jit(lambda a, k: F.bf16_linear(a, k, None, np.dtype(jnp.bfloat16)))(x.T, kernel.T)
    _assert_one_rounding(y, np.asarray(x.T, np.float64) @ _bf16(kernel.T), "forward")
    _, vjp = jax.vjp(lambda a, k: F.bf16_linear(a, k, None, np.dtype(jnp.bfloat16)), x, kernel)
    dx, dk = jax.jit(vjp)(g)
    g64, x64 = np.asarray(g, np.float64), np.asarray(x, np.float64)
    assert dx.dtype == jnp.bfloat16 and dk.dtype == jnp.float32
    _assert_one_rounding(dx, g64 @ _bf16(kernel).T, "dx (contracts D_out = 4096)")
    # dkernel comes back float32 (bf16-rounded by the GEMM on the GPU; XLA:CPU forms the bf16-out GEMM in
    # float32 and, allowed excess precision, may drop the bf16 -> f32 convert pair after it)
    _assert_one_rounding(dk, x64.T @ g64, "dkernel (contracts 4096 tokens)")


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


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("x_dtype, gemm_out", [(jnp.bfloat16, "bf16"), (jnp.float32, "f32")])
def test_gemms_write_the_dtype_they_are_rounded_to(use_bias, x_dtype, gemm_out):
    """bf16 activations: forward, dx and dkernel GEMMs all write bf16 (as a stock nnx.Linear(dtype=bf16)
    does), never a float32 product that a separate pass converts; float32 activations keep float32 out."""
    x, kernel, bias, ct = _inputs(2)
    x, ct = x.astype(x_dtype), ct.astype(x_dtype)
    f = _loss(lambda x, k, b: F.bf16_linear(x, k, b, np.dtype(x.dtype)))
    txt = jax.jit(jax.value_and_grad(f, (0, 1))).lower(x, kernel, bias if use_bias else None, ct).as_text()
    dots = DOT_OUT.findall(txt)
    # forward; dx; dkernel (bf16 whatever x is: it was always rounded to bf16)
    assert sorted(dots) == sorted([("bf16", "bf16", gemm_out)] * 2 + [("bf16", "bf16", "bf16")]), dots
