"""The first-use self-test of the Blackwell attention backward family ("attention_bwd_sm100": the pre-pass and the
backward kernels, primitives/attention_bwd_sm100.py), registered on import (primitives/self_test.py).

Three runs through the primitives a dispatch uses (the pre-pass, then the backward, on the square-block operands
with both scale orientations):
  H64, causal, p_scale "const", float32 dQ, GQA (N = 2 over K = 1), jagged lengths (query 100 / 128, key 100 / 256)
  H128, not causal, p_scale "block", float32 dQ
  H64, causal, float16 dQ (dQ 2^12, the float16 bulk reduce-add)
Every operand carries a distinct power-of-two factor per 32 x 32 block (neighbouring blocks, heads and batch rows
differ), so a permuted, shifted or misplaced scale byte, a wrong key / query tile or head offset changes the
gradients by far more than rounding. The kernel's exp2 (MUFU.EX2) and its accumulation order are not XLA's, so
the outputs cannot be compared bit for bit: each gradient must be within 40 dB SQNR of the emulation's (a layout
bug gives about 0 dB) with the same NaN places; it then counts as equal (the expected outputs are the kernel's
own), else the emulation's are expected and the family is disabled with a KernelFallbackWarning.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import attention_bwd_sm100 as bwd
from jax_mxfp8.primitives import self_test
from jax_mxfp8.primitives.attention_sm100_operands import quantize_square, sm100_operand

B, T, S, N, K = 2, 128, 256, 2, 1
RUNS = (  # (head_dim, causal, p_scale, dq_accum)
    (64, True, "const", "fp32"),
    (128, False, "block", "fp32"),
    (64, True, "const", "fp16"),
)
LENS = np.array([[100, 128], [100, 256]], np.int32)  # (2, B): query, key lengths
MIN_SQNR_DB = 40.0


def _blocky(rng, shape, salt: int) -> np.ndarray:
    """Normal values times 2^e per 32 x 32 block of (sequence, head_dim), e in -2..2 varying with the block's
    row, column, head and batch row."""
    x = rng.standard_normal(shape).astype(np.float32)
    b, length, heads, h = shape
    i = np.arange(length)[None, :, None, None] // 32
    j = np.arange(h)[None, None, None, :] // 32
    n = np.arange(heads)[None, None, :, None]
    bb = np.arange(b)[:, None, None, None]
    e = (i + 2 * j + 3 * n + 5 * bb + salt) % 5 - 2
    return (x * np.exp2(e)).astype(np.float32)


def _inputs() -> tuple:
    rng = np.random.default_rng(20260)
    out = []
    for r, (h, *_) in enumerate(RUNS):
        q, do, o = (_blocky(rng, (B, T, N, h), 3 * r + s) for s in range(3))
        k, v = (_blocky(rng, (B, S, K, h), 3 * r + s) for s in range(2))
        keep_q = (np.arange(T)[None, :] < LENS[0][:, None])[:, :, None, None]
        keep_k = (np.arange(S)[None, :] < LENS[1][:, None])[:, :, None, None]
        q, k, v = q * keep_q, k * keep_k, v * keep_k
        lse = (np.log(S) + rng.standard_normal((B, N, T))).astype(np.float32)
        dlse = (0.1 * rng.standard_normal((B, N, T))).astype(np.float32)
        out += [q, k, v, do, o.astype(np.float32), lse, dlse]
    return tuple(out)


def _kernel(ops: tuple, path: str) -> tuple:
    lens = jnp.asarray(LENS)
    grads = []
    for r, (h, causal, p_scale, dq_accum) in enumerate(RUNS):
        q, k, v, do, o, lse, dlse = (jnp.asarray(x) for x in ops[7 * r : 7 * r + 7])
        qo, ko = sm100_operand(quantize_square(q)), sm100_operand(quantize_square(k))
        vo = sm100_operand(quantize_square(v), ("hd",))
        do_op, delta = bwd.bwd_prepass_sm100(do.astype(jnp.bfloat16), o.astype(jnp.bfloat16), dlse, lens, path=path)
        variant = bwd.find_variant(head_dim=h, causal=causal, p_scale=p_scale, dq_accum=dq_accum)
        grads += bwd.attention_bwd_sm100(
            qo, ko, vo, do_op, lse, delta, lens, variant=variant, scale=h**-0.5, dq_scale_log2=12, path=path
        )
    return tuple(grads)


def _sqnr_db(x: np.ndarray, ref: np.ndarray) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    err = np.sum((x - ref) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(np.sum(ref**2) / err))


def _expected(ops: tuple, got: tuple) -> tuple:
    """The kernel's own outputs where each is within MIN_SQNR_DB of the emulation with the same NaN places,
    else the emulation's (module docstring)."""
    want = _kernel(ops, "emulated")
    out = []
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        same_nan = g.shape == w.shape and np.array_equal(np.isnan(g), np.isnan(w))
        ok = same_nan and np.all(np.isfinite(g) | np.isnan(w))
        ok = ok and _sqnr_db(np.nan_to_num(g), np.nan_to_num(w)) >= MIN_SQNR_DB
        out.append(g if ok else w)
    return tuple(out)


self_test.register(
    self_test.SelfTestFamily(
        name=registry.AttentionBwdSm100Config.op,
        archs=registry.AttentionBwdSm100Config.archs,
        problem=(
            f"B, T, S, N, K = {B}, {T}, {S}, {N}, {K}: H64 causal jagged const P, H128 block P, H64 causal float16 "
            f"dQ; per-block power-of-two factors; dq, dk, dv within {MIN_SQNR_DB:g} dB of the emulation"
        ),
        inputs=_inputs,
        kernel=_kernel,
        expected=_expected,
    )
)
