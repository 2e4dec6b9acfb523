"""The GEMM reference's bfloat16-operand path against its float32 HIGHEST path (the oracle).

Claim under test (jax_mxfp8/reference/gemm.py, module docstring): every MX operand value >= 2^-126 in
magnitude is exactly a bfloat16, and bf16 x bf16 products are exact in float32, so the two paths sum
the same products and differ only in summation order.

Bit-exactness of the GEMM results does not hold on XLA:CPU for general data: there the bfloat16 dot
runs through YNNPACK and the float32 HIGHEST dot through another kernel, with different summation
orders (measured: 1.5e-5 absolute on 256x1024 @ 1024x512 N(0,1) MX operands, ~1 float32 ulp of the
result). So the tests check (1) the operands bit for bit, (2) the GEMMs bit for bit on data whose every
partial sum is exact in float32 (any summation order gives the same bits), and (3) the GEMMs on random
data within the worst-case bound of reordering a float32 sum of K exact products:
|fl1 - fl2| <= 2 * gamma_(K-1) * sum_k |a_k b_k|, gamma_n = n u / (1 - n u), u = 2^-24.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.formats import MXArray
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.reference import gemm
from tests.gemm.mx_gemm_testutil import study_operand

U = 2.0**-24
ELEMS = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
# (lhs3, rhs3) shapes (B, M, K), (B, N, K); the second has M, N not multiples of 32 (partial backward blocks)
SHAPES = [((1, 128, 512), (1, 96, 512)), ((2, 40, 256), (2, 72, 256))]


def _data(kind: str, shape, seed: int) -> np.ndarray:
    """float32 test operands of `kind` (mx_gemm_testutil.study_operand) from a fixed seed."""
    return study_operand(kind, shape, np.random.default_rng(seed))


def _config(elem: str) -> MXDotConfig:
    return MXDotConfig(dtype=ELEMS[elem], grad_dtype=ELEMS[elem])


@functools.cache
def _jitted(name: str, config: MXDotConfig, operands: str):
    if name == "forward":
        return jax.jit(lambda a, b: gemm.mx_dot_forward(a, b, config, lhs_q3=None, rhs_q3=None, operands=operands))
    if name == "backward":
        return jax.jit(lambda a, b, g: gemm.mx_dot_backward(a, b, g, config, None, operands=operands))
    purpose, grad = {"fwd_operand": (gemm.FWD, False), "grad_operand": (gemm.DGRAD, True)}[name]
    return jax.jit(lambda x: gemm.quantized_3d(x, config, purpose, grad=grad, operands=operands))


def _both(name: str, config: MXDotConfig, *args):
    """(bfloat16-path result, float32-path result) as NumPy arrays."""
    return tuple(jax.tree.map(np.asarray, _jitted(name, config, ops)(*args)) for ops in ("bfloat16", "float32"))


@functools.cache
def _operands_f32_jitted(config: MXDotConfig):
    """One program per config (run eagerly, its small ops cost ~1 min of compiles per shape on CI's CPU)."""

    @jax.jit
    def operands(a3, b3, g3):
        q = functools.partial(gemm.quantized_3d, config=config, operands="float32")
        t = functools.partial(jnp.swapaxes, axis1=1, axis2=2)
        fwd = (q(a3, purpose=gemm.FWD), q(b3, purpose=gemm.FWD))
        dgrad = (q(g3, purpose=gemm.DGRAD, grad=True), q(t(b3), purpose=gemm.DGRAD))
        if config.weight_grad == "bf16":
            wgrad = (t(g3).astype(jnp.bfloat16).astype(jnp.float32), t(a3).astype(jnp.bfloat16).astype(jnp.float32))
        else:
            wgrad = (q(t(g3), purpose=gemm.WGRAD, grad=True), q(t(a3), purpose=gemm.WGRAD))
        return fwd, dgrad, wgrad

    return operands


def _operands_f32(config: MXDotConfig, a3, b3, g3):
    """The float32 path's MX operands of the three GEMMs, as (lhs, rhs) pairs in (B, rows, K) layout."""
    pairs = _operands_f32_jitted(config)(a3, b3, g3)
    return [tuple(np.asarray(v, np.float64) for v in pair) for pair in pairs]


def _assert_within_reordering_bound(got, ref, lhs, rhs, where=None):
    """|got - ref| <= 2 gamma_(K-1) (|lhs| @ |rhs|^T) elementwise, plus K * 2^-126 for flushed tiny products
    (only at `where`, default everywhere; non-finite operand entries count as 0 in the bound)."""
    k = lhs.shape[-1]
    gamma = (k - 1) * U / (1 - (k - 1) * U)
    lhs, rhs = (np.where(np.isfinite(v), np.abs(v), 0.0) for v in (lhs, rhs))
    bound = 2 * gamma * np.einsum("bmk,bnk->bmn", lhs, rhs) + k * 2.0**-126
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    where = np.ones(err.shape, bool) if where is None else where
    assert np.all(err[where] <= bound[where]), f"max err/bound {np.max(err[where] / bound[where]):.3g}"
    return float(np.max(err[where] / bound[where]))


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@pytest.mark.parametrize("kind", ["normal", "lognormal", "outlier"])
def test_operands_bit_exact(elem, kind):
    """Every forward and gradient MX operand of the bfloat16 path equals the float32 path's, bit for bit."""
    config = _config(elem)
    x = _data(kind, (2, 40, 256), seed=1)
    for name in ("fwd_operand", "grad_operand"):
        bf, f32 = _both(name, config, x)
        assert bf.dtype == ml_dtypes.bfloat16 and f32.dtype == np.float32
        np.testing.assert_array_equal(bf.astype(np.float32).view(np.uint32), f32.view(np.uint32))


@pytest.mark.parametrize(
    "shapes,elem,weight_grad",
    [(s, e, "mxfp8") for s in SHAPES for e in ELEMS] + [(SHAPES[1], "e4m3", "bf16")],
    ids=[f"{i}-{e}-mxfp8" for i in ("128x96x512", "b2_40x72x256") for e in ELEMS] + ["b2_40x72x256-e4m3-bf16"],
)
@pytest.mark.parametrize("kind", ["normal", "lognormal", "outlier"])
def test_forward_and_backward_gemms_within_reordering_bound(shapes, kind, elem, weight_grad):
    """Forward, lhs-gradient and rhs-gradient GEMMs of both paths agree within the reordering bound."""
    config = MXDotConfig(dtype=ELEMS[elem], grad_dtype=ELEMS[elem], weight_grad=weight_grad)
    (b, m, k), (_, n, _) = shapes
    a3, b3 = _data(kind, (b, m, k), seed=2), _data(kind, (b, n, k), seed=3)
    g3 = _data(kind, (b, m, n), seed=4)
    fwd_bf, fwd_f32 = _both("forward", config, a3, b3)
    (da_bf, db_bf), (da_f32, db_f32) = _both("backward", config, a3, b3, g3)
    ops = _operands_f32(config, a3, b3, g3)
    for got, ref, (lhs, rhs) in zip((fwd_bf, da_bf, db_bf), (fwd_f32, da_f32, db_f32), ops):
        assert got.dtype == np.float32 and got.shape == ref.shape
        # measured on XLA:CPU: at most 4.3% of the worst case; 0-91% of the elements differ in their last bits
        _assert_within_reordering_bound(got, ref, lhs, rhs)


def _exactly_summable(shape, seed: int) -> np.ndarray:
    """Integers in [-15, 15] (4 significant bits: exact in E4M3; E5M2 rounds them to integers) times 2^(row % 4):
    every MX value is an integer, and |partial sums| stay far below 2^24 for the sizes used here, so any
    summation order gives the same float32 bits."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-15, 16, size=shape).astype(np.float32)
    return x * (2.0 ** (np.arange(shape[-2]) % 4))[:, None].astype(np.float32)


@pytest.mark.parametrize("weight_grad", ["mxfp8", "bf16"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_gemms_bit_exact_when_every_partial_sum_is_exact(elem, weight_grad):
    """With summation order taken out of play, the two paths give identical bits in all three GEMMs."""
    config = MXDotConfig(dtype=ELEMS[elem], grad_dtype=ELEMS[elem], weight_grad=weight_grad)
    a3, b3, g3 = (_exactly_summable(s, seed) for seed, s in enumerate([(2, 64, 256), (2, 96, 256), (2, 64, 96)]))
    # |value| <= 15 * 8 * 2 (quantization may round up), products <= 240^2, K <= 256: sums < 2^24
    fwd_bf, fwd_f32 = _both("forward", config, a3, b3)
    grads_bf, grads_f32 = _both("backward", config, a3, b3, g3)
    for got, ref in zip((fwd_bf, *grads_bf), (fwd_f32, *grads_f32)):
        assert np.any(ref != 0)
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_nan_and_inf_propagate_identically(elem):
    """A NaN or Inf input poisons its block (scale 0xFF): the same outputs are NaN in both paths, forward and
    backward; the finite outputs stay within the reordering bound."""
    config = _config(elem)
    a3, b3, g3 = _data("normal", (1, 64, 128), 5), _data("normal", (1, 64, 128), 6), _data("normal", (1, 64, 64), 7)
    a3[0, 3, 40] = np.nan
    b3[0, 10, 100] = np.inf
    g3[0, 20, 5] = -np.inf
    fwd = _both("forward", config, a3, b3)
    (da_bf, db_bf), (da_f32, db_f32) = _both("backward", config, a3, b3, g3)
    ops = _operands_f32(config, a3, b3, g3)
    for (got, ref), (lhs, rhs) in zip((fwd, (da_bf, da_f32), (db_bf, db_f32)), ops):
        nan = np.isnan(ref)
        assert nan.any() and not nan.all()
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        _assert_within_reordering_bound(got, ref, lhs, rhs, where=~nan)
    assert np.isnan(fwd[0][0, 3]).all() and np.isnan(fwd[0][:, :, 10]).all()


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_prequantized_inf_and_nan_elements_and_overflow(elem):
    """Pre-quantized operands holding Inf elements (E5M2), NaN elements and the largest scales dequantize to the
    same bfloat16 and float32 values (Inf where element * 2^(b-127) overflows), and multiply identically."""
    dtype = ELEMS[elem]
    codes = np.arange(256, dtype=np.uint8).reshape(8, 32)
    data = jnp.asarray(codes).view(dtype)
    scale = jnp.asarray(np.array([[127], [200], [254], [250], [60], [3], [255], [130]], np.uint8))
    a = MXArray(data=data, scale=scale, axes=(-1,), block="row")
    layout = gemm.OperandLayout(batch=(), free=(0,), contract=(1,), shape=(8, 32))
    bf = np.asarray(gemm.prequantized_3d(a, layout, operands="bfloat16"))
    f32 = np.asarray(gemm.prequantized_3d(a, layout, operands="float32"))
    assert np.isinf(f32).any() and np.isnan(f32).any()
    np.testing.assert_array_equal(bf.astype(np.float32).view(np.uint32), f32.view(np.uint32))


def _exact_mx_values(codes: np.ndarray, scale_byte: int, dtype) -> np.ndarray:
    """element * 2^(b-127) in float64 (exact), from the FP8 codes."""
    elems = codes.view(np.dtype(dtype)).astype(np.float64)
    return elems * 2.0 ** (scale_byte - 127)


@pytest.mark.parametrize("elem,exact_from", [("e4m3", 3), ("e5m2", 10)])
def test_tiny_scales_follow_the_documented_exactness_condition(elem, exact_from):
    """Scale bytes b < exact_from can hold values below bfloat16's subnormal step 2^-133. Checks, for every finite
    element code and b in [0, 24]: values >= 2^-126 are exact in both paths; smaller ones are exact, rounded to
    the nearest multiple of 2^-133 (bfloat16 path, error <= 2^-134) or flushed to zero (FTZ backends); and with
    b >= exact_from a non-flushed bfloat16 value is always exact."""
    dtype = ELEMS[elem]
    codes = np.arange(256, dtype=np.uint8)
    finite = np.isfinite(codes.view(np.dtype(dtype)).astype(np.float64))
    codes = np.resize(codes[finite], (-(-int(finite.sum()) // 32), 32))  # every finite code, at least once
    for b in range(25):
        a = MXArray(
            data=jnp.asarray(codes).view(dtype),
            scale=jnp.full((codes.shape[0], 1), b, jnp.uint8),
            axes=(-1,),
            block="row",
        )
        exact = _exact_mx_values(codes, b, dtype)
        bf = np.asarray(jax_mxfp8.dequantize(a, jnp.bfloat16)).astype(np.float64)
        f32 = np.asarray(jax_mxfp8.dequantize(a, jnp.float32)).astype(np.float64)
        normal = np.abs(exact) >= 2.0**-126
        np.testing.assert_array_equal(bf[normal], exact[normal])
        np.testing.assert_array_equal(f32[normal], exact[normal])
        tiny_bf, tiny_exact = bf[~normal], exact[~normal]
        assert np.all((tiny_bf == 0) | (np.abs(tiny_bf - tiny_exact) <= 2.0**-134)), b
        if b >= exact_from:
            assert np.all((tiny_bf == 0) | (tiny_bf == tiny_exact)), b


def test_mx_dot_general_runs_the_bfloat16_path():
    """The public op's forward and gradients are the bfloat16 path's, bit for bit (same computation)."""
    config = MXDotConfig()
    x, w = _data("normal", (64, 256), 8), _data("normal", (256, 96), 9)
    ct = _data("normal", (64, 96), 10)
    dn = (((1,), (0,)), ((), ()))

    @jax.jit  # forward and backward in one program (the vjp closure called outside a jit ran op by op: ~100 s)
    def fwd_bwd(x, w, ct):
        y, vjp = jax.vjp(lambda a, b: jax_mxfp8.mx_dot_general(a, b, dn), x, w)
        return y, vjp(ct)

    y, (dx, dw) = fwd_bwd(x, w, ct)
    a3, b3 = x[None], w.T[None]
    fwd = _jitted("forward", config, "bfloat16")(a3, b3)
    da, db = _jitted("backward", config, "bfloat16")(a3, b3, ct[None])
    np.testing.assert_array_equal(np.asarray(y), np.asarray(fwd)[0])
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(da)[0])
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(db)[0].T)
    hlo = jax.jit(lambda x, w: jax_mxfp8.mx_dot_general(x, w, dn)).lower(x, w).as_text()
    assert "bf16" in hlo and "dot_general" in hlo


def _sqnr_db(got: np.ndarray, ref: np.ndarray) -> float:
    return sqnr_db(ref, got)  # jax_mxfp8.metrics: float64, NaN never passes


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["normal", "lognormal", "outlier"])
def test_gpu_bfloat16_path_matches_float32_path_above_100_db(kind):
    """On the GPU (cuBLAS bf16 GEMMs vs float32 HIGHEST GEMMs) all three GEMMs agree to >= 100 dB.

    Both sum the same exact products in float32 (module docstring); only the order differs, which costs
    ~1 float32 ulp per output (~140 dB): a wrong operand (an inexact bf16 cast, a dropped scale) costs far
    more than 100 dB.
    """
    if jax.default_backend() != "gpu":
        pytest.skip("needs a GPU")
    config = MXDotConfig()
    b, m, n, k = 2, 512, 384, 1024
    a3, b3 = _data(kind, (b, m, k), seed=5), _data(kind, (b, n, k), seed=6)
    g3 = _data(kind, (b, m, n), seed=7)
    fwd_bf, fwd_f32 = _both("forward", config, a3, b3)
    (da_bf, db_bf), (da_f32, db_f32) = _both("backward", config, a3, b3, g3)
    for name, got, ref in (("fwd", fwd_bf, fwd_f32), ("dgrad", da_bf, da_f32), ("wgrad", db_bf, db_f32)):
        assert np.all(np.isfinite(got)) and got.shape == ref.shape
        db = _sqnr_db(got, ref)
        print(f"{kind} {name}: {db:.1f} dB")
        assert db >= 100.0, f"{kind} {name}: {db:.1f} dB"


@pytest.mark.parametrize(
    "shape,dimension_numbers,side",
    [
        ((256, 96), (((0,), (0,)), ((), ())), "rhs"),  # a weight (K, N) contracted on axis 0: quantized in place
        ((2, 40, 64), (((2,), (2,)), ((0,), (0,))), "lhs"),  # K already last
        ((3, 64, 5), (((1,), (1,)), ((2,), (2,))), "rhs"),  # K in the middle, batch last
    ],
    ids=["w_kn", "x_bmk", "k_middle_batch_last"],
)
@pytest.mark.parametrize("kind", ["normal", "lognormal", "outlier"])
@pytest.mark.parametrize("operands", ["bfloat16", "float32"])
def test_in_place_forward_operand_equals_the_normalised_one(shape, dimension_numbers, side, kind, operands):
    """quantized_in_place (blocks along x's own contracting axis, then the move to (B, M, K)) gives the bits
    of quantized_3d on the transposed (B, M, K) operand, which reads the operand transposed."""
    config = MXDotConfig()
    x = _data(kind, shape, seed=3)
    lhs_l, rhs_l = gemm.operand_layouts(shape, shape, dimension_numbers)  # the other operand: same shape
    layout = lhs_l if side == "lhs" else rhs_l
    f_in_place = jax.jit(lambda x: layout.to_3d(gemm.quantized_in_place(x, layout, config, operands=operands)))
    f_3d = jax.jit(lambda x: gemm.quantized_3d(layout.to_3d(x), config, gemm.FWD, operands=operands))
    got, want = np.asarray(f_in_place(x)), np.asarray(f_3d(x))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float32).view(np.uint32), want.astype(np.float32).view(np.uint32))


def test_in_place_does_not_apply_to_hadamard_or_merged_contracting_axes():
    x = np.ones((64, 2, 32), np.float32)
    lhs_l, _ = gemm.operand_layouts(x.shape, (64, 2, 32), (((0, 1), (0, 1)), ((), ())))
    assert gemm.quantized_in_place(x, lhs_l, MXDotConfig()) is None  # two contracting axes merge into K
    lhs_l, _ = gemm.operand_layouts(x.shape, x.shape, (((0,), (0,)), ((), ())))
    assert gemm.quantized_in_place(x, lhs_l, MXDotConfig(hadamard_seed=0)) is None
