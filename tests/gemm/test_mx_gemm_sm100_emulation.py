"""The Blackwell MX GEMM's XLA emulation (primitives/mx_gemm_sm100_emulation.py) on CPU.

Mainloop: bit for bit against an independent float64 NumPy model of MX GEMM (each 32-block's dot product in
float64, exact; times 2^(sa - 127) 2^(sb - 127); rounded once to float32; float32 sum over blocks in
ascending order), on wide-magnitude E4M3 operands, edge shapes (M, N, K not multiples of 128), a batch,
NaN elements and NaN scales. Epilogue: the kernel's quantize formula bit for bit against
jax_mxfp8.quantize and against the NumPy oracle (tests/quantize/mx_oracle.py) on boundary and mixed blocks, NaN and
Inf blocks in both orientations; every variant's outputs (shapes, blocked scales, the transposed column
orientation, bias, GELU, pre). Nothing here runs the kernel: no Blackwell GPU exists on these machines.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.formats import from_blocked_scales, to_blocked_scales
from jax_mxfp8.kernels.registry.gemm_sm100 import MX_GEMM_SM100_VARIANTS, MXGemmSm100Config
from jax_mxfp8.primitives import mx_gemm_sm100_emulation as emu
from tests.quantize import mx_oracle
from tests.quantize.mx_testutil import boundary_blocks, mixed_blocks
from tests.seeding_testutil import test_rng

E4M3 = ml_dtypes.float8_e4m3fn


def e4m3_operand(rng, shape, lo=-6, hi=6) -> np.ndarray:
    """E4M3 values with magnitudes spread over 2^lo .. 2^hi (subnormals included), random signs."""
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(lo, hi, size=shape))
    return np.clip(x, -448, 448).astype(E4M3)


def mx_gemm_float64_model(a, b, sa, sb) -> np.ndarray:
    """float32 (G, M, N): per 32-block float64 dot (exact: terms are multiples of 2^-18 below 2^23), times
    the two scales in float64, rounded to float32 once, summed over blocks in float32 in ascending order.
    a (G, M, K), b (G, N, K) E4M3; sa (G, M, K/32), sb (G, N, K/32) uint8 (plain layout)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    g, m, k = a.shape
    acc = np.zeros((g, m, b.shape[1]), np.float32)
    for kb in range(k // 32):
        blk = slice(32 * kb, 32 * kb + 32)
        dot = np.einsum("gmk,gnk->gmn", a64[..., blk], b64[..., blk])
        scale = np.exp2(sa[:, :, kb].astype(np.float64) - 127)[:, :, None] * np.exp2(sb[:, :, kb] - 127.0)[:, None]
        nan = (sa[:, :, kb] == 0xFF)[:, :, None] | (sb[:, :, kb] == 0xFF)[:, None, :]
        with np.errstate(invalid="ignore"):
            v = np.where(nan, np.nan, dot * scale).astype(np.float32)
        acc = (acc + v).astype(np.float32)
    return acc


def _run_mainloop(a, b, sa, sb):
    f = jax.jit(emu.block_scaled_accumulate)
    return np.asarray(
        f(jnp.asarray(a), jnp.asarray(b), to_blocked_scales(jnp.asarray(sa)), to_blocked_scales(jnp.asarray(sb)))
    )


@pytest.mark.parametrize("g, m, n, k", [(1, 128, 128, 128), (2, 100, 96, 160), (1, 37, 200, 64), (1, 256, 64, 512)])
def test_mainloop_bit_exact_against_float64_model(g, m, n, k):
    rng = test_rng()
    a, b = e4m3_operand(rng, (g, m, k)), e4m3_operand(rng, (g, n, k))
    # scale products stay well inside float32's normal range: every block value is a normal float32
    sa = rng.integers(110, 145, size=(g, m, k // 32), dtype=np.uint8)
    sb = rng.integers(110, 145, size=(g, n, k // 32), dtype=np.uint8)
    got, want = _run_mainloop(a, b, sa, sb), mx_gemm_float64_model(a, b, sa, sb)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_mainloop_block_dot_is_rounded_once():
    """A block 8192 + 0.375 ulp + 0.375 ulp (ulp = 2^-10): the exact sum is above half an ulp, so rounded once
    it is 8192 + 2^-10; adding the terms one at a time in float32 would give 8192."""
    a = np.zeros((1, 1, 32), np.float64)
    b = np.zeros((1, 1, 32), np.float64)
    a[0, 0, :3] = [256.0, 2.0**-6, 2.0**-6]
    b[0, 0, :3] = [32.0, 1.5 * 2.0**-6, 1.5 * 2.0**-6]
    a8, b8 = a.astype(E4M3), b.astype(E4M3)
    s = np.full((1, 1, 1), 127, np.uint8)
    got = _run_mainloop(a8, b8, s, s)
    assert got[0, 0, 0] == np.float32(8192 + 2.0**-10)
    np.testing.assert_array_equal(got, mx_gemm_float64_model(a8, b8, s, s))


def test_mainloop_nan_elements_and_nan_scales():
    rng = test_rng()
    g, m, n, k = 1, 64, 64, 128
    a, b = e4m3_operand(rng, (g, m, k)), e4m3_operand(rng, (g, n, k))
    a[0, 3, 40] = np.nan  # row 3: NaN everywhere
    sa = np.full((g, m, k // 32), 127, np.uint8)
    sb = np.full((g, n, k // 32), 127, np.uint8)
    sb[0, 7, 2] = 0xFF  # column 7: NaN everywhere
    got = _run_mainloop(a, b, sa, sb)
    nan = np.zeros((m, n), bool)
    nan[3, :] = True
    nan[:, 7] = True
    np.testing.assert_array_equal(np.isnan(got[0]), nan)
    a[0, 3, 40] = 0
    want = mx_gemm_float64_model(a, b, sa, sb)
    np.testing.assert_array_equal(got[0][~nan], want[0][~nan])


# ------------------------------------------------------------------------------------------------ epilogue
def _hard_values(rng, shape, axes) -> np.ndarray:
    x = np.where(rng.random(shape) < 0.5, boundary_blocks(rng, shape, axes), mixed_blocks(rng, shape, axes))
    return x.astype(np.float32)


@pytest.mark.parametrize("make", ["boundary_mixed", "specials"])
def test_quantize_rule_bit_exact_against_quantize_and_oracle(make):
    rng = test_rng()
    z = _hard_values(rng, (64, 256), (1,))
    if make == "specials":
        z[0, :32] = 0.0  # all-zero block: scale 0, data 0
        z[1, 5] = np.nan
        z[2, 33] = np.inf
        z[3, 70] = -np.inf
        z[4, :32] = np.float32(3.0e38)  # near float32's max
        z[5, 64:96] = np.float32(1e-39)  # float32 subnormals (the contract allows flushing them)
    q, s = jax.jit(emu.quantize_blocks_kernel_rule)(jnp.asarray(z))
    ref = jax_mxfp8.quantize(jnp.asarray(z), axis=-1)
    np.testing.assert_array_equal(np.asarray(s), np.asarray(ref.scale))
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), np.asarray(ref.data).view(np.uint8))
    if make == "boundary_mixed":  # the NumPy oracle keeps float32 subnormals: compare where there are none
        orc = mx_oracle.quantize(z, axis=-1)
        np.testing.assert_array_equal(np.asarray(s), orc.scale)
        np.testing.assert_array_equal(np.asarray(q).view(np.uint8), orc.data)


def test_nan_block_gets_nan_scale_in_both_orientations():
    """A block holding NaN gets 0xFF whether it is a row block or a column block (the kernel's amaxes are
    unsigned maxes of |x| bit patterns, NaN above Inf: thread-local, or REDUX.MAX.U32 across a warp). A float
    max that ignores NaN (redux.sync.max.abs.f32 without .NaN, modelled by np.fmax) would give that block a
    finite scale."""
    z = np.ones((64, 64), np.float32)
    z[40, 10] = np.nan  # row block (40, 0) and column block (10, 1)
    cfg = MXGemmSm100Config(epilogue="rowcol", store_pre=True)
    out = jax.jit(lambda y: emu.epilogue_outputs(y, cfg))(jnp.asarray(z)[None])
    s = np.asarray(from_blocked_scales(out["s"], 64, 2))[0]
    sc = np.asarray(from_blocked_scales(out["sc"], 64, 2))[0]
    assert s[40, 0] == 0xFF and sc[10, 1] == 0xFF
    one = 127 - 8  # amax 1: 1 / 448 rounds up to 2^-8
    assert (np.delete(s.reshape(-1), 40 * 2) == one).all() and (np.delete(sc.reshape(-1), 10 * 2 + 1) == one).all()
    assert np.isnan(np.asarray(out["qc"], np.float32)[0, 10, 32:]).all()
    credux_like = np.fmax.reduce(np.abs(z[32:64, 10]))  # ignores the NaN: 1.0, a finite scale
    assert credux_like == 1.0


# --------------------------------------------------------------------------------------------- variants
def _operands(rng, g, m, n, k, bias):
    a, b = e4m3_operand(rng, (g, m, k)), e4m3_operand(rng, (g, n, k))
    sa = to_blocked_scales(jnp.asarray(rng.integers(118, 136, size=(g, m, k // 32), dtype=np.uint8)))
    sb = to_blocked_scales(jnp.asarray(rng.integers(118, 136, size=(g, n, k // 32), dtype=np.uint8)))
    bb = jnp.asarray(rng.standard_normal(n).astype(np.float32) * 100) if bias else None
    return jnp.asarray(a), jnp.asarray(b), sa, sb, bb


VARIANTS_1CTA = [v for v in MX_GEMM_SM100_VARIANTS if v.cta_group == 1]


@pytest.mark.parametrize("config", VARIANTS_1CTA, ids=lambda v: v.name)
def test_variant_outputs_match_quantize_of_the_float32_result(config):
    rng = test_rng()
    g, m, n, k = 2, 96, 160, 96
    a, b, sa, sb, bias = _operands(rng, g, m, n, k, config.has_bias)
    out = jax.jit(lambda *x: emu.emulate_mx_gemm_sm100(*x, config=config))(a, b, sa, sb, bias)
    assert set(out) == set(config.outputs)
    y = emu.block_scaled_accumulate(a, b, sa, sb)
    y = y + bias if bias is not None else y
    z = jax.nn.gelu(y, approximate=True) if config.activation == "gelu" else y
    if "c" in out:
        assert out["c"].dtype == jnp.dtype(config.out_dtype) and out["c"].shape == (g, m, n)
        np.testing.assert_array_equal(
            np.asarray(out["c"], np.float32), np.asarray(y.astype(config.out_dtype), np.float32)
        )
    if "q" in out:
        ref = jax_mxfp8.quantize(z, axis=-1)
        assert out["s"].shape == (g, 1, 2, 512)
        np.testing.assert_array_equal(np.asarray(from_blocked_scales(out["s"], m, n // 32)), np.asarray(ref.scale))
        np.testing.assert_array_equal(np.asarray(out["q"]).view(np.uint8), np.asarray(ref.data).view(np.uint8))
    if "qc" in out:
        ref = jax_mxfp8.quantize(z, axis=-2)  # blocks of 32 along M
        assert out["qc"].shape == (g, n, m) and out["sc"].shape == (g, 2, 1, 512)
        sc = np.asarray(from_blocked_scales(out["sc"], n, m // 32))
        np.testing.assert_array_equal(sc, np.swapaxes(np.asarray(ref.scale), -1, -2))
        np.testing.assert_array_equal(
            np.asarray(out["qc"]).view(np.uint8), np.swapaxes(np.asarray(ref.data).view(np.uint8), -1, -2)
        )


def test_argument_errors_name_the_argument():
    cfg = MXGemmSm100Config(epilogue="col", store_pre=True)
    rng = test_rng()
    a, b, sa, sb, _ = _operands(rng, 1, 64, 64, 64, False)
    with pytest.raises(ValueError, match="M = 48"):
        emu.emulate_mx_gemm_sm100(a[:, :48], b, sa, sb, None, cfg)
    with pytest.raises(ValueError, match="K = 48"):
        emu.emulate_mx_gemm_sm100(a[..., :48], b[..., :48], sa, sb, None, cfg)
    with pytest.raises(ValueError, match="sb"):
        emu.emulate_mx_gemm_sm100(a, b, sa, sb[:, :, :, :256], None, cfg)
    with pytest.raises(ValueError, match="bias"):
        emu.emulate_mx_gemm_sm100(a, b, sa, sb, jnp.zeros(64, jnp.float32), cfg)
    with pytest.raises(ValueError, match="a has dtype"):
        emu.emulate_mx_gemm_sm100(a.astype(jnp.bfloat16), b, sa, sb, None, cfg)
