"""Edge cases of MX quantization (docs/numerics.md "Quantize"): saturation, scale boundaries, zeros, NaN / Inf,
outliers, the subnormal "up" quotient near fmt.max * 2**-127, and float32-subnormal inputs (which may be flushed)."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.quantize import mx_oracle as orc
from tests.quantize.mx_testutil import ELEM_DTYPES, data_bytes, lib_dequantize, lib_quantize, scale_bytes

F32_MAX = float(np.finfo(np.float32).max)


def _plus_ulps(v: float, n: int) -> float:
    x = np.float32(v)
    for _ in range(n):
        x = np.nextafter(x, np.float32(np.inf))
    return float(x)


def _block(first: float, rest: float = 0.0) -> np.ndarray:
    b = np.full(32, rest, np.float32)
    b[0] = first
    return b


# Each case is a block of 32 float32 values; the probed element is index 0 unless the name says otherwise.
EDGE_BLOCKS = {
    "448": _block(448.0),
    "449": _block(449.0),
    "464": _block(464.0),
    "480": _block(480.0),
    "-449": _block(-449.0),
    "57344": _block(57344.0),
    "1.0": _block(1.0),
    "f32 max": _block(F32_MAX),
    "-f32 max": _block(-F32_MAX),
    "448*2^-127": _block(448 * 2.0**-127),
    "448*2^-127 +1ulp": _block(_plus_ulps(448 * 2.0**-127, 1)),
    "448*2^-127 +2ulp": _block(_plus_ulps(448 * 2.0**-127, 2)),
    "448*2^-126": _block(448 * 2.0**-126),
    "57344*2^-127": _block(57344 * 2.0**-127),
    "57344*2^-127 +1ulp": _block(_plus_ulps(57344 * 2.0**-127, 1)),
    "57344*2^-127 +2ulp": _block(_plus_ulps(57344 * 2.0**-127, 2)),
    "2^-120": _block(2.0**-120),
    "2^-126 (min normal)": _block(2.0**-126),
    "zeros": _block(0.0),
    "-0.0": _block(-0.0, -0.0),
    "outlier 2^20, rest 1.0": _block(2.0**20, 1.0),
    "1.0 next to 2^20 [idx 1]": _block(2.0**20, 1.0),
    "-1.0 next to 2^20 [idx 1]": _block(2.0**20, -1.0),
    "2^9 next to 2^20 [idx 1]": _block(2.0**20, 2.0**9),
}
NONFINITE_BLOCKS = {
    "NaN": _block(np.nan, 1.0),
    "+Inf": _block(np.inf, 1.0),
    "-Inf": _block(-np.inf, 1.0),
    "NaN last, Inf": np.array([np.inf] + [2.0] * 30 + [np.nan], np.float32),
}


def _probe(name: str) -> int:
    return 1 if "[idx 1]" in name else 0


# (case, element, scale rounding) -> (element value, scale byte), worked out by hand from docs/numerics.md "Quantize".
# up: b = ceil(log2 fp32(amax / max)) + 127 in [0, 254]; floor: b = floor(log2 amax) - emax + 127 in [0, 254].
HAND = {
    ("448", "e4m3", "up"): (448.0, 127),  # v = 1 exactly
    ("448", "e4m3", "floor"): (448.0, 127),  # floor(log2 448) = 8 = emax
    ("449", "e4m3", "up"): (224.0, 128),  # 449 / 2 = 224.5 -> 224
    ("449", "e4m3", "floor"): (448.0, 127),  # saturates
    ("464", "e4m3", "up"): (224.0, 128),  # 232 is a tie between 224 (even) and 240
    ("464", "e4m3", "floor"): (448.0, 127),
    ("480", "e4m3", "up"): (240.0, 128),
    ("480", "e4m3", "floor"): (448.0, 127),
    ("-449", "e4m3", "up"): (-224.0, 128),
    ("-449", "e4m3", "floor"): (-448.0, 127),
    ("1.0", "e4m3", "up"): (256.0, 119),  # ceil(log2(1/448)) = -8
    ("1.0", "e4m3", "floor"): (256.0, 119),
    ("f32 max", "e4m3", "up"): (256.0, 247),  # v ~ 1.14 * 2**119; 255.99998 -> 256
    ("f32 max", "e4m3", "floor"): (448.0, 246),  # 511.99997 saturates
    ("-f32 max", "e4m3", "floor"): (-448.0, 246),
    ("448*2^-127", "e4m3", "up"): (448.0, 0),  # v = 2**-127 exactly (subnormal, mant 0x400000)
    ("448*2^-127", "e4m3", "floor"): (448.0, 0),  # b = -1 clamped to 0
    # 448 * 2**-127 = 1.75 * 2**-119 has ulp 2**-142; one ulp adds 2**-150 / 1.75 to the quotient, less than
    # half a subnormal ulp (2**-150), so the IEEE quotient rounds back to 2**-127: b = 0 and the element saturates.
    ("448*2^-127 +1ulp", "e4m3", "up"): (448.0, 0),
    ("448*2^-127 +2ulp", "e4m3", "up"): (224.0, 1),  # first amax whose IEEE quotient exceeds 2**-127
    ("448*2^-127 +2ulp", "e4m3", "floor"): (448.0, 0),  # floor(log2) = -119 -> b = 0; 448 + 2**-14 saturates
    ("448*2^-126", "e4m3", "up"): (448.0, 1),
    ("448*2^-126", "e4m3", "floor"): (448.0, 1),  # 1.75 * 2**-118: -118 - 8 + 127 = 1
    ("2^-120", "e4m3", "up"): (128.0, 0),
    ("2^-120", "e4m3", "floor"): (128.0, 0),
    ("zeros", "e4m3", "up"): (0.0, 0),
    ("zeros", "e4m3", "floor"): (0.0, 0),
    ("-0.0", "e4m3", "up"): (0.0, 0),
    ("outlier 2^20, rest 1.0", "e4m3", "up"): (256.0, 139),  # v = 2**12 / 1.75
    ("outlier 2^20, rest 1.0", "e4m3", "floor"): (256.0, 139),
    ("1.0 next to 2^20 [idx 1]", "e4m3", "up"): (0.0, 139),  # 2**-12 < half the smallest subnormal 2**-9
    ("2^9 next to 2^20 [idx 1]", "e4m3", "up"): (0.125, 139),
    ("57344", "e5m2", "up"): (57344.0, 127),
    ("57344", "e5m2", "floor"): (57344.0, 127),  # floor(log2 57344) = 15 = emax
    ("448", "e5m2", "up"): (57344.0, 120),  # 448 / 57344 = 2**-7 exactly
    ("448", "e5m2", "floor"): (57344.0, 120),
    ("449", "e5m2", "up"): (28672.0, 121),  # 449 * 64 = 28736 -> 28672
    ("449", "e5m2", "floor"): (57344.0, 120),
    ("464", "e5m2", "up"): (28672.0, 121),
    ("480", "e5m2", "up"): (32768.0, 121),  # 30720 is a tie between 28672 and 32768 (even)
    ("480", "e5m2", "floor"): (57344.0, 120),
    ("1.0", "e5m2", "up"): (32768.0, 112),
    ("1.0", "e5m2", "floor"): (32768.0, 112),
    ("f32 max", "e5m2", "up"): (32768.0, 240),
    ("f32 max", "e5m2", "floor"): (57344.0, 239),
    ("448*2^-127", "e5m2", "up"): (448.0, 0),
    ("448*2^-127", "e5m2", "floor"): (448.0, 0),
    ("57344*2^-127", "e5m2", "up"): (57344.0, 0),
    ("57344*2^-127 +1ulp", "e5m2", "up"): (57344.0, 0),  # quotient rounds back to 2**-127: saturates
    ("57344*2^-127 +2ulp", "e5m2", "up"): (28672.0, 1),
    ("57344*2^-127 +2ulp", "e5m2", "floor"): (57344.0, 0),
    ("outlier 2^20, rest 1.0", "e5m2", "up"): (32768.0, 132),
    ("1.0 next to 2^20 [idx 1]", "e5m2", "up"): (0.03125, 132),  # 2**-5: an E5M2 normal
    ("-1.0 next to 2^20 [idx 1]", "e5m2", "floor"): (-0.03125, 132),
}


@pytest.mark.parametrize("scale_rounding", ["up", "floor"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_edge_blocks_match_oracle_and_hand_values(elem, scale_rounding):
    names = list(EDGE_BLOCKS) + list(NONFINITE_BLOCKS)
    x = np.stack([EDGE_BLOCKS.get(n, NONFINITE_BLOCKS.get(n)) for n in names])  # one row per case
    dtype = ELEM_DTYPES[elem]
    q = lib_quantize(x, dtype=dtype, scale_rounding=scale_rounding)
    ref = orc.quantize(x, dtype=dtype, scale_rounding=scale_rounding)
    s, d = scale_bytes(q)[:, 0], data_bytes(q)
    deq = lib_dequantize(q)
    for i, n in enumerate(names):
        if n in NONFINITE_BLOCKS:
            assert s[i] == 0xFF, (n, s[i])
            assert np.all(np.isnan(deq[i])), (n, deq[i])  # the whole block dequantizes to NaN
            continue
        assert s[i] == ref.scale[i, 0], (n, s[i], ref.scale[i, 0])
        np.testing.assert_array_equal(d[i], ref.data[i], err_msg=n)
        # Compared with the oracle's dequantize: finite blocks never give NaN or Inf (zero blocks give 0;
        # "f32 max" under "up" rounds its element up to 256 * 2**120 = 2**128 and saturates to float32's max).
        want = orc.dequantize(ref.data[i : i + 1], ref.scale[i : i + 1], (1,), ref.fmt)[0]
        assert np.all(np.isfinite(deq[i])), n
        np.testing.assert_array_equal(deq[i], want, err_msg=n)
        key = (n, elem, scale_rounding)
        if key in HAND:
            val, byte = HAND[key]
            got = float(np.asarray(q.data)[i, _probe(n)].astype(np.float32))
            assert (got, int(s[i])) == (val, byte), (key, got, int(s[i]))
            assert float(orc.decode(ref.data, ref.fmt)[i, _probe(n)]) == val, key  # pins the oracle too
            assert int(ref.scale[i, 0]) == byte, key


def test_hand_table_covers_both_formats_and_roundings():
    keys = {(e, r) for (_, e, r) in HAND}
    assert keys == {(e, r) for e in ("e4m3", "e5m2") for r in ("up", "floor")}
    assert all(n in EDGE_BLOCKS for (n, _, _) in HAND)


@pytest.mark.parametrize("in_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_nonfinite_blocks_are_nan_and_isolated(in_dtype):
    """NaN / +-Inf anywhere in a block: scale 0xFF and NaN on dequantize, other blocks unaffected."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 128)).astype(np.float32)
    x[0, 5], x[1, 40], x[2, 127], x[3, 64] = np.nan, np.inf, -np.inf, np.nan
    x[3, 65] = np.inf
    x = x.astype(in_dtype)
    for sr in ("up", "floor"):
        q = lib_quantize(x, scale_rounding=sr)
        ref = orc.quantize(x, scale_rounding=sr)
        np.testing.assert_array_equal(scale_bytes(q), ref.scale)
        bad = ref.scale == 0xFF
        assert bad.sum() == 4
        deq = lib_dequantize(q)
        fin = ref.finite
        assert np.all(np.isnan(deq[~fin])) and np.all(np.isfinite(deq[fin]))
        np.testing.assert_array_equal(data_bytes(q)[fin], ref.data[fin])


