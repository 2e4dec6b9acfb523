"""align128 (jax_mxfp8/reference/gemm_align.py) against the independent float64 model, and its error study.

CPU only. Bit-exact checks on the library's contract quantization of fresh random data (zero and NaN
blocks, huge and tiny magnitudes, partial last 128-runs); the error study measures
|dequant(aligned) - dequant(contract MX)| against the documented bound on N(0,1), log-normal-row and
outlier-channel data.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_mxfp8.formats import quantize
from jax_mxfp8.reference.gemm_align import align128, error_bound
from tests.gemm.gemm_align_oracle import align128_oracle, dequant_aligned, dequant_mx, mixed_input, sqnr_db
from tests.quantize.mx_oracle import fmt_of
from tests.seeding_testutil import test_seed

ELEMS = (jnp.float8_e4m3fn, jnp.float8_e5m2)


def _codes(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


# quantize and align128 as one program each per (options, shape): eager dispatch compiled their small ops
# anew for every shape of the tests below (~5 s per case on CI's CPU).
@functools.cache
def _quantize(axis=-1, dtype=jnp.float8_e4m3fn, scale_rounding="up"):
    return jax.jit(lambda x: quantize(x, axis=axis, dtype=dtype, scale_rounding=scale_rounding))


@functools.cache
def _align128(axis=-1):
    return jax.jit(lambda data, scale: align128(data, scale, axis=axis))


def check_against_oracle(x, dtype, scale_rounding, axis):
    q = _quantize(axis, dtype, scale_rounding)(jnp.asarray(x))
    data, scale = _align128(axis)(q.data, q.scale)
    codes, sc = _codes(q.data), np.asarray(q.scale)
    if axis == -2:
        codes, sc = np.swapaxes(codes, -1, -2), np.swapaxes(sc, -1, -2)
    want_d, want_s = align128_oracle(codes, sc, fmt_of(dtype))
    got_d, got_s = _codes(data), np.asarray(scale)
    assert got_d.shape == want_d.shape and got_s.shape == want_s.shape
    assert got_s.dtype == np.float32
    nan = np.isnan(np.asarray(data).astype(np.float32))
    assert (nan == np.isnan(want_d.view(fmt_of(dtype).dtype).astype(np.float32))).all(), "NaN positions"
    np.testing.assert_array_equal(np.where(nan, 0, got_d), np.where(nan, 0, want_d))
    np.testing.assert_array_equal(got_s.view(np.uint32), want_s.view(np.uint32))
    return data, scale


@pytest.mark.parametrize("dtype", ELEMS)
@pytest.mark.parametrize("scale_rounding", ["up", "floor"])
@pytest.mark.parametrize("axis", [-1, -2])
@pytest.mark.parametrize("k", [128, 32, 64, 96, 256 + 32, 512 + 96])
def test_align128_bitexact(dtype, scale_rounding, axis, k):
    rng = np.random.default_rng(test_seed())
    shape = (2, 64, k) if axis == -1 else (2, k, 64)
    check_against_oracle(mixed_input(shape, rng), dtype, scale_rounding, axis)


def test_padding_zero_and_nan_runs():
    rng = np.random.default_rng(test_seed())
    x = rng.standard_normal((4, 160)).astype(np.float32)
    x[0] = 0.0  # all-zero row: E = 0, scale 2^-127, data 0
    x[1, 5] = np.nan  # NaN in run 0 -> scale NaN for run 0 only
    x[2, 130] = np.inf  # Inf in the partial run 1 (one block of 32 exists)
    q = _quantize()(jnp.asarray(x))
    data, scale = check_against_oracle(x, jnp.float8_e4m3fn, "up", -1)
    s = np.asarray(scale)
    assert data.shape == (4, 256) and s.shape == (2, 4)
    assert (_codes(data)[:, 160:] == 0).all(), "padding must be +0"
    assert s.view(np.uint32)[0, 0] == 0x00400000 and s.view(np.uint32)[1, 0] == 0x00400000
    assert np.isnan(s[0, 1]) and not np.isnan(s[1, 1]) and np.isnan(s[1, 2]) and not np.isnan(s[0, 2])
    assert (_codes(data)[0] == 0).all()
    # the NaN block's elements stay NaN; the other blocks of its run keep their (shifted) values
    assert np.isnan(np.asarray(data[1, :32]).astype(np.float32)).all()
    assert (np.asarray(q.scale)[1] == [255, *np.asarray(q.scale)[1, 1:]]).all()


def test_shift_zero_is_identity():
    """Blocks with e_b == E keep their bytes: a run of four equal-exponent blocks is unchanged."""
    rng = np.random.default_rng(test_seed())
    x = rng.uniform(1.0, 1.7, (8, 256)).astype(np.float32) * rng.choice([-1, 1], (8, 256))
    q = _quantize()(jnp.asarray(x))
    assert len(np.unique(np.asarray(q.scale))) == 1
    data, _ = _align128()(q.data, q.scale)
    np.testing.assert_array_equal(_codes(data), _codes(q.data))


@pytest.mark.parametrize(
    "data,scale,axis,match",
    [
        (np.zeros((32, 32), np.float32), np.zeros((32, 1), np.uint8), -1, "dtype"),
        (np.zeros((32, 32), ml_dtypes.float8_e4m3fn), np.zeros((32, 1), np.int32), -1, "scale_e8m0"),
        (np.zeros((32, 32), ml_dtypes.float8_e4m3fn), np.zeros((32, 2), np.uint8), -1, "scale_e8m0"),
        (np.zeros((32, 32), ml_dtypes.float8_e4m3fn), np.zeros((32, 1), np.uint8), 2, "axis"),
        (np.zeros((32, 48), ml_dtypes.float8_e4m3fn), np.zeros((32, 1), np.uint8), -1, "multiple of 32"),
        (np.zeros((32,), ml_dtypes.float8_e4m3fn), np.zeros((1,), np.uint8), -1, "rank"),
    ],
)
def test_bad_inputs(data, scale, axis, match):
    with pytest.raises(ValueError, match=match):
        align128(jnp.asarray(data), jnp.asarray(scale), axis=axis)


# ------------------------------------------------------------------------------------------ error study
def family(name: str, rng: np.random.Generator, shape=(256, 2048)) -> np.ndarray:
    r, k = shape
    x = rng.standard_normal(shape)
    if name == "lognormal_rows":  # row magnitudes log-normal over ~2^+-12
        x *= np.exp(rng.normal(0.0, 3.0, (r, 1)))
    elif name.startswith("outlier"):  # a few channels (columns) x scale, confined to single 32-blocks
        f = float(name.split("x")[1])
        cols = rng.choice(k, 8, replace=False)
        x[:, cols] *= f
    return x.astype(np.float32)


FAMILIES = ["normal", "lognormal_rows", "outlier_x10", "outlier_x100", "outlier_x1000", "outlier_x10000"]


@pytest.mark.parametrize("dtype", ELEMS)
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("axis", [-1, -2])
def test_error_bound(name, dtype, axis, capsys):
    rng = np.random.default_rng(test_seed())
    x = family(name, rng)
    q = _quantize(axis, dtype)(jnp.asarray(x))
    data, scale = _align128(axis)(q.data, q.scale)
    fmt = fmt_of(dtype)
    codes, sc = _codes(q.data), np.asarray(q.scale)
    if axis == -2:
        codes, sc = np.swapaxes(codes, -1, -2), np.swapaxes(sc, -1, -2)
    mx = dequant_mx(codes, sc, fmt)
    al = dequant_aligned(_codes(data), np.asarray(scale), fmt)[..., : mx.shape[-1]]
    xx = x if axis == -1 else x.T
    err = np.abs(al - mx)
    bound = np.repeat(np.swapaxes(error_bound(scale, dtype), -1, -2), 128, axis=-1)[..., : mx.shape[-1]]
    ratio = float(np.max(err / bound))
    changed = float(np.mean(err > 0))
    with capsys.disabled():
        print(
            f"\n  align128 {fmt.name} axis={axis} {name:15s}: max err/bound {ratio:.3f}, changed {changed:.2e}, "
            f"SQNR(aligned vs MX) {sqnr_db(mx, al):6.1f} dB, SQNR vs x: MX {sqnr_db(xx, mx):5.1f} dB, "
            f"aligned {sqnr_db(xx, al):5.1f} dB"
        )
    assert ratio <= 1.0
    # the alignment error stays far below the MX quantization error itself (measured >= 97 dB vs <= 32 dB)
    assert sqnr_db(mx, al) > sqnr_db(xx, mx) + 40
    assert abs(sqnr_db(xx, al) - sqnr_db(xx, mx)) < 0.1
