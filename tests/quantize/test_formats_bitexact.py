"""Bit-exact agreement of jax_mxfp8.quantize / dequantize with the independent NumPy oracle (docs/numerics.md
"Quantize", "Dequantize").

Inputs avoid float32-subnormal magnitudes (< 2**-126), which the contract allows to be flushed to zero;
test_formats_edge_cases.py covers them with a looser comparison.
"""

import zlib

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mxfp8 as mx
from tests.quantize import mx_oracle as orc
from tests.quantize.mx_testutil import (
    ELEM_DTYPES,
    INPUT_DTYPES,
    boundary_blocks,
    data_bytes,
    lib_dequantize,
    lib_quantize,
    log_uniform_blocks,
    mixed_blocks,
    scale_bytes,
)

# name -> (shape, library `axis` argument, block)
LAYOUTS = {
    "row_last": ((48, 128), -1, "row"),
    "row_first": ((64, 40), 0, "row"),
    "row_mid3d": ((3, 64, 40), 1, "row"),
    "square_last2": ((2, 64, 96), -1, "square"),
    "square_0_2": ((64, 5, 32), (0, 2), "square"),
}


def _assert_codes_equal(got, want, what, x=None):
    if np.array_equal(got, want):
        return
    bad = np.argwhere(got != want)
    i = tuple(bad[0])
    detail = f" x={x[i]!r}" if x is not None else ""
    raise AssertionError(f"{what}: {len(bad)} mismatches, first at {i}:{detail} got {got[i]:#04x} want {want[i]:#04x}")


def check_against_oracle(x, *, axis, block, elem, scale_rounding):
    """Quantizes x with the library (jit) and the oracle; asserts equal bytes, axes and dequantized values."""
    dtype = ELEM_DTYPES[elem]
    q = lib_quantize(x, axis=axis, block=block, dtype=dtype, scale_rounding=scale_rounding)
    ref = orc.quantize(x, axis=axis, block=block, dtype=dtype, scale_rounding=scale_rounding)
    assert q.block == block
    assert q.axes == tuple(a - x.ndim for a in ref.axes), (q.axes, ref.axes)
    assert q.data.shape == x.shape and q.data.dtype == dtype
    assert q.scale.shape == ref.scale.shape
    _assert_codes_equal(scale_bytes(q), ref.scale, "scale bytes")
    _assert_codes_equal(data_bytes(q), ref.data, "data bytes", x=x)
    # Dequantize of the library's own MXArray against the oracle's dequantize of the oracle's bytes.
    got = lib_dequantize(q)
    want = orc.dequantize(ref.data, ref.scale, ref.axes, ref.fmt)
    assert_dequant_equal(got, want)


def assert_dequant_equal(got, want):
    """Bit-exact where the exact result is zero or a normal float32; where it is a float32 subnormal, XLA CPU's
    flush-to-zero may give a zero of the same sign instead (documented tolerance, nothing else)."""
    got = np.asarray(got, dtype=np.float32)
    sub = (want != 0) & (np.abs(want) < np.float32(2.0**-126))
    exact = got.view(np.uint32) == want.view(np.uint32)
    both_nan = np.isnan(got) & np.isnan(want)
    flushed = sub & (got == 0) & (np.signbit(got) == np.signbit(want))
    ok = exact | both_nan | flushed
    if not ok.all():
        i = tuple(np.argwhere(~ok)[0])
        raise AssertionError(f"dequantize: {np.sum(~ok)} mismatches, first at {i}: got {got[i]!r} want {want[i]!r}")


def _inputs(seed, shape, axes, in_dtype):
    rng = np.random.default_rng(seed)
    if np.dtype(in_dtype) == np.dtype(np.float16):  # float16 range: 2**-24 .. 65504
        return [
            log_uniform_blocks(rng, shape, axes, -14, 15, spread=12, in_dtype=in_dtype),
            mixed_blocks(rng, shape, axes, in_dtype=in_dtype, lo=-10, hi=2, outlier_binades=12),
            boundary_blocks(rng, shape, axes, in_dtype=in_dtype, kmin=-10, kmax=0),
        ]
    return [
        log_uniform_blocks(rng, shape, axes, -120, 120, spread=30, in_dtype=in_dtype),
        log_uniform_blocks(rng, shape, axes, -8, 8, spread=10, in_dtype=in_dtype),
        mixed_blocks(rng, shape, axes, in_dtype=in_dtype),
        boundary_blocks(rng, shape, axes, in_dtype=in_dtype, kmin=-127, kmax=110),
    ]