def test_nonfinite_square_tile():
    x = np.ones((64, 64), np.float32)
    x[40, 3] = np.nan  # tile (1, 0)
    q = lib_quantize(x, block="square")
    s = scale_bytes(q)
    assert s[1, 0] == 0xFF and np.all(s[[0, 0, 1], [0, 1, 1]] == 119)  # 1.0 -> 2**-8 scale
    deq = lib_dequantize(q)
    assert np.all(np.isnan(deq[32:, :32])) and np.all(deq[:32] == 1.0) and np.all(deq[32:, 32:] == 1.0)


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_float32_subnormal_inputs_loose(elem):
    """Inputs below 2**-126 may be flushed to zero (docs/numerics.md "Quantize"). Per block the scale must be the
    oracle's for x or for flush(x); each element must be the oracle's rounding of x or of flush(x) under that scale."""
    fmt = orc.fmt_of(ELEM_DTYPES[elem])
    rng = np.random.default_rng(4)
    sub = np.exp2(rng.uniform(-149, -126, size=(6, 32))) * rng.choice([-1, 1], size=(6, 32))
    x = sub.astype(np.float32)
    x[1, 0] = 2.0**-120  # a normal amax with subnormal neighbours
    x[2, 0] = 3 * 2.0**-120
    x[3, :16] = 0.0
    x[4, 0] = 2.0**-130
    x[4, 1:] = 0.0
    x[5, 0] = 2.0**-149
    x[5, 1:] = 0.0
    assert (np.abs(x) >= 2.0**-126).any() and ((np.abs(x) < 2.0**-126) & (x != 0)).any()
    flushed = np.where(np.abs(x) < np.float32(2.0**-126), np.copysign(np.float32(0), x), x)  # FTZ keeps the sign
    for sr in ("up", "floor"):
        q = lib_quantize(x, dtype=fmt.dtype, scale_rounding=sr)
        s, d = scale_bytes(q), data_bytes(q)
        r_keep = orc.quantize(x, dtype=fmt.dtype, scale_rounding=sr)
        r_ftz = orc.quantize(flushed, dtype=fmt.dtype, scale_rounding=sr)
        assert np.all((s == r_keep.scale) | (s == r_ftz.scale)), (sr, s.ravel(), r_keep.scale.ravel())
        b = orc.expand(s, (1,)).astype(np.int64)
        y_keep = np.clip(np.ldexp(x.astype(np.float64), 127 - b), -fmt.max, fmt.max)
        y_ftz = np.clip(np.ldexp(flushed.astype(np.float64), 127 - b), -fmt.max, fmt.max)
        ok = (d == orc.rne_codes(y_keep, fmt)) | (d == orc.rne_codes(y_ftz, fmt))
        assert ok.all(), (sr, np.argwhere(~ok)[:4])
        assert np.all(np.isfinite(lib_dequantize(q)))


