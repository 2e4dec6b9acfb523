"""RMSNorm -> QKV: the fused RMSNorm + quantize hands the QKV GEMM its MXArray, so no separate quantize or
producer pass reads the normalized activation (why the QKV GEMM does not in turn hand
attention quantized Q, K, V: docs/architecture.md "Hand-offs between layers").

CPU: every kernel decision forced to "emulated", tracing a TransformerBlock's attention half records the
FFI calls in order (tests/flax/test_flax_epilogue.py's recorder): between the fused RMSNorm + quantize and the
QKV GEMM the only pass is the QKV weight's own; called without the MXArray there is one on the
activation (the check can fail).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_mxfp8
from jax_mxfp8.flax import nnx_modules as M
from tests.ffi_calls_testutil import ffi_calls


@pytest.mark.parametrize("hand_off", [True, False])
def test_rms_norm_quantize_feeds_the_qkv_gemm_without_a_quantize_pass(monkeypatch, hand_off):
    d, heads, rows = 96, 3, 2 * 32  # head_dim 32; QKV width 3 * 96
    block = M.TransformerBlock(d, heads, rngs=nnx.Rngs(0))

    def attention_half(x):
        h, h_q = block.norm1(x)
        return block.attn(h, x_quantized=h_q if hand_off else None)

    calls = ffi_calls(monkeypatch, attention_half, jnp.ones((2, 32, d), jnp.bfloat16))
    targets = [t for t, _ in calls]
    norm = targets.index("jax_mxfp8_rms_norm_quantize")
    qkv = targets.index("jax_mxfp8_mx_gemm", norm + 1)
    between = calls[norm + 1 : qkv]
    on_activation = [c for c in between if c[1] == (1, rows, d)]  # the (G, M, D) normalized activation
    assert (on_activation == []) == hand_off, between
    assert [s for _, s in between if s != (1, rows, d)] == [(1, d, 3 * d)], between  # the QKV weight's pass


@jax.jit
def _blockings(acc):
    """From the QKV GEMM's float32 Q slice acc (B, T, N, H): the MX values attention takes today (square
    blocks of the bfloat16 output), the epilogue's row blocks along head_dim re-blocked to squares, the
    epilogue's row blocks and today's row blocks (qkv_blocks="row")."""
    deq = lambda a: jax_mxfp8.dequantize(a, dtype=jnp.float32)  # noqa: E731
    square = lambda x: jax_mxfp8.quantize(x, axis=(-3, -1), block="square")  # noqa: E731
    row_epilogue = deq(jax_mxfp8.quantize(acc, axis=-1))
    q = acc.astype(jnp.bfloat16)
    return deq(square(q)), deq(square(row_epilogue)), row_epilogue, deq(jax_mxfp8.quantize(q, axis=-1))


def test_the_qkv_epilogues_blocks_are_not_attentions():
    """The facts behind not handing Q, K, V to attention (docs/architecture.md): re-blocking the epilogue's
    row blocks to attention's default 32x32 squares is not today's quantization (bfloat16 activations),
    nor are its row blocks the row layout's; with float32 activations the row blocks agree exactly."""
    acc = jax.random.normal(jax.random.key(0), (1, 64, 2, 64), jnp.float32)
    square_now, square_from_row, row_epilogue, row_now = (np.asarray(a) for a in _blockings(acc))
    assert np.mean(square_now != square_from_row) > 0.01
    assert np.mean(row_now != row_epilogue) > 0.01
    exact = acc.astype(jnp.bfloat16).astype(jnp.float32)  # an accumulator that bfloat16 holds exactly
    _, _, row_epilogue, row_now = _blockings(exact)
    np.testing.assert_array_equal(np.asarray(row_epilogue), np.asarray(row_now))
