"""GPU checks of the user-facing pieces (pytest -m gpu tests/api/test_ux_gpu.py on the H200): the loader uses the
pybind11 extension when it is built for this Python, `python -m jax_mxfp8` reports the kernels for the
typical calls and warns about nothing, and the BF16 twin of jagged attention runs cuDNN's fused attention
on the padded batch (no T_total x T_total scores)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest

from jax_mxfp8 import diagnostics
from jax_mxfp8.flax import functional as F
from jax_mxfp8.flax.policy import PrecisionPolicy
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library

pytestmark = pytest.mark.gpu


def test_binding_and_decisions_on_the_gpu():
    ok, why = library.kernels_runnable(("sm_90a",))
    if not ok:
        pytest.skip(why)
    assert library.binding() == ("pybind11 extension" if library.extension_path().exists() else "ctypes")
    assert library.build_info().get("ffi_api") == "0.3"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decisions = {d.op: d for d in diagnostics.op_decisions()}
    for op in ("quantize", "dequantize", "rms_norm_quantize", "mx_dot_general", "dot_product_attention"):
        assert decisions[op].path == "cuda", decisions[op]
    assert decisions["varlen_attention"].path == "cuda", decisions["varlen_attention"]
    for op in ("mx_dot_general_quantized", "dot_product_attention_vjp", "broadcast_query_attention"):
        assert decisions[op].path == "cuda", decisions[op]
    assert "dK, dV quantized (row and column blocks) by: cuda" in decisions["dot_product_attention_vjp"].reason
    assert not [w for w in caught if issubclass(w.category, impl.KernelFallbackWarning)]
    assert "compute capability 9.0" in diagnostics.report()


def test_bf16_jagged_attention_runs_cudnn():
    cu = jnp.array([0, 300, 1000, 1024], jnp.int32)
    q = jax.random.normal(jax.random.key(0), (1024, 8, 128), jnp.bfloat16)
    kv = jax.random.normal(jax.random.key(1), (1024, 2, 128), jnp.bfloat16)
    prec = PrecisionPolicy.bf16().for_layer("attn")

    def loss(q, k, v):
        return jnp.sum(F.jagged_attention(q, k, v, cu, 704, prec, is_causal=True).astype(jnp.float32) ** 2)

    text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).as_text()
    assert "__cudnn$fmha" in text  # cuDNN's fused attention, forward and backward
    assert "1024x1024" not in text
    val, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, kv, kv)
    assert jnp.isfinite(val) and all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