def test_zero_blocks_dequantize_to_zero_with_any_input_dtype():
    for in_dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        x = np.zeros((2, 64), np.float32)
        x[1, 32:] = -0.0
        x[0, 40] = 1.0
        q = lib_quantize(x.astype(in_dtype), scale_rounding="floor")
        np.testing.assert_array_equal(scale_bytes(q)[:, 0], [0, 0])
        deq = lib_dequantize(q)
        assert np.all(deq[:, :32] == 0) and np.all(deq[1] == 0) and deq[0, 40] == 1.0


def test_up_rounding_of_float32_max_saturates_on_dequantize():
    """Under "up" the element of fp32 max rounds up to 256 (E4M3) or 32768 (E5M2) at scale 2**120, and
    element * 2**(b - 127) = 2**128 is beyond float32: dequantize saturates it to +-float32's max (it
    returned +-Inf before, docs/numerics.md "Float32 range"); "floor" saturates the element and stays finite."""
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1] = F32_MAX, -F32_MAX
    for elem in ("e4m3", "e5m2"):
        fmt = orc.fmt_of(ELEM_DTYPES[elem])
        q = lib_quantize(x, dtype=fmt.dtype)
        assert float(np.asarray(q.data)[0, 0].astype(np.float32)) == 2.0**fmt.emax  # 256 / 32768: 2**128 with the scale
        np.testing.assert_array_equal(lib_dequantize(q)[0, :2], [F32_MAX, -F32_MAX])
        floor = lib_dequantize(lib_quantize(x, dtype=fmt.dtype, scale_rounding="floor"))[0, 0]
        assert floor == np.float32(fmt.max * 2.0 ** (127 - fmt.emax))
