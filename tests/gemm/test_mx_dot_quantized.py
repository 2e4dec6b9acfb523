"""mx_dot_general_quantized (ops/mx_dot_quantized.py): the GEMM whose output also leaves as an MXArray.

CPU. The contract: with p = the float32 GEMM result (+ bias), y_q = quantize(act(p)) along the last axis
and y = act(p.astype(out_dtype)), gradients those of autodiff through y. Checked on the kernel path
("emulated": the quantize-epilogue GEMM) against the same composition built from mx_dot_general on the
same path (bits of y_q, y and every gradient), on the reference ("xla"), the fallback with its reason
(implementation=None / "emulated" on calls the epilogue does not cover) and ValueErrors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.ops.mx_dot_quantized import ARCHS, mx_dot_general_quantized
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library
from tests.seeding_testutil import test_seed

DN = (((2,), (0,)), ((), ()))


@pytest.fixture(scope="module")
def data():
    k = jax.random.split(jax.random.key(test_seed()), 4)
    x = jax.random.normal(k[0], (2, 48, 128), jnp.bfloat16)
    w = jax.random.normal(k[1], (128, 96), jnp.float32) * 0.2
    b = jax.random.normal(k[2], (96,), jnp.float32)
    ct = jax.random.normal(k[3], (2, 48, 96), jnp.bfloat16)
    return x, w, b, ct


def _composed(x, w, b, activation, implementation):
    p = mx.mx_dot_general(x, w, DN, preferred_element_type=jnp.float32, bias=b, implementation=implementation)
    act = (lambda v: jax.nn.gelu(v)) if activation else (lambda v: v)
    q = mx.quantize(act(jax.lax.stop_gradient(p)), axis=-1)
    return act(p.astype(jnp.bfloat16)), q


def _loss_and_grads(f, x, w, b, ct):
    def loss(x, w, b):
        y, q = f(x, w, b)
        return jnp.sum(y.astype(jnp.float32) * ct.astype(jnp.float32)), q

    (v, q), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(x, w, b)
    return v, q, grads


def _same(a, b, what):
    a, b = np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b))
    assert a.dtype == b.dtype, what
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=what)


@pytest.mark.parametrize(
    "implementation, activation",
    [("emulated", "gelu"), pytest.param("emulated", None, marks=pytest.mark.slow), ("xla", "gelu")],
)
def test_matches_composition(data, activation, implementation):
    """y, y_q and the loss of the op are bit for bit those of the composition on the same path; so are the
    gradients without an activation. With GELU the backward GEMMs see XLA's GELU derivative in bfloat16,
    which XLA may keep in excess precision inside the composition's fusions (not across the custom_vjp
    boundary): the gradients then differ where a cotangent element rounds to the other FP8 neighbour,
    at most a few FP8 steps of one cotangent element per output (2^-3 relative), far below a wrong
    derivative (order 1)."""
    x, w, b, ct = data

    def op(x, w, b):
        return mx_dot_general_quantized(
            x, w, DN, activation=activation, bias=b, preferred_element_type=jnp.bfloat16, implementation=implementation
        )

    with impl.record() as decisions:
        v1, q1, g1 = _loss_and_grads(op, x, w, b, ct)
    assert implementation == "xla" or decisions[0].op == "mx_dot_general_quantized"
    v2, q2, g2 = _loss_and_grads(lambda x, w, b: _composed(x, w, b, activation, implementation), x, w, b, ct)
    assert q1.shape == (2, 48, 96) and q1.scale.shape == (2, 48, 3) and q1.axes == (-1,)
    _same(q1.data, q2.data, "y_q data")
    _same(q1.scale, q2.scale, "y_q scale")
    _same(v1, v2, "loss")
    for name, a, c in zip(("dx", "dw", "db"), g1, g2, strict=True):
        if activation is None:
            _same(a, c, name)
        else:
            a, c = np.asarray(a, np.float64), np.asarray(c, np.float64)
            rel = np.linalg.norm(a - c) / np.linalg.norm(c)
            assert rel < 2e-2, f"{name}: relative difference {rel:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_kernel_matches_composition(data, activation):
    """On the H200: the epilogue kernel's y_q is quantize(act(p)) of the plain kernel's float32 p (bits for
    activation None; GELU: hardware tanh, within one FP8 step), y, loss and gradients as the composition."""
    ok, why = library.kernels_runnable(ARCHS)
    if not ok:
        pytest.skip(why)
    x, w, b, ct = (jnp.tile(a, (1, 8, 1)) if a.ndim == 3 else a for a in data)  # M = 2 x 384

    def op(x, w, b):
        return mx_dot_general_quantized(
            x, w, DN, activation=activation, bias=b, preferred_element_type=jnp.bfloat16, implementation="cuda"
        )

    with impl.record() as decisions:
        v1, q1, g1 = _loss_and_grads(op, x, w, b, ct)
    assert [d.path for d in decisions if d.op == "mx_dot_general_quantized"] == ["cuda"]
    v2, q2, g2 = _loss_and_grads(lambda x, w, b: _composed(x, w, b, activation, "cuda"), x, w, b, ct)
    if activation is None:
        _same(q1.data, q2.data, "y_q data")
        _same(q1.scale, q2.scale, "y_q scale")
    else:  # within one FP8 step of the block (a scale may differ by 2x where the tanh crosses a power of two)
        d1, d2 = np.asarray(q1.dequantize()), np.asarray(q2.dequantize())
        amax = np.repeat(np.abs(d2).reshape(*d2.shape[:-1], -1, 32).max(-1), 32, axis=-1)
        assert np.mean(d1 == d2) > 0.99 and np.all(np.abs(d1 - d2) <= 0.13 * np.abs(d2) + 2.0**-7 * amax)
    # XLA on the GPU may drop the composition's f32 -> bf16 -> f32 rounding of y (SimplifyFPConversions):
    # the loss agrees to bf16 rounding of each term, relative to the sum of |terms|
    y2 = _composed(x, w, b, activation, "cuda")[0]
    scale = float(jnp.sum(jnp.abs(y2.astype(jnp.float32) * ct.astype(jnp.float32))))
    assert abs(float(v1) - float(v2)) <= 2.0**-8 * scale
    for name, a, c in zip(("dx", "dw", "db"), g1, g2, strict=True):
        a, c = np.asarray(a, np.float64), np.asarray(c, np.float64)
        rel = np.linalg.norm(a - c) / np.linalg.norm(c)
        assert rel < (1e-4 if activation is None else 2e-2), f"{name}: relative difference {rel:.3g}"


def test_fallback_reason_and_cuda_raises(data):
    """A call the epilogue does not cover (float32 output) takes the two-pass path with implementation=None,
    with the reason recorded; "emulated" raises ValueError with it."""
    x, w, b, _ = data
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
