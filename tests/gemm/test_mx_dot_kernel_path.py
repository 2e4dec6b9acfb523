"""mx_dot_general's kernel path (ops/mx_dot_kernel.py): its path selection and what it refuses.

The kernel path's numerics against the reference and the unquantized product, per implementation, are in
tests/gemm/test_mx_dot_implementations.py. Here: the arguments the emulated kernel path refuses, the CPU
default (the reference), the policy of `choose_path` on a (faked) Hopper and Blackwell GPU, the jax.nn
dispatch on Blackwell, and (GPU) the default taking the Hopper kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.ops import mx_dot_general as mdg
from jax_mxfp8.primitives import library
from tests.seeding_testutil import test_rng


def test_emulated_rejects_what_the_kernel_does_not_cover():
    x, w = np.ones((64, 128), np.float32), np.ones((128, 64), np.float32)
    dn = (((1,), (0,)), ((), ()))
    with pytest.raises(ValueError, match="hadamard"):
        jax_mxfp8.mx_dot_general(x, w, dn, implementation="emulated", hadamard_seed=0)
    with pytest.raises(ValueError, match="stochastic"):
        jax_mxfp8.mx_dot_general(x, w, dn, implementation="emulated", grad_rounding="stochastic", rng=jax.random.key(0))
    with pytest.raises(ValueError, match="implementation="):
        jax_mxfp8.mx_dot_general(x, w, dn, implementation="bogus")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU fallback")
def test_cpu_default_is_the_reference_and_cuda_raises():
    rng = test_rng()
    x, w = rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal((128, 64)).astype(np.float32)
    dn = (((1,), (0,)), ((), ()))
    default = jax_mxfp8.mx_dot_general(x, w, dn)
    np.testing.assert_array_equal(
        np.asarray(default), np.asarray(jax_mxfp8.mx_dot_general(x, w, dn, implementation="xla"))
    )
    with pytest.raises(RuntimeError, match="implementation='cuda'"):
        jax_mxfp8.mx_dot_general(x, w, dn, implementation="cuda")


def test_forced_blackwell_dispatches_to_jax_nn(monkeypatch):
    """On compute capability 10.x the default and "cuda" take jax.nn.scaled_dot_general (its
    scaled_matmul primitive in the jaxpr); what jax.nn cannot express falls back to the reference."""
    monkeypatch.setattr(library, "gpu_major", lambda: 10)
    x, w = jnp.ones((64, 128), jnp.bfloat16), jnp.ones((128, 96), jnp.bfloat16)
    dn = (((1,), (0,)), ((), ()))

    def jaxpr(**kw):
        return str(jax.make_jaxpr(lambda a, b: jax_mxfp8.mx_dot_general(a, b, dn, **kw))(x, w))

    assert "scaled_matmul" in jaxpr()
    assert "scaled_matmul" in jaxpr(implementation="cuda")
    assert "scaled_matmul" not in jaxpr(implementation="xla")
    assert "scaled_matmul" not in jaxpr(scale_rounding="floor")  # jax.nn rounds scales up only
    with pytest.raises(ValueError, match="Blackwell"):
        jaxpr(implementation="cuda", weight_grad="bf16")
    grads = jax.make_jaxpr(jax.grad(lambda a, b: jnp.sum(jax_mxfp8.mx_dot_general(a, b, dn)), argnums=(0, 1)))
    assert str(grads(x, w)).count("scaled_matmul") >= 3  # forward, dgrad, wgrad


def test_forced_hopper_path_choice():
    """choose_path's policy on a Hopper GPU with kernels (the kernel or its reason) and on Blackwell."""
    cases = [
        ((None, None, None), "cuda"),
        ((None, "why", None), "xla"),
        (("xla", None, None), "xla"),
        (("emulated", None, None), "emulated"),
    ]
    orig = library.kernels_runnable, library.preload, library.gpu_major
    try:
        library.kernels_runnable = lambda archs=None: (True, "")
        library.preload = lambda: None
        library.gpu_major = lambda: 9
        for args, want in cases:
            assert mdg.choose_path(*args) == want, args
        with pytest.raises(ValueError, match="why"):
            mdg.choose_path("cuda", "why", None)
        library.gpu_major = lambda: 10
        assert mdg.choose_path(None, "why", None) == "cudnn"
        assert mdg.choose_path(None, None, "no") == "xla"
    finally:
        library.kernels_runnable, library.preload, library.gpu_major = orig


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_gpu_default_takes_the_kernel_on_hopper():
    if not library.kernels_runnable(("sm_90a",))[0]:
        pytest.skip(library.kernels_runnable(("sm_90a",))[1])
    x, w = jnp.ones((256, 512), jnp.bfloat16), jnp.ones((512, 256), jnp.bfloat16)
    hlo = jax.jit(lambda a, b: jax_mxfp8.mx_dot_general(a, b, (((1,), (0,)), ((), ())))).lower(x, w).as_text()
    assert "jax_mxfp8_mx_gemm" in hlo
