"""Random aligned MX GEMM operands (docs/interfaces.md "MX GEMM") and the float64 evaluation of the kernel's formula.

operands(rng, g, m, n, k, a_dtype, b_dtype, bias, nan_rows, nan_cols) -> dict of numpy arrays
    a (G, M, Kp), b (G, N, Kp) FP8 (K >= k zero padding, as the aligned producer writes), sa (G, Kt, M),
    sb (G, Kt, N) float32 powers of two (NaN where asked), bias (N,) float32 or None
formula64(ops) -> (c, absdot) float64: c = sum_kt sa sb (a_kt . b_kt) + bias and sum_kt |sa sb| (|a_kt| . |b_kt|)
error_bound(ops, c64, absdot, out_dtype, acc_rel) -> per-element bound on |c - c64|
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np

K_TILE = 128
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def fp8(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random finite FP8 values over most of the format's range (normal data times a log-uniform spread)."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 7, size=shape))
    x = np.clip(x, -FP8_MAX[dtype], FP8_MAX[dtype])
    return x.astype(np.float32).astype(getattr(ml_dtypes, dtype))


def operands(
    rng: np.random.Generator,
    g: int,
    m: int,
    n: int,
    k: int,
    a_dtype: str = "float8_e4m3fn",
    b_dtype: str = "float8_e4m3fn",
    bias: bool = False,
    nan_rows: tuple[tuple[int, int, int], ...] = (),
    nan_cols: tuple[tuple[int, int, int], ...] = (),
) -> dict:
    """Aligned operands for K = k (padded to Kp with zeros). nan_rows: (g, kt, m) entries of sa set to NaN;
    nan_cols: (g, kt, n) entries of sb."""
    kp = -(-k // K_TILE) * K_TILE
    kt = kp // K_TILE
    a = fp8(rng, (g, m, kp), a_dtype)
    b = fp8(rng, (g, n, kp), b_dtype)
    a[:, :, k:] = 0
    b[:, :, k:] = 0
    sa = np.exp2(rng.integers(-12, 8, size=(g, kt, m))).astype(np.float32)
    sb = np.exp2(rng.integers(-12, 8, size=(g, kt, n))).astype(np.float32)
    for idx in nan_rows:
        sa[idx] = np.nan
    for idx in nan_cols:
        sb[idx] = np.nan
    out = dict(a=a, b=b, sa=sa, sb=sb, bias=None)
    if bias:
        out["bias"] = (rng.standard_normal(n) * 100.0).astype(np.float32)
    return out


def formula64(ops: dict) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's formula in float64 (exact products and, for these sizes, exact sums) and the scaled
    absolute sum that bounds the rounding errors."""
    a = ops["a"].astype(np.float64)
    b = ops["b"].astype(np.float64)
    g, m, kp = a.shape
    n = b.shape[1]
    c = np.zeros((g, m, n))
    absdot = np.zeros((g, m, n))
    for t in range(kp // K_TILE):
        at, bt = a[:, :, t * K_TILE : (t + 1) * K_TILE], b[:, :, t * K_TILE : (t + 1) * K_TILE]
        s = ops["sa"][:, t, :, None].astype(np.float64) * ops["sb"][:, t, None, :].astype(np.float64)
        c += s * (at @ bt.transpose(0, 2, 1))  # BLAS, float64
        absdot += np.abs(s) * (np.abs(at) @ np.abs(bt).transpose(0, 2, 1))
    if ops["bias"] is not None:
        c += ops["bias"].astype(np.float64)
        absdot += np.abs(ops["bias"].astype(np.float64))
    return c, absdot


def error_bound(c64: np.ndarray, absdot: np.ndarray, kt: int, out_dtype: str, acc_rel: float) -> np.ndarray:
    """|c - c64| bound: one final rounding (half an ulp of the output dtype, relative) plus the accumulation
    error, acc_rel per 128-K partial plus float32 promotion (kt + 1 roundings of 2^-24) times absdot."""
    u_out = 2.0**-8 if out_dtype == "bfloat16" else 2.0**-24
    acc = (acc_rel + (kt + 2) * 2.0**-24) * absdot
    return acc + u_out * (np.abs(c64) + acc) + 1e-30


def sqnr_db(x: np.ndarray, ref: np.ndarray) -> float:
    """10 log10(sum ref^2 / sum (x - ref)^2) over the finite reference entries."""
    ok = np.isfinite(ref)
    err = np.sum((x[ok] - ref[ok]) ** 2)
    return float(10 * np.log10(np.sum(ref[ok] ** 2) / max(err, 1e-300)))


def gemm_args(ops):
    """([a, b, sa, sb] as jax arrays, bias or None) of an `operands` dict."""
    args = [jnp.asarray(ops[k]) for k in ("a", "b", "sa", "sb")]
    return args, None if ops["bias"] is None else jnp.asarray(ops["bias"])


def fp8_bits(q) -> np.ndarray:
    """The bytes of an FP8 array (uint8 view)."""
    return np.asarray(q).view(np.uint8)


def study_operand(kind: str, shape, rng: np.random.Generator) -> np.ndarray:
    """float32 operands of the GEMM error studies: "normal" N(0,1); "lognormal" rows with log-normal
    magnitudes (sigma 2); "outlier" N(0,1) with one 32-channel block of the last axis scaled by 1000 and
    another by 1/1000."""
    x = rng.standard_normal(shape)
    if kind == "lognormal":
        x = x * np.exp(2.0 * rng.standard_normal(shape[:-1] + (1,)))
    elif kind == "outlier":
        x[..., 32:64] *= 1000.0
        x[..., 96:128] /= 1000.0
    return x.astype(np.float32)


TANH_APPROX_ABS = 2.0**-11
"""Bound of |tanh.approx.f32(u) - tanh(u)| (PTX: ~2^-11 relative, |tanh| <= 1), the only difference between the
kernel epilogues' GELU and jax.nn.gelu's tanh form (kernels/common/fp32_math.py gelu_tanh_f32)."""


def gelu_epilogue_slack(x: np.ndarray) -> np.ndarray:
    """How far the kernel's GELU of x may lie from XLA's: 0.5 |x| TANH_APPROX_ABS (GELU = 0.5 x (1 + tanh(u))).
    Within one FP8 step of the value for |x| up to a few units; more in the negative tail (x < -3), where GELU is
    below 4e-3 |x| and tanh's absolute error is a large part of 1 + tanh(u)."""
    return 0.5 * np.abs(np.asarray(x, np.float64)) * TANH_APPROX_ABS
