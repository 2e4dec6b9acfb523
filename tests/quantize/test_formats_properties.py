"""Properties of MX quantization that follow from docs/numerics.md "Quantize" without a full reference: scale
bounds, the per-element error bound, re-quantization (idempotence), and stochastic rounding
(neighbours, unbiasedness)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from tests.quantize import mx_oracle as orc
from tests.quantize.mx_testutil import (
    ELEM_DTYPES,
    data_bytes,
    lib_dequantize,
    lib_quantize,
    log_uniform_blocks,
    scale_bytes,
)

AXES = (1,)


def _data(seed, lo=-100, hi=100, spread=20):
    return log_uniform_blocks(np.random.default_rng(seed), (64, 256), AXES, lo, hi, spread=spread)


@pytest.mark.parametrize("scale_rounding", ["up", "floor"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_scale_brackets_block_amax(elem, scale_rounding):
    """up: max * 2**(s-128) < amax <= max * 2**(s-127) (the smallest power of two that avoids clipping);
    floor: 2**(s-127+emax) <= amax < 2**(s-126+emax). Blocks here have scale bytes well inside (0, 254)."""
    fmt = orc.fmt_of(ELEM_DTYPES[elem])
    x = _data(31)
    q = lib_quantize(x, dtype=fmt.dtype, scale_rounding=scale_rounding)
    s = scale_bytes(q).astype(np.int64)
    amax = orc.block_reduce_max(np.abs(x.astype(np.float64)), AXES)
    assert s.min() >= 3 and s.max() <= 250
    if scale_rounding == "up":
        assert np.all(amax <= fmt.max * np.exp2(s - 127.0)) and np.all(amax > fmt.max * np.exp2(s - 128.0))
    else:
        assert np.all(amax >= np.exp2(s - 127.0 + fmt.emax)) and np.all(amax < np.exp2(s - 126.0 + fmt.emax))


@pytest.mark.parametrize("scale_rounding", ["up", "floor"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_dequantization_error_bound(elem, scale_rounding):
    """|x - deq| <= half an FP8 ulp at the element's magnitude, times the block scale, wherever x / scale is within
    +-max; beyond it (only possible under "floor") deq is exactly +-max * scale."""
    fmt = orc.fmt_of(ELEM_DTYPES[elem])
    x = _data(32)
    q = lib_quantize(x, dtype=fmt.dtype, scale_rounding=scale_rounding)
    deq = lib_dequantize(q).astype(np.float64)
    scale = np.exp2(orc.expand(scale_bytes(q), AXES).astype(np.float64) - 127)
    x64 = x.astype(np.float64)
    y = x64 / scale  # exact: scale is a power of two
    inside = np.abs(y) <= fmt.max
    err = np.abs(x64 - deq)
    bound = 0.5 * orc.ulp_at(y, fmt) * scale
    assert np.all(err[inside] <= bound[inside])
    assert np.all(deq[~inside] == np.sign(x64[~inside]) * fmt.max * scale[~inside])
    if scale_rounding == "up":
        assert inside.all()
    else:
        assert (~inside).any()  # the floor rule does saturate on this data
        assert np.all(np.abs(y) < 2.0 ** (fmt.emax + 1))  # ... but never by more than its top binade
    # The bound is tight in the aggregate: RNE error of uniform-ish data uses about half of it on average.
    rel = err[inside & (x64 != 0)] / bound[inside & (x64 != 0)]
    assert 0.3 < rel.mean() < 0.7


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_requantize_floor_is_idempotent(elem):
    fmt = orc.fmt_of(ELEM_DTYPES[elem])
    q = lib_quantize(_data(33), dtype=fmt.dtype, scale_rounding="floor")
    q2 = lib_quantize(lib_dequantize(q), dtype=fmt.dtype, scale_rounding="floor")
    np.testing.assert_array_equal(scale_bytes(q2), scale_bytes(q))
    np.testing.assert_array_equal(data_bytes(q2), data_bytes(q))


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_requantize_up_is_idempotent(elem):
    """quantize(dequantize(q)) == q for "up", with one exact exception that the rule implies: when a block's
    largest element rounded down to exactly max/2 (e.g. 449 -> 224.5 -> 224 in E4M3), the dequantized amax is
    max * 2**(b-128), so the new scale byte is b - 1 and every element doubles (the values are unchanged)."""
    fmt = orc.fmt_of(ELEM_DTYPES[elem])
    x = _data(34)
    # Force that case into every block of every 4th row: amax = 449/448 * max * 2**k (its element rounds to max/2).
    rng = np.random.default_rng(35)
    x = x.copy()
    anchor = np.float32(fmt.max * (1 + 1 / 448)) * np.exp2(np.arange(0, 64, 4, dtype=np.float32)[:, None] - 30)
    x[::4] = anchor * rng.uniform(-0.99, 0.99, size=(16, 256)).astype(np.float32)
    x[::4, ::32] = anchor
    q = lib_quantize(x, dtype=fmt.dtype)
    q2 = lib_quantize(lib_dequantize(q), dtype=fmt.dtype)
    s, s2 = scale_bytes(q).astype(int), scale_bytes(q2).astype(int)
    top = orc.block_reduce_max(np.abs(orc.decode(data_bytes(q), fmt)), AXES)
    half = top == fmt.max / 2
    assert half.sum() >= 16 and np.all(top >= fmt.max / 2)
    np.testing.assert_array_equal(s2[~half], s[~half])
    np.testing.assert_array_equal(s2[half], s[half] - 1)
    same = ~orc.expand(half, AXES)
    np.testing.assert_array_equal(data_bytes(q2)[same], data_bytes(q)[same])
    v, v2 = orc.decode(data_bytes(q), fmt), orc.decode(data_bytes(q2), fmt)
    np.testing.assert_array_equal(v2[~same], 2 * v[~same])
    np.testing.assert_array_equal(lib_dequantize(q2), lib_dequantize(q))  # value-level idempotence everywhere


# ---------------------------------------------------------------------------------------------------------
# Stochastic rounding
# ---------------------------------------------------------------------------------------------------------

N_DRAWS = 2048


def _sr_draws(x, keys, elem, scale_rounding):
    dtype = ELEM_DTYPES[elem]
    f = jax.jit(
        jax.vmap(
            lambda k: mx.quantize(x, dtype=dtype, scale_rounding=scale_rounding, rounding="stochastic", rng=k),
        )
    )
    return f(keys)


def _sr_input(seed, fmt):
    rng = np.random.default_rng(seed)
    x = log_uniform_blocks(rng, (4, 64), AXES, -20, 20, spread=12)
    x[0, :32] = np.float32(2.0 ** rng.integers(-4, 4, size=32) * rng.choice([1.0, 1.25, -1.5, 1.75], size=32))
    return x


@pytest.mark.parametrize("scale_rounding", ["up", "floor"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_stochastic_rounding_neighbours_and_unbiased(elem, scale_rounding):
    fmt = orc.fmt_of(ELEM_DTYPES[elem])
    x = _sr_input(41, fmt)
    ref = orc.quantize(x, dtype=fmt.dtype, scale_rounding=scale_rounding)
    qs = _sr_draws(jnp.asarray(x), jax.random.split(jax.random.key(5), N_DRAWS), elem, scale_rounding)
    assert qs.data.shape == (N_DRAWS, *x.shape) and qs.axes == (-1,)
    # Scales do not depend on the rounding mode.
    np.testing.assert_array_equal(scale_bytes(qs), np.broadcast_to(ref.scale, (N_DRAWS, *ref.scale.shape)))
    vals = orc.decode(data_bytes(qs), fmt)  # (draws, ...) element values
    lo, hi = orc.neighbours(ref.scaled, fmt)  # of the clipped scaled value
    assert np.all((vals == lo) | (vals == hi)), "stochastic rounding left the two neighbouring FP8 values"
    # Unbiased: mean within 5 sigma of the clipped scaled value (exactly representable -> always exact).
    y = ref.scaled
    gap = np.abs(hi - lo)
    p = np.where(gap > 0, np.abs(y - lo) / np.where(gap > 0, gap, 1), 0)
    sigma = gap * np.sqrt(p * (1 - p) / N_DRAWS)
    dev = np.abs(vals.mean(axis=0) - y)
    assert np.all(dev <= 5 * sigma + 1e-12 * np.abs(y)), np.max(dev / np.maximum(sigma, 1e-300))
    assert np.all(vals[:, gap == 0] == y[gap == 0])
    # Both neighbours are actually used where the value is strictly between them (p not extreme).
    mid = (p > 0.2) & (p < 0.8)
    assert mid.sum() > 50
    assert np.all((vals[:, mid] == hi[mid]).any(axis=0) & (vals[:, mid] == lo[mid]).any(axis=0))
    if scale_rounding == "up":
        np.testing.assert_array_equal(y, np.clip(y, -fmt.max, fmt.max))  # nothing clipped: fully unbiased


def test_stochastic_different_keys_differ_same_key_repeats():
    x = jnp.asarray(_sr_input(42, orc.E4M3))
    a = lib_quantize(x, rounding="stochastic", rng=jax.random.key(1))
    b = lib_quantize(x, rounding="stochastic", rng=jax.random.key(2))
    a2 = lib_quantize(x, rounding="stochastic", rng=jax.random.key(1))
    assert not np.array_equal(data_bytes(a), data_bytes(b))
    np.testing.assert_array_equal(data_bytes(a), data_bytes(a2))
    np.testing.assert_array_equal(scale_bytes(a), scale_bytes(b))


def test_stochastic_raw_uint32_key_accepted_or_rejected_cleanly():
    x = jnp.asarray(_sr_input(43, orc.E4M3))
    q = lib_quantize(x, rounding="stochastic", rng=jax.random.PRNGKey(3))  # legacy uint32[2] key
    ref = orc.quantize(np.asarray(x))
    lo, hi = orc.neighbours(ref.scaled, orc.E4M3)
    v = orc.decode(data_bytes(q), orc.E4M3)
    assert np.all((v == lo) | (v == hi))


def test_stochastic_special_blocks():
    """Zero blocks stay zero and NaN/Inf blocks stay NaN under stochastic rounding too."""
    x = np.ones((3, 32), np.float32) * 1.3
    x[0] = 0.0
    x[1, 7] = np.inf
    q = lib_quantize(x, rounding="stochastic", rng=jax.random.key(0))
    np.testing.assert_array_equal(scale_bytes(q)[:, 0], [0, 255, 119])  # ceil(log2(1.3 / 448)) = -8
    deq = lib_dequantize(q)
    assert np.all(deq[0] == 0) and np.all(np.isnan(deq[1]))
    assert np.all((deq[2] == np.float32(1.25)) | (deq[2] == np.float32(1.375)))


def test_stochastic_requires_key():
    with pytest.raises(ValueError, match="key"):
        mx.quantize(jnp.ones((2, 32)), rounding="stochastic")
