"""Properties of jax_mxfp8.quantize over random shapes, values and special values (hypothesis, bounded), through
the public API only.

Two independent references:
  * jax.nn's own MXFP8 quantizer (jax._src.cudnn.scaled_matmul_stablehlo.quantize, behind
    jax.nn.scaled_dot_general), bit for bit for scale_rounding="up" on float32 input, on the blocks where it is
    defined on this backend: finite blocks with amax >= max * 2^-126 (below that it divides by the subnormal
    2^-127, which XLA:CPU flushes; all-zero blocks come back NaN, NaN blocks with scale 0; docs/numerics.md);
  * the NumPy model of the contract (tests/quantize/mx_oracle.py: frexp scale rules, round-to-nearest-even on the
    FP8 grid), bit for bit for both scale roundings and every block: zero blocks scale 0 and zero data,
    non-finite blocks scale 0xFF and NaN data, float32's max saturating.
Inputs: float32 (and bfloat16 / float16 against the model), blocks drawn over the whole float32 exponent range
with NaN, +-Inf, +-0, float32's max, the formats' max times powers of two and RNE ties mixed in. float32
subnormal inputs are flushed first (the contract lets them flush; docs/numerics.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig
from jax._src.cudnn.scaled_matmul_stablehlo import quantize as jaxnn_quantize

import jax_mxfp8 as mx
from tests.quantize import mx_oracle as orc
from tests.quantize.mx_testutil import flush_subnormals

PROPERTY = settings(max_examples=60, deadline=None, database=None, derandomize=True)
ELEMS = {"e4m3": (jnp.float8_e4m3fn, orc.E4M3), "e5m2": (jnp.float8_e5m2, orc.E5M2)}
F32_MAX = float(np.finfo(np.float32).max)


LAYOUTS = [((64,), -1), ((3, 96), -1), ((64, 3), -2), ((2, 32, 5), -2)]
"""(shape, blocked axis): a few layouts of rank 1-3, so that compilations are shared between examples."""


@st.composite
def blocked_arrays(draw, in_dtype=np.float32, layouts=tuple(LAYOUTS)):
    """(x, axis): x in one of `layouts`; each block a magnitude 2^E (E over the float32 range) times values
    spread over a few binades, with special values, zero blocks and FP8 grid points / ties mixed in."""
    shape, axis = draw(st.sampled_from(layouts), label="layout")
    shape, rank = list(shape), len(shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    moved = [n for i, n in enumerate(shape) if i != rank + axis] + [shape[axis]]  # blocked axis last
    n_blocks = int(np.prod(moved)) // 32
    e_lo, e_hi = draw(st.sampled_from([(-140, 128), (-20, 20), (-130, -110), (100, 128)]), label="exponents")
    exps = rng.integers(e_lo, e_hi, size=(n_blocks, 1))
    spread = draw(st.sampled_from([0, 3, 12, 40]), label="spread")
    mags = np.exp2(exps - rng.uniform(0, spread, size=(n_blocks, 32)))
    x = rng.choice([-1.0, 1.0], size=(n_blocks, 32)) * mags * rng.uniform(1, 2, size=(n_blocks, 32))
    specials = np.array(
        [0.0, -0.0, np.nan, np.inf, -np.inf, F32_MAX, -F32_MAX, 448.0, 449.0, 57344.0, 61440.0, 464.0, 2.0**-126]
    )
    for kind in draw(st.lists(st.sampled_from(["scatter", "zero block", "special block", "ties"]), max_size=3)):
        b = rng.integers(n_blocks)
        if kind == "scatter":
            idx = rng.integers(0, x.size, size=rng.integers(1, 4))
            x.reshape(-1)[idx] = rng.choice(specials, size=idx.size)
        elif kind == "zero block":
            x[b] = rng.choice([0.0, -0.0], size=32)
        elif kind == "special block":  # one special value and ordinary ones
            x[b] = rng.standard_normal(32)
            x[b, rng.integers(32)] = rng.choice(specials)
        else:  # FP8 grid points and RNE ties times a power of two
            fmt = ELEMS[draw(st.sampled_from(sorted(ELEMS)))][1]
            g = fmt.grid
            pts = np.concatenate([g, (g[1:] + g[:-1]) / 2])
            x[b] = rng.choice(pts, size=32) * rng.choice([-1.0, 1.0], size=32) * 2.0 ** rng.integers(-100, 100)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        x = x.astype(np.float32).astype(in_dtype)
    x = np.moveaxis(x.reshape(moved), -1, axis)
    return flush_subnormals(x) if np.dtype(in_dtype) != np.dtype(np.float16) else x, axis


def _bytes(a) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(a.data).view(np.uint8), np.asarray(a.scale)


@functools.cache
def _quantize(axis, elem, scale_rounding):
    return jax.jit(lambda v: mx.quantize(v, axis=axis, dtype=ELEMS[elem][0], scale_rounding=scale_rounding))


def _check_against_model(x, axis, elem, scale_rounding):
    dtype, fmt = ELEMS[elem]
    q = _quantize(axis, elem, scale_rounding)(jnp.asarray(x))
    ref = orc.quantize(x, axis=axis, dtype=dtype, scale_rounding=scale_rounding)
    data, scale = _bytes(q)
    np.testing.assert_array_equal(scale, ref.scale)
    np.testing.assert_array_equal(data[ref.finite], ref.data[ref.finite])
    # non-finite blocks: scale 0xFF (checked above) and NaN data (decoded from the bits, independently)
    values = orc.decode(data, fmt)
    assert np.all(np.isnan(values[~ref.finite])) and not np.any(np.isnan(values[ref.finite]))
    return q, ref


@PROPERTY
@given(xa=blocked_arrays(), elem=st.sampled_from(sorted(ELEMS)), scale_rounding=st.sampled_from(["up", "floor"]))
def test_float32_matches_the_numpy_model_of_the_contract(xa, elem, scale_rounding):
    x, axis = xa
    _check_against_model(x, axis, elem, scale_rounding)


@PROPERTY
@given(
    xa=st.one_of(blocked_arrays(ml_dtypes.bfloat16, LAYOUTS[1:2]), blocked_arrays(np.float16, LAYOUTS[1:2])),
    elem=st.sampled_from(sorted(ELEMS)),
    scale_rounding=st.sampled_from(["up", "floor"]),
)
def test_bfloat16_and_float16_match_the_numpy_model(xa, elem, scale_rounding):
    x, axis = xa
    _check_against_model(x, axis, elem, scale_rounding)


@functools.cache
def _jaxnn_quantize(elem):
    cfg = BlockScaleConfig(
        mode="mxfp8",
        block_size=32,
        data_type=ELEMS[elem][0],
        scale_type=jnp.float8_e8m0fnu,
        global_scale=None,
        infer_only=False,
    )
    return jax.jit(lambda v: jaxnn_quantize(v, cfg))


def _jaxnn(x, elem):
    d, s = _jaxnn_quantize(elem)(jnp.asarray(x))
    return np.asarray(d).view(np.uint8), np.asarray(s).view(np.uint8)


@PROPERTY
@given(xa=blocked_arrays(), elem=st.sampled_from(sorted(ELEMS)))
def test_up_is_bit_identical_to_jax_nn_where_jax_nn_is_defined(xa, elem):
    x, axis = xa
    _, fmt = ELEMS[elem]
    q, ref = _check_against_model(x, axis, elem, "up")
    # jax.nn blocks the last axis: compare on the blocked axis moved last
    xl = np.moveaxis(x, axis, -1)
    d_nn, s_nn = _jaxnn(xl, elem)
    data, scale = (np.moveaxis(a, axis, -1) for a in _bytes(q))
    blocks = xl.reshape(*xl.shape[:-1], -1, 32)
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(blocks), axis=-1)
    defined = np.isfinite(amax) & (amax >= fmt.max * 2.0**-126)  # jax.nn's scale byte >= 1, no NaN / Inf
    np.testing.assert_array_equal(scale[defined], s_nn[defined])
    elems = np.repeat(defined, 32, axis=-1)
    np.testing.assert_array_equal(data[elems], d_nn[elems])
    # where jax.nn is not defined the model decided (above): zero blocks are 0 / scale 0, never NaN
    zero = amax == 0
    assert np.all(scale[zero] == 0) and np.all(data[np.repeat(zero, 32, axis=-1)] & 0x7F == 0)