@pytest.mark.parametrize("scale_rounding", ["up", "floor"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_float32_matches_oracle(layout, elem, scale_rounding):
    shape, axis, block = LAYOUTS[layout]
    axes = orc.blocked_axes(len(shape), axis, block)
    seed = zlib.crc32(repr((layout, elem, scale_rounding)).encode())
    for x in _inputs(seed, shape, axes, np.float32):
        check_against_oracle(x, axis=axis, block=block, elem=elem, scale_rounding=scale_rounding)


@pytest.mark.parametrize("scale_rounding", ["up", "floor"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@pytest.mark.parametrize("in_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["row_last", "square_0_2"])
def test_half_inputs_match_oracle(layout, in_dtype, elem, scale_rounding):
    shape, axis, block = LAYOUTS[layout]
    axes = orc.blocked_axes(len(shape), axis, block)
    seed = zlib.crc32(repr((layout, in_dtype, elem, scale_rounding)).encode())
    for x in _inputs(seed, shape, axes, INPUT_DTYPES[in_dtype]):
        assert x.dtype == np.dtype(INPUT_DTYPES[in_dtype])
        check_against_oracle(x, axis=axis, block=block, elem=elem, scale_rounding=scale_rounding)


def test_default_arguments_are_row_e4m3_up():
    rng = np.random.default_rng(7)
    x = log_uniform_blocks(rng, (16, 64), (1,), -30, 30, spread=12)
    q = lib_quantize(x)  # every keyword at its default
    ref = orc.quantize(x)
    assert q.axes == (-1,) and q.block == "row" and q.data.dtype == jnp.float8_e4m3fn
    _assert_codes_equal(scale_bytes(q), ref.scale, "scale bytes")
    _assert_codes_equal(data_bytes(q), ref.data, "data bytes", x=x)


def test_square_default_axes_are_last_two():
    rng = np.random.default_rng(8)
    x = log_uniform_blocks(rng, (2, 32, 64), (1, 2), -30, 30, spread=12)
    q = lib_quantize(x, block="square")
    ref = orc.quantize(x, block="square")
    assert q.axes == (-2, -1) and q.scale.shape == (2, 1, 2)
    _assert_codes_equal(scale_bytes(q), ref.scale, "scale bytes")
    _assert_codes_equal(data_bytes(q), ref.data, "data bytes", x=x)


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_dequantize_random_bytes_matches_oracle(elem, out_dtype):
    """dequantize on arbitrary (data, scale) bytes, including scale 0 (2**-127), 254 and 0xFF (NaN)."""
    rng = np.random.default_rng(zlib.crc32(repr((elem, out_dtype)).encode()))
    fmt = orc.fmt_of(ELEM_DTYPES[elem])
    shape, axes = (64, 256), (1,)
    codes = rng.integers(0, fmt.n_finite, size=shape).astype(np.uint8) | (rng.integers(0, 2, size=shape) << 7).astype(
        np.uint8
    )
    scale = rng.integers(0, 256, size=(64, 8)).astype(np.uint8)
    scale[:4] = [[0], [1], [254], [255]]  # whole rows at the extremes
    a = mx.MXArray(jnp.asarray(codes.view(fmt.dtype)), jnp.asarray(scale), (-1,), "row")
    got = lib_dequantize(a, INPUT_DTYPES[out_dtype])
    want32 = orc.dequantize(codes, scale, axes, fmt)
    if out_dtype == "float32":
        assert got.dtype == np.float32
        assert_dequant_equal(got, want32)
        return
    assert got.dtype == np.dtype(INPUT_DTYPES[out_dtype])
    # Exact product rounded once to the narrow type (float64 -> float32 is exact for these 4-bit mantissas
    # whenever normal; the narrow cast then rounds once), saturated to the narrow type's largest finite
    # value. NaN where the scale is 0xFF.
    want = orc.dequantize(codes, scale, axes, fmt, INPUT_DTYPES[out_dtype])
    assert np.isfinite(want.astype(np.float32)[np.repeat(scale, 32, axis=1) != 255]).all()  # finite stays finite
    sub32 = (want32 != 0) & (np.abs(want32) < np.float32(2.0**-126))
    g, w = got.astype(np.float32), want.astype(np.float32)
    ok = (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w)) | (sub32 & (g == 0))
    assert ok.all(), (np.argwhere(~ok)[:3], g[~ok][:3], w[~ok][:3])


def test_dequantize_square_and_row_axis0_layouts():
    rng = np.random.default_rng(11)
    fmt = orc.E4M3
    codes = rng.integers(0, 0x7F, size=(64, 96)).astype(np.uint8)
    for axes, block, sshape in [((0, 1), "square", (2, 3)), ((0,), "row", (2, 96))]:
        scale = rng.integers(90, 160, size=sshape).astype(np.uint8)
        a = mx.MXArray(jnp.asarray(codes.view(fmt.dtype)), jnp.asarray(scale), tuple(x - 2 for x in axes), block)
        assert_dequant_equal(lib_dequantize(a), orc.dequantize(codes, scale, axes, fmt))


# ---------------------------------------------------------------------------------------------------------
# Self-checks of the oracle against the spec's literal wording (no library involved)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", orc.FORMATS, ids=lambda f: f.name)
def test_oracle_up_rule_equals_jax_bit_rule(fmt):
    """The frexp-based "up" rule equals docs/numerics.md "Quantize"'s literal bit rule on every kind of float32 amax."""
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 0x7F800000, size=200_000, dtype=np.uint32)  # all finite non-negative float32
    special = np.array([0.0, 2.0**-149, 2.0**-127, 2.0**-126, 3.4028235e38], dtype=np.float32)
    near = (fmt.max * np.exp2(np.arange(-140, 113))).astype(np.float32)
    amax = np.concatenate(
        [
            bits.view(np.float32),
            special,
            near,
            np.nextafter(near, np.float32(0)),
            np.nextafter(near, np.float32(np.inf)),
        ]
    )
    np.testing.assert_array_equal(orc.scale_from_amax(amax, fmt, "up"), orc.scale_up_bitrule(amax, fmt))


@pytest.mark.parametrize("fmt", orc.FORMATS, ids=lambda f: f.name)
def test_oracle_rne_equals_ml_dtypes_cast(fmt):
    """The table-search RNE equals ml_dtypes' float32 -> fp8 cast (ties, subnormals, signed zeros)."""
    rng = np.random.default_rng(2)
    g = fmt.grid
    mids = (g[1:] + g[:-1]) / 2
    y = np.concatenate([g, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), rng.uniform(0, fmt.max, 100_000)])
    y = np.concatenate([y, -y, [0.0, -0.0, g[1] / 4, -g[1] / 4]]).astype(np.float32)
    assert np.all(np.abs(y) <= fmt.max)
    want = y.astype(fmt.dtype).view(np.uint8)
    np.testing.assert_array_equal(orc.rne_codes(y.astype(np.float64), fmt), want)


def test_oracle_hand_values():
    """A few values worked out by hand from the spec, pinning the oracle itself."""
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 449.0
    r = orc.quantize(x)  # up: v = 449/448 > 1 -> b = 128; 449 / 2 = 224.5 -> RNE 224
    assert r.scale[0, 0] == 128 and orc.decode(r.data, orc.E4M3)[0, 0] == 224.0
    r = orc.quantize(x, scale_rounding="floor")  # floor(log2 449) = 8 -> b = 127; 449 saturates to 448
    assert r.scale[0, 0] == 127 and orc.decode(r.data, orc.E4M3)[0, 0] == 448.0
    x[0, 0] = 480.0
    r = orc.quantize(x, dtype=ml_dtypes.float8_e5m2)  # b = 121: 480 * 64 = 30720, a tie -> even 32768
    assert r.scale[0, 0] == 121 and orc.decode(r.data, orc.E5M2)[0, 0] == 32768.0
