"""What runs on the GPU (pytest -m gpu tests/api/test_diagnostics_gpu.py on the H200): the loader uses the
pybind11 extension when it is built for this Python, and `python -m jax_mxfp8` reports the kernels for the
typical calls and warns about nothing. (The CPU side, with a faked GPU: test_diagnostics.py.)"""

from __future__ import annotations

import warnings

import pytest

from jax_mxfp8 import diagnostics
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
