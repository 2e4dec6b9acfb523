"""The Blackwell attention operand producer (kernels/sm100/attention_operands.py) on CPU: its emulation, which
places every scale byte by the kernel's own index arithmetic, equals the XLA formulation of the operands
(primitives/attention_sm100_operands.py: quantize_square + sm100_operand) bit for bit, padding bytes included;
the primitive's arguments are checked. The kernel itself: tests/test_attention_sm100_gpu.py (never run)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.primitives import attention_operands_sm100 as producer
from jax_mxfp8.primitives.attention_sm100_operands import quantize_square, sm100_operand
from tests.attention.attention_testutil import fresh_rng

CASES = [  # (B, L, heads, H, dtype)
    (2, 96, 3, 64, jnp.bfloat16),  # one partial chunk, 3 heads of 64 (1.5 tiles of the view)
    (1, 288, 2, 128, jnp.float32),  # 2 whole chunks and a partial one
    (2, 128, 1, 128, jnp.bfloat16),
]


def _x(shape, dtype):
    """Normal values with per-block magnitudes 2^-6 .. 2^6, zero blocks and one NaN block, so that neighbouring
    blocks have different bytes and the byte rule's special cases appear."""
    rng = fresh_rng()
    b, length, heads, h = shape
    x = rng.standard_normal(shape).astype(np.float32)
    e = rng.integers(-6, 7, size=(b, length // 32, heads, h // 32)).astype(np.float32)
    x *= np.exp2(np.repeat(np.repeat(e, 32, axis=1), 32, axis=3))
    x[0, :32, 0, :32] = 0.0
    x[-1, -32:, -1, -32:] = np.nan
    return jnp.asarray(x, dtype)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}L{c[1]}N{c[2]}H{c[3]}")
@pytest.mark.parametrize("rounding", ["up", "floor"])
def test_emulation_places_every_byte_as_the_xla_formulation(case, rounding):
    *shape, dtype = case
    x = _x(tuple(shape), dtype)
    data, sq, hd, seq = jax.jit(producer.emulate_attention_operands, static_argnums=1)(x, rounding)
    mx = quantize_square(x, rounding)
    want = sm100_operand(mx)
    for got, ref in ((data, mx.data), (sq, mx.scale), (hd, want.sf_hd), (seq, want.sf_seq)):
        assert got.shape == ref.shape and got.dtype == ref.dtype
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(ref).view(np.uint8))
    assert np.any(np.asarray(hd) != 0) and np.any(np.asarray(seq) == 0xFF)


def test_primitive_returns_the_mxarray_and_the_operand():
    x = _x((1, 64, 2, 64), jnp.bfloat16)
    mx, op = producer.attention_operands_sm100(x, path="emulated")
    assert mx.block == "square" and mx.axes == (-3, -1)
    want = sm100_operand(quantize_square(x))
    np.testing.assert_array_equal(np.asarray(op.sf_hd), np.asarray(want.sf_hd))
    np.testing.assert_array_equal(np.asarray(op.sf_seq), np.asarray(want.sf_seq))


def test_rejects_what_no_variant_takes():
    with pytest.raises(ValueError, match="multiple of 32"):
        producer.attention_operands_sm100(jnp.zeros((1, 48, 2, 64)), path="emulated")
    with pytest.raises(ValueError, match="H = 96"):
        producer.attention_operands_sm100(jnp.zeros((1, 64, 2, 96)), path="emulated")
    with pytest.raises(ValueError, match="float16"):
        producer.attention_operands_sm100(jnp.zeros((1, 64, 2, 64), jnp.float16), path="emulated")
