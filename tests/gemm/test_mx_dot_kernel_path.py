"""mx_dot_general's kernel path (ops/mx_dot_kernel.py): its path selection and what it refuses.

The kernel path's numerics against the reference and the unquantized product, per implementation, are in
tests/gemm/test_mx_dot_implementations.py. Here: the arguments the emulated kernel path refuses, the CPU
default (the reference), the policy of `choose_path` on a (faked) Hopper, Blackwell and consumer Blackwell
GPU, the fallback to jax.nn on Blackwell, and (GPU) the default taking the Hopper kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.ops import mx_dot_general as mdg
from jax_mxfp8.primitives import implementation, library
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


def test_forced_blackwell_falls_back_to_jax_nn(monkeypatch):
    """On compute capability 10.x the default takes our sm100 kernel path (ops/mx_dot_sm100.py; emulated
    under forced_gpu); a call it does not cover goes to jax.nn.scaled_dot_general (its scaled_matmul primitive
    in the jaxpr) when that covers it, else to the reference; "cuda" never takes cuDNN."""
    x, w = jnp.ones((64, 128), jnp.bfloat16), jnp.ones((128, 96), jnp.bfloat16)
    dn = (((1,), (0,)), ((), ()))

    def jaxpr(**kw):
        with implementation.record() as decisions:
            text = str(jax.make_jaxpr(lambda a, b: jax_mxfp8.mx_dot_general(a, b, dn, **kw))(x, w))
        return text, [d.path for d in decisions if d.op == "mx_dot_general"]

    with library.forced_gpu((10, 0)):
        assert jaxpr() == (jaxpr()[0], ["emulated"]) and "scaled_matmul" not in jaxpr()[0]
        assert jaxpr(implementation="cuda")[1] == ["emulated"]
        assert "scaled_matmul" not in jaxpr(implementation="xla")[0]
        assert "scaled_matmul" not in jaxpr(scale_rounding="floor")[0]  # ours covers it (jax.nn rounds up only)
        # the sm100 path takes float8_e4m3fn gradients only; jax.nn neither: the reference
        text, paths = jaxpr(grad_dtype=jnp.float8_e5m2)
        assert "scaled_matmul" not in text and paths == ["xla"]
        with pytest.raises(ValueError, match="float8_e4m3fn"):
            jaxpr(implementation="cuda", grad_dtype=jnp.float8_e5m2)
        # a call ours does not cover but jax.nn does: int32 offsets overflow (faked coverage gap)
        monkeypatch.setattr(mdg, "sm100_unsupported", lambda *a: "a faked coverage gap")
        text, paths = jaxpr()
        assert "scaled_matmul" in text and paths == ["cudnn"]
        grads = jax.make_jaxpr(jax.grad(lambda a, b: jnp.sum(jax_mxfp8.mx_dot_general(a, b, dn)), argnums=(0, 1)))
        assert str(grads(x, w)).count("scaled_matmul") >= 3  # forward, dgrad, wgrad


def test_forced_path_choice():
    """choose_path's policy per arch: Hopper (the Hopper kernel or its reason), Blackwell (ours, else cuDNN for
    implementation=None, else the reference), consumer Blackwell (the reference)."""
    cases = [
        ((None, None, None, None), "cuda"),
        ((None, "why", None, None), "xla"),
        (("xla", None, None, None), "xla"),
        (("emulated", None, None, None), "emulated"),
    ]
    orig = library.kernels_runnable, library.preload, library.gpu_cc
    try:
        library.kernels_runnable = lambda archs=None: (True, "")
        library.preload = lambda: None
        library.gpu_cc = lambda: (9, 0)
        for args, want in cases:
            path, backend = mdg.choose_path(*args)
            assert path == want and (backend is None) == (want == "xla"), args
            assert backend is None or backend.name == "sm90"
        with pytest.raises(ValueError, match="why"):
            mdg.choose_path("cuda", "why", None)
    finally:
        library.kernels_runnable, library.preload, library.gpu_cc = orig
    with library.forced_gpu((10, 3)):  # kernels picked run emulated
        path, backend = mdg.choose_path(None, "why", None, None)  # Hopper's reasons do not count
        assert (path, backend.name) == ("emulated", "sm100")
        assert mdg.choose_path(None, None, None, "sm100 why") == ("cudnn", None)
        assert mdg.choose_path(None, None, "no", "sm100 why") == ("xla", None)
        with pytest.raises(ValueError, match="sm100 why"):
            mdg.choose_path("cuda", None, None, "sm100 why")
    with library.forced_gpu((12, 0)):
        assert mdg.choose_path(None, None, None, None) == ("xla", None)


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_gpu_default_takes_the_kernel_on_hopper():
    if not library.kernels_runnable(("sm_90a",))[0]:
        pytest.skip(library.kernels_runnable(("sm_90a",))[1])
    x, w = jnp.ones((256, 512), jnp.bfloat16), jnp.ones((512, 256), jnp.bfloat16)
    hlo = jax.jit(lambda a, b: jax_mxfp8.mx_dot_general(a, b, (((1,), (0,)), ((), ())))).lower(x, w).as_text()
    assert "jax_mxfp8_mx_gemm" in hlo
