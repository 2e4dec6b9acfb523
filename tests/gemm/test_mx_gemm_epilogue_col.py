"""The quantize epilogue's column orientation (store_col; primitives/mx_gemm_epilogue.py,
kernels/sm90/mx_epilogue_col.py).

The contract: (qc, sc) = align128(quantize(z, axis=-2), axis=-2), gemm_operands' "col" form of the float32
reference output z = acc (+ bias) (-> gelu): E4M3 (G, N, Mp) (transposed, rows M..Mp +0) and float32 run
scales (G, Mp/128, N). Checked against the independent NumPy oracles (tests/quantize/mx_oracle.py quantize of z^T,
tests/gemm/gemm_align_oracle.py align128_oracle), never against the library's own quantize / align128.
CPU: the emulation's bits, NaN / Inf blocks (scale NaN for the run), M not a multiple of 128, vmap,
ValueErrors. GPU (@pytest.mark.gpu): the kernel's bits equal the oracle of the plain MX GEMM kernel's
float32 output (+ bias), NaN-poisoned output buffers (every element written, padding included), edge
tiles (M, N not tile multiples, a cluster pair past M), batch; the row outputs and pre equal the row-only
variant's bit for bit; with GELU within one FP8 step of the oracle of jax.nn.gelu(y).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.primitives import mx_gemm as mg
from jax_mxfp8.primitives import mx_gemm_epilogue as me
from tests.gemm.gemm_align_oracle import align128_col_oracle, dequant_aligned
from tests.gemm.mx_gemm_testutil import fp8_bits, gelu_epilogue_slack, gemm_args, operands
from tests.quantize import mx_oracle
from tests.seeding_testutil import test_rng


def _quantized(ops, path, activation="", store_col=True, out=None):
    args, bias = gemm_args(ops)

    def f(*a):
        return me.mx_gemm_quantized(
            *a, bias, activation=activation, store_pre=True, store_col=store_col, path=path, out=out
        )

    return [np.asarray(x) for x in jax.jit(f)(*args)]


def _plain(ops, path):
    args, bias = gemm_args(ops)
    return np.asarray(jax.jit(lambda *a: mg.mx_gemm(*a, bias, out_dtype="float32", path=path))(*args))


def _check_col(qc, sc, z, label):
    codes, scale, finite = align128_col_oracle(z)
    assert qc.shape == codes.shape and sc.shape == scale.shape, f"{label}: shapes {qc.shape} {sc.shape}"
    np.testing.assert_array_equal(sc, scale, err_msg=f"{label}: run scales")
    got = fp8_bits(qc)
    np.testing.assert_array_equal(got[finite], codes[finite], err_msg=f"{label}: data")
    assert ((got[~finite] & 0x7F) == 0x7F).all(), f"{label}: a NaN block's data is not NaN"


def _with_bad_blocks(ops):
    """A NaN row scale (row 3 of batch 0, K tile 0: every column's run 0 is NaN) and an overflowing scale
    product (row 37, column 40: Inf in float32, column 40's run 0 is NaN)."""
    ops["sa"][0, 0, 3] = np.nan
    ops["sa"][0, 0, 37] = 2.0**100
    ops["sb"][0, 0, 40] = 2.0**100
    return ops


# ----------------------------------------------------------------------------------------------- CPU
def test_emulation_col_bits_equal_oracle():
    """M = 160: a partial 128-run (rows 160..255 padding); bias; NaN / Inf blocks; the gelu variant."""
    ops = _with_bad_blocks(operands(test_rng(), 2, 160, 96, 256, bias=True))
    y = _plain(ops, "emulated")
    q, s, pre, qc, sc = _quantized(ops, "emulated")
    _check_col(qc, sc, y, "emulated")
    assert np.isnan(sc[0, 0]).all() and np.isfinite(sc[1]).all()
    row = _quantized(ops, "emulated", store_col=False)
    for got, want in zip((q, s, pre), row, strict=True):
        np.testing.assert_array_equal(fp8_bits(got), fp8_bits(want))
    *_, qc, sc = _quantized(ops, "emulated", "gelu")
    _check_col(qc, sc, np.asarray(jax.jit(jax.nn.gelu)(jnp.asarray(y))), "emulated gelu")


@pytest.mark.slow  # ~30 s on the loaded 2-core machine (vmap of a five-output declaration, two compiles)
def test_emulation_col_vmap():
    ops = operands(test_rng(), 2, 32, 64, 128, bias=True)
    args, bias = gemm_args(ops)

    def one(a, b, sa, sb):
        return me.mx_gemm_quantized(
            a, b, sa, sb, bias, activation="gelu", store_pre=True, store_col=True, path="emulated"
        )

    full = one(*args)
    per = jax.vmap(lambda a, b, sa, sb: [x[0] for x in one(a[None], b[None], sa[None], sb[None])])(*args)
    for x, y in zip(per, full, strict=True):
        np.testing.assert_array_equal(fp8_bits(x), fp8_bits(y))


@pytest.mark.parametrize(
    "m, kwargs, fragment",
    [
        (48, {"store_pre": True, "store_col": True}, "M = 48 must be a multiple of 32"),
        (64, {"store_col": True}, "store_col=True needs store_pre=True"),
        (64, {"store_pre": True, "store_col": True, "out": ()}, "out="),
    ],
)
def test_col_bad_arguments_raise(m, kwargs, fragment):
    args = [jnp.zeros((1, r, 128), "float8_e4m3fn") for r in (m, 64)] + [jnp.ones((1, 1, r)) for r in (m, 64)]
    with pytest.raises(ValueError, match=fragment):
        me.mx_gemm_quantized(*args, path="emulated", **kwargs)


# ----------------------------------------------------------------------------------------------- GPU


def _poisoned(ops):
    """NaN-filled (q, s, pre, qc, sc) buffers of the call's shapes (0xFF bytes: NaN codes / NaN scales)."""
    g, m, n = ops["a"].shape[0], ops["a"].shape[1], ops["b"].shape[1]
    mp = -(-m // 128) * 128
    full = lambda shape, dtype: jnp.asarray(np.full(shape, 0xFF, np.uint8)).view(dtype)  # noqa: E731
    return (
        full((g, m, n), jnp.float8_e4m3fn),
        full((g, m, n // 32), jnp.uint8),
        jnp.full((g, m, n), jnp.nan, jnp.bfloat16),
        full((g, n, mp), jnp.float8_e4m3fn),
        jnp.full((g, mp // 128, n), jnp.nan, jnp.float32),
    )


GPU_CASES = [
    (1, 256, 384, 512, False),
    (2, 288, 608, 1152, True),  # M = 2.25 tiles (a partial run, a cluster pair past M), N = 3 x 192 + 32
    (1, 96, 224, 256, True),  # one partial tile: 3 of 4 blocks, 32 padding rows
    (1, 2048, 2048, 2048, True),  # more tiles than CTAs
]


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
@pytest.mark.parametrize("g, m, n, k, bias", GPU_CASES)
def test_kernel_col_bits_equal_oracle(g, m, n, k, bias):
    ops = _with_bad_blocks(operands(test_rng(), g, m, n, k, bias=bias))
    y = _plain(ops, "cuda")  # the plain kernel's float32 (+ bias): the same accumulator bits
    q, s, pre, qc, sc = _quantized(ops, "cuda", out=_poisoned(ops))
    _check_col(qc, sc, y, "kernel")
    assert np.isnan(sc[0, 0]).all()
    row = _quantized(ops, "cuda", store_col=False)  # the row-only variant: same q, s, pre
    for name, got, want in zip(("q", "s", "pre"), (q, s, pre), row, strict=True):
        np.testing.assert_array_equal(fp8_bits(got), fp8_bits(want), err_msg=name)


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_mx_gemm")
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_col_gelu(bias):
    ops = _with_bad_blocks(operands(test_rng(), 2, 288, 608, 640, bias=bias))
    for op in ("sa", "sb"):  # magnitudes around GELU's knee (|y| ~ 0.1 - 10) where the tanh matters
        ops[op] = np.where(np.isfinite(ops[op]) & (ops[op] < 2.0**50), ops[op] * 2.0**-9, ops[op]).astype(np.float32)
    y = _plain(ops, "cuda")
    q, s, pre, qc, sc = _quantized(ops, "cuda", "gelu", out=_poisoned(ops))
    row = _quantized(ops, "cuda", "gelu", store_col=False)
    for name, got, want in zip(("q", "s", "pre"), (q, s, pre), row, strict=True):
        np.testing.assert_array_equal(fp8_bits(got), fp8_bits(want), err_msg=name)
    codes, scale, finite = align128_col_oracle(np.asarray(jax.jit(jax.nn.gelu)(jnp.asarray(y))))
    np.testing.assert_array_equal(np.isnan(sc), np.isnan(scale), err_msg="NaN runs")
    same = (sc == scale) | (np.isnan(sc) & np.isnan(scale))  # (batch 0's run 0 is NaN: row 3's NaN scale)
    assert same.mean() > 0.99, f"only {same.mean():.4f} of the run scales agree"
    # hardware tanh vs XLA's (docs/numerics.md "Quantize epilogues"): the GELU values differ by at most
    # gelu_epilogue_slack(y); after quantization a code may move by one FP8 step (a block exponent, rarely, by one
    # binade), so the dequantized values agree to within a quarter of their magnitude plus two subnormal steps
    # plus the slack and its rounding
    ok = np.repeat(np.swapaxes(same & np.isfinite(sc), -1, -2), 128, axis=-1) & finite
    y_col = np.zeros(codes.shape)  # y (G, M, N) in the column layout (G, N, Mp) of the codes, zero in the padding
    y_col[:, :, : y.shape[1]] = np.swapaxes(np.asarray(y, np.float64), -1, -2)
    slack = 1.125 * gelu_epilogue_slack(y_col)[ok]
    fmt = mx_oracle.fmt_of(jnp.float8_e4m3fn)
    got = dequant_aligned(fp8_bits(qc), np.where(np.isfinite(sc), sc, 0), fmt)[ok]
    ref = dequant_aligned(codes, np.where(np.isfinite(scale), scale, 0), fmt)[ok]
    run = np.repeat(np.swapaxes(np.where(np.isfinite(sc), sc, 0), -1, -2), 128, axis=-1)[ok]
    err = np.abs(got - ref) - (0.25 * np.maximum(np.abs(got), np.abs(ref)) + run * 2.0**-8 + slack)
    equal = np.mean(fp8_bits(qc)[ok] == codes[ok])
    print(f"gelu col: {equal:.5f} of the elements equal, worst excess {err.max():.3g}")
    assert (err <= 0).all() and equal > 0.99


@pytest.mark.parametrize("m", [512, 160])
def test_emulation_col_sharded_equals_unsharded(m):
    """M sharded over 4 devices (N over 2): with M a multiple of 128 the 128-row runs stay whole per shard
    (no gather of a along M, bit-identical); M = 160 (a partial run) is replicated along M (gathered)."""
    from tests.parallel.sharding_testutil import collectives, mesh, put

    ops = operands(test_rng(), 1, m, 384, 256, bias=True)
    args, bias = gemm_args(ops)

    def f(a, b, sa, sb):
        return me.mx_gemm_quantized(
            a, b, sa, sb, bias, activation="gelu", store_pre=True, store_col=True, path="emulated"
        )

    want = jax.jit(f)(*args)
    grid = mesh((4, 2), ("data", "model"))
    sharded = [put(args[0], grid, None, "data", None), put(args[1], grid, None, "model", None)]
    sharded += [put(args[2], grid, None, None, "data"), put(args[3], grid, None, None, "model")]
    got = jax.jit(f)(*sharded)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(fp8_bits(w), fp8_bits(g))
    gathers = [s for op, s in collectives(f, *sharded) if op == "all-gather"]
    assert (gathers == []) == (m % 128 == 0), gathers
