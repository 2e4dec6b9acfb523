"""The Blackwell attention kernels' in-kernel quantizations in XLA (jax_mxfp8/primitives/attention_sm100_quant.py)
and their operand layout (attention_sm100_operands.py), against independent models:

* the E8M0 byte from amax's bits equals formats.scales.scale_bits (the contract's "up" rule) on every exponent
  at and around the mantissa boundary, the subnormal-quotient range and random patterns; Inf / NaN give 0xFF;
* P ("const" and "block" along either axis) and dS (32x32) equal the reference's quantizations bit for bit and
  an E4M3 cast by ml_dtypes; a block holding one NaN or Inf gets byte 0xFF (the NaN-keeping warp reduction),
  a zero block byte 0;
* the "hd" / "seq" orientations (in formats/blocked_scales.py's 128x4 layout) repeat each square block's byte
  over its 32 rows, and every orientation decodes to the contract's dequantized values.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_mxfp8.formats.blocked_scales import from_blocked_scales
from jax_mxfp8.formats.elements import E4M3
from jax_mxfp8.formats.quantize import dequantize, quantize
from jax_mxfp8.formats.scales import scale_bits
from jax_mxfp8.primitives import attention_sm100_operands as ops
from jax_mxfp8.primitives import attention_sm100_quant as sq
from jax_mxfp8.reference.attention_quant import fake_quant_p, fake_quant_square
from tests.attention.attention_testutil import fresh_rng


def test_scale_byte_matches_the_contract_rule():
    rng = fresh_rng()
    exps = np.arange(0, 255, dtype=np.uint32)[:, None] << 23
    mants = np.array([0, 1, 0x5FFFFF, 0x600000, 0x600001, 0x7FFFFF], np.uint32)[None, :]
    bits = np.concatenate([(exps | mants).ravel(), rng.integers(0, 0x7F800000, 50_000, dtype=np.uint32)])
    amax = bits.view(np.float32)
    got = np.asarray(sq.scale_byte_up(jnp.asarray(bits)))
    want = np.asarray(scale_bits(jnp.asarray(amax), E4M3, "up"))
    np.testing.assert_array_equal(got, want)
    special = np.array([0x7F800000, 0x7FC00000, 0x7FFFFFFF], np.uint32)
    np.testing.assert_array_equal(np.asarray(sq.scale_byte_up(jnp.asarray(special))), [255, 255, 255])


def _probabilities(rng, shape):
    """Softmax-like values in [0, 1]: heavy spread over binades, zeros, exact ones, a NaN."""
    p = np.exp2(-np.abs(rng.standard_normal(shape)) * 12).astype(np.float32)
    p[..., 0, :40] = 0.0
    p[..., 1, 3] = 1.0
    p[0, 2, 70] = np.nan
    return p


def _e4m3(y):
    return np.asarray(y, np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


def test_p_const_bit_exact():
    p = _probabilities(fresh_rng(), (3, 64, 256))
    got = np.asarray(sq.quantize_p_const(jnp.asarray(p)))
    np.testing.assert_array_equal(got, np.asarray(fake_quant_p(jnp.asarray(p), -1, "const", "up")))
    np.testing.assert_array_equal(got, _e4m3(p * np.float32(256)) * np.float32(2.0**-8))  # ml_dtypes' cast


@pytest.mark.parametrize("axis", [-1, -2])
def test_p_block_bit_exact(axis):
    p = _probabilities(fresh_rng(), (3, 64, 256))
    b, got = sq.quantize_rows(jnp.asarray(p), axis)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(fake_quant_p(jnp.asarray(p), axis, "block", "up")))
    # the block holding the NaN (p[0, 2, 70]) is NaN as a whole, with byte 0xFF
    b = np.asarray(b)
    nan_block = (0, 2, 70 // 32) if axis == -1 else (0, 0, 70)
    got = np.asarray(got)
    assert b[nan_block] == 255 and np.all(np.isnan(got[0, 2, 64:96] if axis == -1 else got[0, :32, 70]))
    assert np.sum(b == 255) == 1


def test_ds_square_bit_exact_and_nan_block():
    rng = fresh_rng()
    ds = (rng.standard_normal((2, 96, 256)) * np.exp(rng.standard_normal((2, 96, 256)) * 3)).astype(np.float32)
    ds[0, :32, :32] = 0.0  # zero block: byte 0, zeros
    ds[0, 40:72, 96:128] *= 1e6  # a block mostly far larger than ...
    ds[0, 45, 100] = np.nan  # ... one NaN: the finite max must not win (CREDUX without .NaN would pick it)
    ds[1, 70, 200] = np.inf
    b, got = sq.quantize_square(jnp.asarray(ds))
    b, got = np.asarray(b), np.asarray(got)
    np.testing.assert_array_equal(got, np.asarray(fake_quant_square(jnp.asarray(ds))))
    assert b[0, 0, 0] == 0 and np.all(got[0, :32, :32] == 0)
    assert b[0, 1, 3] == 255 and np.all(np.isnan(got[0, 32:64, 96:128]))
    assert b[1, 2, 6] == 255 and np.all(np.isnan(got[1, 64:96, 192:224]))
    assert np.sum(b == 255) == 2
    # the finite blocks: elements = E4M3(ds / 2^(b - 127)) by ml_dtypes, times the scale
    fin = np.repeat(np.repeat(b != 255, 32, axis=-2), 32, axis=-1)
    scale = np.exp2(np.repeat(np.repeat(b.astype(np.float64) - 127, 32, axis=-2), 32, axis=-1))
    want = _e4m3(np.where(fin, ds / scale, 0.0)) * scale
    np.testing.assert_array_equal(got[fin], want[fin].astype(np.float32))


@pytest.mark.parametrize("h", [64, 128])
def test_orientation_bytes_repeat_the_square_block(h):
    rng = fresh_rng()
    x = rng.standard_normal((2, 96, 3, h)).astype(np.float32) * np.exp2(rng.integers(-8, 8, (2, 96, 3, 1)))
    mx = ops.quantize_square(jnp.asarray(x))
    op = ops.sm100_operand(mx)
    sqr = np.asarray(mx.scale).transpose(0, 2, 1, 3)  # (B, heads, L/32, H/32)
    hd = np.asarray(from_blocked_scales(op.sf_hd, 96, h // 32))
    seq = np.asarray(from_blocked_scales(op.sf_seq, h, 3))
    for t, c in [(0, 0), (37, 1), (95, h // 32 - 1)]:
        assert np.all(hd[:, :, t, c] == sqr[:, :, t // 32, c])
    for ch, i in [(0, 0), (40, 1), (h - 1, 2)]:
        assert np.all(seq[:, :, ch, i] == sqr[:, :, i, ch // 32])
    assert op.sf_hd.shape == (2, 3, 1, 1, 512) and op.sf_seq.shape == (2, 3, 1, 1, 512)
    # padding: rows 96..127 of "hd", K blocks past H/32 and channels past H of "seq" hold byte 0
    assert np.all(np.asarray(from_blocked_scales(op.sf_hd, 128, 4))[:, :, 96:] == 0)
    assert np.all(np.asarray(from_blocked_scales(op.sf_hd, 128, 4))[:, :, :, h // 32 :] == 0)
    assert np.all(np.asarray(from_blocked_scales(op.sf_seq, 128, 4))[:, :, h:] == 0)
    # every orientation decodes to the same MX values as the contract's dequantize
    want = np.pad(np.asarray(dequantize(mx)), [(0, 0), (0, 32), (0, 0), (0, 0)])
    for o in ops.ORIENTATIONS:
        np.testing.assert_array_equal(np.asarray(ops.operand_values(op, o)), want)


def test_operand_rejects_row_blocks():
    with pytest.raises(ValueError, match="square blocks"):
        ops.sm100_operand(quantize(jnp.ones((1, 32, 2, 64)), axis=-1))
    with pytest.raises(ValueError, match="orientations"):
        ops.sm100_operand(ops.quantize_square(jnp.ones((1, 32, 2, 64))), ("rows",))
