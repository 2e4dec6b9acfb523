"""Fixtures of the attention tests: skips for the GPU tests that need a Hopper attention kernel.

A GPU module selects one with `pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90_attention_fwd")]`.
"""

from __future__ import annotations

import pytest

from jax_mxfp8.primitives import attention_fwd as afwd
from jax_mxfp8.primitives import library


@pytest.fixture
def sm90_attention_fwd():
    """Skips unless the Hopper attention forward kernel can run here."""
    ok, why = library.kernels_runnable(afwd.ARCHS)
    if not ok:
        pytest.skip(why)


@pytest.fixture
def sm90_attention_bwd():
    """Skips unless the Hopper attention backward kernel (its `_into` target) can run here."""
    ok, why = library.kernels_runnable(("sm_90a",))
    if not ok:
        pytest.skip(why)
    if "jax_mxfp8_attention_bwd_into" not in library.ffi_targets():
        pytest.skip("the library has no jax_mxfp8_attention_bwd target")
