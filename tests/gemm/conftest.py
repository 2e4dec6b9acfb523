"""Fixtures of the GEMM tests: the skip for the GPU tests that need the Hopper MX GEMM kernel."""

from __future__ import annotations

import pytest

from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import mx_gemm as mg


@pytest.fixture
def sm90_mx_gemm():
    """Skips unless the Hopper MX GEMM kernel can run here."""
    ok, why = library.kernels_runnable(mg.ARCHS)
    if not ok:
        pytest.skip(why)
