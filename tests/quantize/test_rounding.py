"""formats/rounding.py (float32 round-to-nearest-even onto the FP8 grids) against ml_dtypes' conversion, and
quantize_dequantize against the MX round trip it replaces (dequantize_products(quantize(x))), bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_mxfp8.formats import element_format
from jax_mxfp8.formats.quantize import dequantize, dequantize_products, quantize, quantize_dequantize
from jax_mxfp8.formats.rounding import round_to_elements
from tests.seeding_testutil import test_rng

DTYPES = [jnp.float8_e4m3fn, jnp.float8_e5m2]


def _edge_values(dtype) -> np.ndarray:
    """Every finite grid value within +-max, the midpoints between neighbours (the ties), the float32
    neighbours of both, zero's neighbours down to 2^-126, plus 200k random float32 in range."""
    fmt = element_format(dtype)
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    grid = np.unique(codes[np.isfinite(codes) & (np.abs(codes) <= fmt.max)])
    mids = (grid[:-1].astype(np.float64) + grid[1:]) / 2
    base = np.concatenate([grid, mids.astype(np.float32)])
    with np.errstate(over="ignore"):
        near = [np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))]
    tiny = np.float32(2.0 ** np.arange(-126, -4, 0.25))
    rng = test_rng()
    rand = (rng.uniform(-1, 1, 200_000) * fmt.max * 2.0 ** rng.integers(-30, 1, 200_000)).astype(np.float32)
    v = np.concatenate([base, *near, tiny, -tiny, rand]).astype(np.float32)
    v = v[np.abs(v) <= fmt.max]
    return v[(v == 0) | (np.abs(v) >= 2.0**-126)]  # float32 subnormals may be flushed (docs/numerics.md "Quantize")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_to_elements_equals_the_fp8_conversion(dtype):
    v = _edge_values(dtype)
    want = v.astype(np.dtype(dtype)).astype(np.float32)
    got = np.asarray(jax.jit(lambda y: round_to_elements(y, element_format(dtype)))(v))
    bad = got.view(np.uint32) != want.view(np.uint32)  # sign of zero included
    assert not bad.any(), (v[bad][:8], got[bad][:8], want[bad][:8])
    assert (np.signbit(got) == np.signbit(v)).all()  # -tiny -> -0, as the conversion


def _blocks(rng, shape) -> np.ndarray:
    """N(0,1) with log-normal magnitudes per 32 columns (2^-140 .. 2^120), zero blocks, NaN / Inf blocks,
    a block near float32's max (its MX products overflow to Inf, as dequantize_products keeps them)."""
    x = rng.standard_normal(shape).astype(np.float32)
    mag = 2.0 ** rng.integers(-100, 100, (*shape[:-1], shape[-1] // 32)).astype(np.float64)
    x = (x.reshape(*shape[:-1], -1, 32) * mag[..., None]).reshape(shape).astype(np.float32)
    x[0, :32] = 0.0
    x[1, 5] = np.nan
    x[2, 40] = np.inf
    x[3, 64:96] = np.float32(3.4e38) * np.sign(rng.standard_normal(32))  # 255.9 * 2^120: rounds to 2^128
    x[4, 96:128] = rng.standard_normal(32) * 2.0**-120  # small scales: elements near E4M3's subnormals
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("scale_rounding", ["up", "floor"])
@pytest.mark.parametrize(
    "axis, block, out_dtype",
    [(-1, "row", jnp.float32), (0, "row", jnp.bfloat16), ((0, 1), "square", jnp.float32)],
    ids=["row-last-f32", "row-0-bf16", "square-f32"],
)
@pytest.mark.parametrize("saturated", [False, True], ids=["products", "saturated"])
def test_quantize_dequantize_equals_the_round_trip(dtype, scale_rounding, axis, block, out_dtype, saturated):
    x = _blocks(test_rng(), (64, 256))
    kw = dict(axis=axis, block=block, dtype=dtype, scale_rounding=scale_rounding)
    deq = dequantize if saturated else dequantize_products
    want = jax.jit(lambda a: deq(quantize(a, **kw), out_dtype))(x)
    got = jax.jit(lambda a: quantize_dequantize(a, **kw, out_dtype=out_dtype, saturated=saturated))(x)
    assert got.dtype == want.dtype == out_dtype
    w, g = np.asarray(want.astype(jnp.float32)), np.asarray(got.astype(jnp.float32))
    assert np.isnan(w).any()  # the NaN / Inf blocks
    # "up" rounds 255.9 * 2^120 to 2^128: Inf as an IEEE product, the dtype's max when saturated
    assert np.isinf(w).any() == (scale_rounding == "up" and not saturated)
    np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


def test_quantize_dequantize_bad_arguments():
    with pytest.raises(ValueError, match="axis 1 of x has size 48"):
        quantize_dequantize(jnp.ones((2, 48)))
    with pytest.raises(ValueError, match="scale_rounding"):
        quantize_dequantize(jnp.ones((2, 32)), scale_rounding="down")
    with pytest.raises(ValueError, match="dtype"):
        quantize_dequantize(jnp.ones((2, 32)), dtype=jnp.int8)
    assert ml_dtypes.finfo(jnp.float8_e4m3fn).max == 448  # the grid the tests above enumerate
