"""Finite stays finite at the edge of float32's range (docs/numerics.md, "Float32 range"; formats/saturation.py).

Quantize is unchanged there (byte for byte jax.nn's and cvt.rp.satfinite.ue8m0's choice: scale byte 247 / 240
for amax near float32's max); dequantize saturates the products that exceed the output dtype, and float64
input beyond float32's range saturates to float32's max before the float32 amax.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from mx_testutil import data_bytes, lib_dequantize, lib_quantize, scale_bytes

import jax_mxfp8 as mx

F32_MAX = np.finfo(np.float32).max
BF16_MAX = float(ml_dtypes.finfo(jnp.bfloat16).max)
ELEMS = [jnp.float8_e4m3fn, jnp.float8_e5m2]


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _near_max_blocks(bf16: bool = False) -> np.ndarray:
    """Rows of 32: float32 max (not for bfloat16 input, where it would round to inf), bfloat16 max,
    1.9375 * 2**127 (the E4M3 round-up threshold), 1.75 * 2**127, each with signs and small companions."""
    rows = []
    values = (BF16_MAX, 1.9375 * 2.0**127, 1.75 * 2.0**127, np.nextafter(np.float32(1.75 * 2.0**127), 0))
    for v in values if bf16 else (F32_MAX, *values):
        r = np.linspace(-1.0, 1.0, 32, dtype=np.float64) * 1e30
        r[0], r[7] = v, -v
        rows.append(r)
    return np.asarray(rows).astype(np.float32)


@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("in_dtype", [jnp.float32, jnp.bfloat16])
def test_near_max_input_dequantizes_finite(elem, in_dtype):
    x = jnp.asarray(_near_max_blocks(bf16=in_dtype == jnp.bfloat16), in_dtype)
    assert np.all(np.isfinite(np.asarray(x, np.float32)))
    q = lib_quantize(x, dtype=elem)
    for out_dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        deq = np.asarray(lib_dequantize(q, out_dtype), np.float32)
        assert np.all(np.isfinite(deq)), (out_dtype, deq[:, [0, 7]])
    deq = lib_dequantize(q)
    # the saturated values are exactly +-float32 max; nothing else moved (compare with the unsaturated products)
    elems = np.asarray(q.data).astype(np.float64)
    exact = elems * np.exp2(np.repeat(scale_bytes(q).astype(np.float64) - 127, 32, axis=1))
    with np.errstate(over="ignore"):
        want = np.where(np.abs(exact) > F32_MAX, np.sign(exact) * F32_MAX, exact).astype(np.float32)
    np.testing.assert_array_equal(_bits(deq), _bits(want))
    assert np.any(np.abs(exact) > F32_MAX)  # the case exists: these inputs used to dequantize to +-inf
    # bfloat16 output: +-bfloat16 max, bit for bit, where the float32 value lies beyond it
    deq16 = lib_dequantize(q, jnp.bfloat16)
    big = np.abs(want) > BF16_MAX
    np.testing.assert_array_equal(np.abs(np.asarray(deq16, np.float32))[big], BF16_MAX)


@pytest.mark.parametrize("elem", ELEMS)
def test_quantize_bytes_unchanged_near_max(elem):
    """The bytes are jax.nn's rule (scale byte 247 / 240; tests/test_formats_edge_cases.py pins the elements)."""
    q = lib_quantize(_near_max_blocks(), dtype=elem)
    assert int(scale_bytes(q)[0, 0]) == (247 if elem == jnp.float8_e4m3fn else 240)


def test_caller_built_large_scale_saturates_and_nan_and_inf_pass():
    codes = np.zeros((2, 64), np.uint8)
    codes[0, 0] = 0x7E  # E4M3 448
    codes[0, 33] = 0x7F  # E4M3 NaN
    scale = jnp.asarray([[254, 0xFF], [0, 0]], jnp.uint8)
    a = mx.MXArray(jnp.asarray(codes.view(jnp.float8_e4m3fn)), scale, (-1,), "row")
    deq = lib_dequantize(a)
    assert deq[0, 0] == F32_MAX and np.all(np.isnan(deq[0, 32:])) and np.all(deq[1] == 0)
    e5 = np.zeros((1, 32), np.uint8)
    e5[0, 0], e5[0, 1], e5[0, 2] = 0x7C, 0xFC, 0x7B  # E5M2 +inf, -inf, 57344
    a5 = mx.MXArray(jnp.asarray(e5.view(jnp.float8_e5m2)), jnp.asarray([[250]], jnp.uint8), (-1,), "row")
    d5 = lib_dequantize(a5)
    assert d5[0, 0] == np.inf and d5[0, 1] == -np.inf and d5[0, 2] == F32_MAX  # an inf element stays inf


def test_float64_beyond_float32_range_saturates_in_x64():
    x = np.zeros((2, 32), np.float64)
    x[0, 0], x[0, 1], x[0, 2] = 1e39, -1e300, 1.0
    x[1, 0] = np.inf
    want = np.zeros((2, 32), np.float32)
    want[0, 0], want[0, 1], want[0, 2] = F32_MAX, -F32_MAX, 1.0
    want[1, 0] = np.inf
    ref = mx.quantize(jnp.asarray(want))
    with jax.enable_x64(True):
        for arg in (x, jnp.asarray(x)):
            q = mx.quantize(arg)
            np.testing.assert_array_equal(data_bytes(q)[0], data_bytes(ref)[0])
            np.testing.assert_array_equal(scale_bytes(q), scale_bytes(ref))
            assert scale_bytes(q)[1, 0] == 0xFF  # inf stays non-finite: a NaN block
            deq = np.asarray(mx.dequantize(q))
            assert deq[0, 0] == F32_MAX and deq[0, 1] == -F32_MAX and np.all(np.isnan(deq[1]))
    q = mx.quantize(x)  # NumPy float64 without x64: saturated before the conversion to float32
    np.testing.assert_array_equal(scale_bytes(q), scale_bytes(ref))
