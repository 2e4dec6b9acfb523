"""mx_dot_general_quantized (ops/mx_dot_quantized.py): the GEMM whose output also leaves as an MXArray.

CPU. The contract: with p = the float32 GEMM result (+ bias), y_q = quantize(act(p)) along the last axis
and y = act(p.astype(out_dtype)), gradients those of autodiff through y; checked per implementation against
the same composition built from mx_dot_general on the same path in tests/gemm/test_mx_dot_implementations.py.
Here: the fallback with its reason (implementation=None / "emulated" on calls the epilogue does not cover)
and ValueErrors.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from jax_mxfp8.ops.mx_dot_quantized import mx_dot_general_quantized
from jax_mxfp8.primitives import implementation as impl

DN = (((2,), (0,)), ((), ()))


def test_fallback_reason_and_cuda_raises(quantized_gemm_data):
    """A call the epilogue does not cover (float32 output) takes the two-pass path with implementation=None,
    with the reason recorded; "emulated" raises ValueError with it."""
    x, w, b, _ = quantized_gemm_data
    with impl.record() as decisions:
        y, q = mx_dot_general_quantized(x, w, DN, preferred_element_type=jnp.float32)
    mine = [d for d in decisions if d.op == "mx_dot_general_quantized"]
    assert mine[0].path == "xla" and mine[0].reason  # on CPU: the backend; on an H200: the output dtype
    assert y.dtype == jnp.float32 and q.data.dtype == jnp.float8_e4m3fn
    with pytest.raises(ValueError, match="bfloat16"):
        mx_dot_general_quantized(x, w, DN, preferred_element_type=jnp.float32, implementation="emulated")


@pytest.mark.parametrize(
    "kwargs, shape, fragment",
    [
        ({"activation": "relu"}, (128, 96), "activation"),
        ({}, (128, 48), "multiple of 32"),
        ({"implementation": "gpu"}, (128, 96), "implementation"),
    ],
)
def test_bad_arguments_raise(kwargs, shape, fragment):
    x = jnp.ones((16, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match=fragment):
        mx_dot_general_quantized(x, jnp.ones(shape, jnp.float32), (((1,), (0,)), ((), ())), **kwargs)
