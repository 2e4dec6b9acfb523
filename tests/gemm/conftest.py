"""Fixtures of the GEMM tests: operands of mx_dot_general_quantized, and the skip for the GPU tests that need
the Hopper MX GEMM kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import mx_gemm as mg
from tests.seeding_testutil import test_seed


@pytest.fixture
def sm90_mx_gemm():
    """Skips unless the Hopper MX GEMM kernel can run here."""
    ok, why = library.kernels_runnable(mg.ARCHS)
    if not ok:
        pytest.skip(why)


@pytest.fixture(scope="module")
def quantized_gemm_data():
    """x (2, 48, 128) bfloat16, w (128, 96) float32, bias (96,) float32, output cotangent (2, 48, 96) bfloat16."""
    k = jax.random.split(jax.random.key(test_seed()), 4)
    x = jax.random.normal(k[0], (2, 48, 128), jnp.bfloat16)
    w = jax.random.normal(k[1], (128, 96), jnp.float32) * 0.2
    b = jax.random.normal(k[2], (96,), jnp.float32)
    ct = jax.random.normal(k[3], (2, 48, 96), jnp.bfloat16)
    return x, w, b, ct
