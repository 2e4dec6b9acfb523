"""Cross-check against jax.nn's own MXFP8 quantizer (the one behind jax.nn.scaled_dot_general).

docs/numerics.md "Quantize" says scale_rounding="up" is bit-identical to it. jax.nn computes x / e8m0_to_dtype(scale)
and maps scale byte 0 to the float32 constant 2**-127, a subnormal that XLA CPU flushes to zero, so on CPU jax.nn is
only well defined for blocks with scale byte >= 1: float32 inputs, no zero blocks and block amax >= max * 2**-126
(then amax / max >= 2**-126 and the "up" byte is at least 1). Inputs are generated inside that domain. Element
quotients below 2**-126 are flushed by XLA CPU before the FP8 cast; they round to (signed) zero either way.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig
from jax._src.cudnn.scaled_matmul_stablehlo import quantize as jaxnn_quantize

from tests.quantize import mx_oracle as orc
from tests.quantize.mx_testutil import (
    ELEM_DTYPES,
    boundary_blocks,
    data_bytes,
    lib_quantize,
    log_uniform_blocks,
    scale_bytes,
)


def _config(elem):
    if elem == "e4m3":
        return jax.nn.get_scaled_dot_general_config("mxfp8")
    return BlockScaleConfig(
        mode="mxfp8",
        block_size=32,
        data_type=jnp.float8_e5m2,
        scale_type=jnp.float8_e8m0fnu,
        global_scale=None,
        infer_only=False,
    )


def _jaxnn_bytes(x, elem):
    cfg = _config(elem)
    d, s = jax.jit(lambda v: jaxnn_quantize(v, cfg))(jnp.asarray(x))
    assert s.dtype == jnp.float8_e8m0fnu
    return np.asarray(d).view(np.uint8), np.asarray(s).view(np.uint8)


def _in_domain(rng, shape, fmt):
    """float32 (B, M, K) blocks along K, every block amax >= fmt.max * 2**-126 (scale byte >= 1 under "up")."""
    lo = np.log2(fmt.max) - 125  # per-block exponent floor: amax >= 2 * max * 2**-126
    xs = [
        log_uniform_blocks(rng, shape, (2,), lo, 120, spread=40),
        log_uniform_blocks(rng, shape, (2,), -4, 4, spread=10),
        boundary_blocks(rng, shape, (2,), kmin=-120, kmax=100),
    ]
    out = []
    for x in xs:
        amax = orc.block_reduce_max(np.abs(x.astype(np.float64)), (2,))
        x = x.copy()
        low = orc.expand(amax < fmt.max * 2.0**-126, (2,))
        x[low] = np.float32(fmt.max * 2.0**-125)  # lift the few blocks below the domain
        out.append(x)
    return out


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_up_is_bit_identical_to_jax_nn(elem):
    fmt = orc.fmt_of(ELEM_DTYPES[elem])
    rng = np.random.default_rng(21 if elem == "e4m3" else 22)
    for x in _in_domain(rng, (2, 24, 128), fmt):
        d_nn, s_nn = _jaxnn_bytes(x, elem)
        assert s_nn.min() >= 1
        q = lib_quantize(x, dtype=ELEM_DTYPES[elem])
        np.testing.assert_array_equal(scale_bytes(q), s_nn)
        np.testing.assert_array_equal(data_bytes(q), d_nn)
        ref = orc.quantize(x, dtype=ELEM_DTYPES[elem])  # and the oracle agrees with jax.nn too
        np.testing.assert_array_equal(ref.scale, s_nn)
        np.testing.assert_array_equal(ref.data, d_nn)


def test_axis0_matches_jax_nn_on_transpose():
    rng = np.random.default_rng(23)
    x = _in_domain(rng, (1, 32, 96), orc.E4M3)[0][0].T  # (96, 32), blocked along axis 0
    d_nn, s_nn = _jaxnn_bytes(x.T[None], "e4m3")
    q = lib_quantize(np.ascontiguousarray(x), axis=0)
    np.testing.assert_array_equal(scale_bytes(q), s_nn[0].T)
    np.testing.assert_array_equal(data_bytes(q), d_nn[0].T)


def test_jax_nn_scale_dtype_view_is_e8m0():
    """The e8m0 bytes we compare are the exponent bytes: 2**(b - 127) (sanity of the byte view)."""
    s = np.array([1, 127, 128, 254], np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    np.testing.assert_array_equal(s, [2.0**-126, 1.0, 2.0, 2.0**127])
