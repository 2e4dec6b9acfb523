"""The MX GEMM's quantize epilogue (primitives/mx_gemm_epilogue.py, kernels/sm90/mx_gemm_epilogue.py).

The contract: (q, s) = quantize(z) along N (E4M3, scale_rounding "up") of the float32 reference output
z = acc (+ bias) (-> gelu), before any bfloat16 rounding. Checked against tests/quantize/mx_oracle.py (the
independent NumPy quantizer), never against the library's own quantize.
CPU: the emulation's bits equal the oracle's quantize of the emulated float32 GEMM (+ bias) (and of
jax.nn.gelu of it), NaN-scale rows and Inf blocks give scale 0xFF and NaN data, pre = bf16(y), vmap,
ValueErrors. GPU (@pytest.mark.gpu): the kernel's bits equal the oracle's quantize of the plain MX GEMM
kernel's float32 output (+ bias) (its mainloop is the same code: the same accumulator bits), edge tiles
(M, N not tile multiples), batch, NaN / Inf blocks, pre bit for bit the plain kernel's bf16 output, and
the GELU variant within one FP8 step of quantize(jax.nn.gelu(y)) (hardware tanh.approx vs XLA's tanh).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import mx_gemm as mg
from jax_mxfp8.primitives import mx_gemm_epilogue as me
from tests.gemm.mx_gemm_testutil import fp8_bits, gemm_args, operands
from tests.quantize import mx_oracle
from tests.seeding_testutil import test_rng

E4 = "float8_e4m3fn"


def _quantized(ops, path, activation="", store_pre=False, tune=0):
    args, bias = gemm_args(ops)
    f = jax.jit(
        lambda *a: me.mx_gemm_quantized(*a, bias, activation=activation, store_pre=store_pre, path=path, tune=tune)
    )
    return [np.asarray(x) for x in f(*args)]


def _plain(ops, path, out_dtype="float32"):
    args, bias = gemm_args(ops)
    return np.asarray(jax.jit(lambda *a: mg.mx_gemm(*a, bias, out_dtype=out_dtype, path=path))(*args))


def _check_exact(q, s, z, label):
    want = mx_oracle.quantize(np.asarray(z, np.float32), axis=-1)
    np.testing.assert_array_equal(s, want.scale, err_msg=f"{label}: scales")
    got = fp8_bits(q)
    np.testing.assert_array_equal(got[want.finite], want.data[want.finite], err_msg=f"{label}: data")
    assert ((got[~want.finite] & 0x7F) == 0x7F).all(), f"{label}: a NaN block's data is not NaN"


def _with_bad_blocks(ops):
    """A NaN row scale (row 3 of batch 0, K tile 0) and an overflowing scale product (row 5, column 40:
    2^100 * 2^100 = Inf in float32): NaN / Inf accumulators whose blocks must come back NaN (0xFF)."""
    ops["sa"][0, 0, 3] = np.nan
    ops["sa"][0, 0, 5] = 2.0**100
    ops["sb"][0, 0, 40] = 2.0**100
    return ops


CPU_CASES = [(2, 32, 224, 384, True)]


@pytest.mark.parametrize("g, m, n, k, bias", CPU_CASES)
def test_emulation_bits_equal_oracle(g, m, n, k, bias):
    ops = _with_bad_blocks(operands(test_rng(), g, m, n, k, bias=bias))
    y = _plain(ops, "emulated")
    assert not np.isfinite(y[0, 3]).any() and not np.isfinite(y[0, 5, 40])
    q, s = _quantized(ops, "emulated")
    _check_exact(q, s, y, "emulated")
    assert (s[0, 3] == 0xFF).all() and s[0, 5, 1] == 0xFF
    assert np.isnan(q[0, 5, 32:64].astype(np.float32)).all()
    q, s, pre = _quantized(ops, "emulated", "gelu", True)
    z = np.asarray(jax.jit(jax.nn.gelu)(jnp.asarray(y)))
    _check_exact(q, s, z, "emulated gelu")
    np.testing.assert_array_equal(pre.view(np.uint16), y.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_emulation_vmap():
    ops = operands(test_rng(), 2, 32, 64, 128, bias=True)
    args, bias = gemm_args(ops)
    one = lambda a, b, sa, sb: me.mx_gemm_quantized(a, b, sa, sb, bias, activation="gelu", path="emulated")  # noqa: E731
    full = one(*args)
    per = jax.vmap(lambda a, b, sa, sb: [x[0] for x in one(a[None], b[None], sa[None], sb[None])])(*args)
    for x, y in zip(per, full, strict=True):
        np.testing.assert_array_equal(fp8_bits(x), fp8_bits(y))


@pytest.mark.parametrize(
    "n, a_dtype, kwargs, fragment",
    [
        (48, E4, {}, "multiple of 32"),
        (64, "float8_e5m2", {}, "e4m3 x e4m3"),
        (64, E4, {"activation": "relu"}, "activation"),
    ],
)
def test_bad_arguments_raise(n, a_dtype, kwargs, fragment):
    a = jnp.zeros((1, 32, 128), a_dtype)
    b = jnp.zeros((1, n, 128), E4)
    sa, sb = jnp.ones((1, 1, 32), jnp.float32), jnp.ones((1, 1, n), jnp.float32)
    with pytest.raises(ValueError, match=fragment):
        me.mx_gemm_quantized(a, b, sa, sb, path="emulated", **kwargs)


# ----------------------------------------------------------------------------------------------- GPU
GPU_CASES = [
    (1, 256, 384, 512, False),
    (2, 272, 608, 1152, True),  # M, N not tile multiples (608 = 3 x 192 + 32), batch, a cluster pair past M
    (1, 2048, 2048, 2048, True),  # more tiles than CTAs
]


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
@pytest.mark.parametrize("g, m, n, k, bias", GPU_CASES)
def test_kernel_bits_equal_quantized_kernel_output(g, m, n, k, bias):
    ops = _with_bad_blocks(operands(test_rng(), g, m, n, k, bias=bias))
    y = _plain(ops, "cuda")  # the plain kernel's float32 (+ bias): the same accumulator bits
    q, s = _quantized(ops, "cuda")
    _check_exact(q, s, y, "kernel")
    assert (s[0, 3] == 0xFF).all() and s[0, 5, 1] == 0xFF


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_gelu_and_pre(bias):
    ops = _with_bad_blocks(operands(test_rng(), 2, 272, 608, 640, bias=bias))
    for op in ("sa", "sb"):  # magnitudes around GELU's knee (|y| ~ 0.1 - 10) where the tanh matters
        ops[op] = np.where(np.isfinite(ops[op]) & (ops[op] < 2.0**50), ops[op] * 2.0**-9, ops[op]).astype(np.float32)
    y = _plain(ops, "cuda")
    pre_bf16 = _plain(ops, "cuda", "bfloat16")
    q, s, pre = _quantized(ops, "cuda", "gelu", True)
    np.testing.assert_array_equal(pre.view(np.uint16), pre_bf16.view(np.uint16), err_msg="pre")
    q2, s2 = _quantized(ops, "cuda", "gelu", False)
    np.testing.assert_array_equal(fp8_bits(q2), fp8_bits(q))
    np.testing.assert_array_equal(s2, s)
    z = np.asarray(jax.jit(jax.nn.gelu)(jnp.asarray(y)))
    want = mx_oracle.quantize(z, axis=-1)
    np.testing.assert_array_equal(s == 0xFF, want.scale == 0xFF, err_msg="NaN blocks")
    same_scale = s == want.scale
    assert same_scale.mean() > 0.99, f"only {same_scale.mean():.4f} of the scales agree"
    # where the scales agree the elements are within one FP8 step (codes differ by at most 1 in magnitude)
    blk = np.repeat(same_scale & (s != 0xFF), 32, axis=-1)
    got, ref = fp8_bits(q)[blk].astype(np.int32), want.data[blk].astype(np.int32)
    mag = lambda c: np.where(c >= 0x80, -(c & 0x7F), c)  # noqa: E731 (monotone code order)
    diff = np.abs(mag(got) - mag(ref))
    print(f"gelu: {np.mean(diff == 0):.5f} of the elements equal, max code difference {diff.max()}")
    assert diff.max() <= 1 and np.mean(diff == 0) > 0.99


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
def test_kernel_tuning_paired_stores_bits():
    """Tuning 1 (the first version's 16-bit stores) and production (paired 4-byte stores) write the same
    bits, edge tiles included."""
    t1 = registry.find(registry.MXGemmEpilogueConfig, tune=1)
    if not library.has_kernel(t1.name):
        pytest.skip(f"{t1.name} is not in the library (tools/build_library.py --with-tunes builds it)")
    ops = _with_bad_blocks(operands(test_rng(), 2, 272, 608, 640))
    want = _quantized(ops, "cuda")
    got = _quantized(ops, "cuda", tune=1)
    np.testing.assert_array_equal(fp8_bits(got[0]), fp8_bits(want[0]))
    np.testing.assert_array_equal(got[1], want[1])
