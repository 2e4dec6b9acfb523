"""The `implementation=` switch of the public ops on a machine without the kernels (CPU CI): "xla" and
None use the reference, "cuda" raises a clear RuntimeError, anything else a ValueError. The GPU side
(None picking the kernel, bit-exactness) is in tests/rms_norm/test_rms_norm_quantize_gpu.py."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8 import formats
from jax_mxfp8.primitives import library
from jax_mxfp8.reference.rms_norm import rms_norm_quantize_fwd

_kernels, _ = library.kernels_runnable()


def test_public_signatures_extend_formats():
    for public, base in ((jax_mxfp8.quantize, formats.quantize), (jax_mxfp8.dequantize, formats.dequantize)):
        p = inspect.signature(public).parameters
        b = inspect.signature(base).parameters
        assert list(p)[:-1] == list(b)
        assert all(p[n].default == b[n].default and p[n].kind == b[n].kind for n in b)
        assert p["implementation"].default is None and p["implementation"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("implementation", [None, "xla"])
def test_reference_paths_match_formats(implementation):
    x = jax.random.normal(jax.random.key(0), (64, 96), jnp.float32) * 10
    for kw in (dict(), dict(axis=0), dict(block="square", axis=(0, 1)), dict(scale_rounding="floor")):
        got = jax_mxfp8.quantize(x, implementation=implementation, **kw)
        want = formats.quantize(x, **kw)
        if not _kernels:  # on a GPU with kernels, None may pick the (bit-identical) kernel
            np.testing.assert_array_equal(np.asarray(got.scale), np.asarray(want.scale))
        np.testing.assert_array_equal(np.asarray(got.data, np.float32), np.asarray(want.data, np.float32))
        assert (got.axes, got.block) == (want.axes, want.block)
        np.testing.assert_array_equal(
            np.asarray(jax_mxfp8.dequantize(got, implementation=implementation)),
            np.asarray(formats.dequantize(want)),
        )
    w = jnp.linspace(0.5, 1.5, 96)
    y, q = jax_mxfp8.rms_norm_quantize(x, w, implementation=implementation)
    y_ref, q_ref = rms_norm_quantize_fwd(x, w, 1e-6, dtype=jnp.float8_e4m3fn, scale_rounding="up")
    if not _kernels:
        np.testing.assert_array_equal(np.asarray(y), np.asarray(y_ref))
        np.testing.assert_array_equal(np.asarray(q.scale), np.asarray(q_ref.scale))


def test_stochastic_rounding_and_rng_checks_survive_the_wrapper():
    x = jnp.ones((32, 32))
    with pytest.raises(ValueError, match="rng"):
        jax_mxfp8.quantize(x, rng=jax.random.key(0))
    with pytest.raises(ValueError, match="PRNG key"):
        jax_mxfp8.quantize(x, rounding="stochastic")
    q = jax_mxfp8.quantize(x, rounding="stochastic", rng=jax.random.key(0))
    assert q.data.shape == x.shape


def test_bad_implementation_names():
    x = jnp.ones((32, 32))
    with pytest.raises(ValueError, match="implementation"):
        jax_mxfp8.quantize(x, implementation="triton")
    with pytest.raises(ValueError, match="implementation"):
        jax_mxfp8.dequantize(formats.quantize(x), implementation="pallas")
    with pytest.raises(ValueError, match="implementation"):
        jax_mxfp8.rms_norm_quantize(x, jnp.ones((32,)), implementation="cudnn")


@pytest.mark.skipif(_kernels, reason="the kernels are usable here")
def test_cuda_without_gpu_or_library_raises_clearly():
    x = jnp.ones((32, 32), jnp.bfloat16)
    with pytest.raises(RuntimeError, match="implementation='cuda' was requested but"):
        jax_mxfp8.quantize(x, implementation="cuda")
    with pytest.raises(RuntimeError, match="implementation='cuda' was requested but"):
        jax_mxfp8.dequantize(formats.quantize(x), implementation="cuda")
    with pytest.raises(RuntimeError, match="implementation='cuda' was requested but"):
        jax_mxfp8.rms_norm_quantize(x, jnp.ones((32,)), implementation="cuda")


def test_gradients_unchanged():
    x = jax.random.normal(jax.random.key(1), (32, 64))
    g = jax.grad(lambda v: jnp.sum(jax_mxfp8.dequantize(jax_mxfp8.quantize(v))))(x)
    assert not np.asarray(g).any()  # quantize is not differentiable (zero gradient), as documented
    w = jnp.ones((64,))
    gx = jax.grad(lambda v: jnp.sum(jax_mxfp8.rms_norm_quantize(v, w)[0] ** 2))(x)
    assert np.isfinite(np.asarray(gx)).all()
