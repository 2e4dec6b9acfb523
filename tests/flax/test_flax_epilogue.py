"""The MLP's up -> GELU -> down hand-off through the quantize epilogue (LayerPrecision.quantize_epilogue).

CPU. (1) Dataflow: with every kernel decision forced to "emulated" (the kernel path in XLA), tracing an
MXMLP forward (jax.make_jaxpr) records the FFI calls in order: with the epilogue the up GEMM is the
quantize-epilogue GEMM and no quantize / producer pass touches the (M, hidden) activation before the down
GEMM (only the down weight's own pass); without it there is one (the check can fail). (2) Numerics: the LM
example's loss and gradients are unchanged (float32 activations: the same quantized values; tolerance:
summation order) with the epilogue on vs off, NNX and Linen.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from jax_mxfp8.flax import linen_modules as L
from jax_mxfp8.flax import nnx_modules as M
from jax_mxfp8.flax.policy import LayerPrecision, PrecisionPolicy
from tests.ffi_calls_testutil import ffi_calls

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import lm_model  # noqa: E402


@pytest.mark.parametrize("fuse", [True, False])
def test_mlp_hands_mxarray_to_down(monkeypatch, fuse):
    d, hidden, rows = 64, 128, 2 * 32
    mlp = M.MXMLP(d, hidden, precision=LayerPrecision(quantize_epilogue=fuse), rngs=nnx.Rngs(0))
    calls = ffi_calls(monkeypatch, lambda x: mlp(x), jnp.ones((2, 32, d), jnp.bfloat16))
    targets = [t for t, _ in calls]
    up = targets.index("jax_mxfp8_mx_gemm_mx_bias_pre" if fuse else "jax_mxfp8_mx_gemm_bias")
    down = targets.index("jax_mxfp8_mx_gemm_bias", up + 1)
    between = calls[up + 1 : down]
    on_activation = [c for c in between if c[1] == (1, rows, hidden)]  # the (G, M, hidden) activation
    assert (on_activation == []) == fuse, between
    assert [s for _, s in between if s != (1, rows, hidden)] == [(1, hidden, d)], between  # w_down's pass


def _lm_loss_and_grads(fuse: bool, tokens):
    policy = PrecisionPolicy(default=LayerPrecision(quantize_epilogue=fuse))
    model = lm_model.DecoderLM(256, d_model=64, num_layers=1, num_heads=2, policy=policy, rngs=nnx.Rngs(0))
    loss, grads = nnx.jit(nnx.value_and_grad(lm_model.lm_loss))(model, tokens)
    return float(loss), jax.tree.leaves(nnx.state(grads, nnx.Param))


@pytest.mark.slow  # two LM compiles: ~90 s on the loaded 2-core machine
def test_lm_loss_unchanged_by_the_epilogue():
    tokens = jax.random.randint(jax.random.key(0), (2, 33), 0, 256)
    loss_on, grads_on = _lm_loss_and_grads(True, tokens)
    loss_off, grads_off = _lm_loss_and_grads(False, tokens)
    np.testing.assert_allclose(loss_on, loss_off, rtol=1e-6)
    for a, b in zip(grads_on, grads_off, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6 * float(jnp.max(jnp.abs(b))))


def test_linen_block_unchanged_by_the_epilogue():
    x = jax.random.normal(jax.random.key(1), (2, 32, 64), jnp.float32)
    outs = []
    for fuse in (True, False):
        block = L.TransformerBlock(num_heads=2, policy=PrecisionPolicy(default=LayerPrecision(quantize_epilogue=fuse)))
        params = jax.jit(block.init)(jax.random.key(0), x)  # one program each (eager: many small ones)
        outs.append(np.asarray(jax.jit(block.apply)(params, x)))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="activation"):
        L.MXDense(32).init(jax.random.key(0), x, activation="relu")
    assert isinstance(block, nn.Module)
