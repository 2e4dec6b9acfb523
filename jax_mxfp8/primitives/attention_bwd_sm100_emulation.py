"""The Blackwell (sm_100a / sm_100f) attention backward's arithmetic in XLA (layer 5), with its pre-pass.

  bwd_prepass(do, o, dlse, q_len) -> (do operand, delta)        the fused dO quantize + Delta pass
  emulate_bwd_sm100(q, k, v, do, lse, delta, lens, *, causal, scale, p_scale, dq_accum, dq_scale_log2, domain)
      -> (dq (B | 1, T, N, H), dk (B, S, K, H), dv (B, S, K, H)) float32

Operands (attention_sm100_operands.py), each GEMM reading the orientation whose scales it needs:
  S^T = K Q^T      k "hd", q "hd"          dP^T = V dO^T    v "hd", do "hd"
  dV += P^T dO     do "seq" (queries)      dK += dS^T Q     q "seq" (queries)
  dQ  = dS K       k "seq" (keys)
q, k, v are the forward's square-block operands (with both orientations' scales), do the pre-pass's; lse (B, N, T)
float32 the forward's (natural log), delta (B, N, T) float32 = rowsum(dO * O) - dLSE. q of batch 1 with k of
batch B: broadcast_query_attention (dq is then the float32 sum over the B rows, (1, T, N, H)).

Per 128-key tile (one CTA, keys in TMEM lanes) and every query tile, what the kernel computes
(docs/perf/blackwell-attention.md "Backward"):
  t = round(acc * c) (c = fl(tau log2 e)), masked to -inf; L = fl(LSE log2 e) per row;
  P = 2^min(t - L, 0) (<= 1 even where a recomputed logit exceeds the forward's LSE);
  P quantized along the queries (dV's contracting axis): "const" E4M3(2^8 P) 2^-8, "block" 1x32 per key;
  dV += P^T dO^; dP = dO^ V^T; dS = P (dP - Delta) in float32;
  dS quantized once per 32x32 (query, key) block, rule "up" (one warp per block: each lane's row amax, then
    CREDUX.MAXABS.NAN, so a block holding NaN / Inf gets byte 0xFF and NaN elements), for both dK and dQ;
  dK += tau dS^T Q^ (tau applied in the epilogue), dQ tile = tau dS K^ added into dq:
    dq_accum "fp32": float32 adds; in ascending key-tile order this is the deterministic kernel (a per-query-
      tile semaphore orders the TMA reduce-adds); the default kernel adds in any order (bound in the doc);
    "fp16": a float16 accumulator of dQ 2^e, one rounding per key tile in ascending order (the deterministic
      kernel: load, add in float32, round, store); "fp16_reduce": the tile is rounded to float16 first and
      added by a float16 TMA reduce-add (two roundings; any order in the kernel, ascending here).
domain="natural" (exponent e^(S - LSE) with S = round(acc tau)) makes every step the reference's
(reference/attention_bwd.py attention_bwd_quantized): equal bit for bit; "log2" is the kernel's base-2 form
(same bound as the forward's; see attention_sm100_emulation.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.config.attention import DQ_FP16_SCALE_LOG2, DQ_FP16_SCALE_LOG2_RANGE
from jax_mxfp8.primitives.attention_sm100_emulation import (
    KV_TILE,
    LOG2E,
    check_options,
    exponent,
    head_major,
    lengths,
    quantize_p,
)
from jax_mxfp8.primitives.attention_sm100_operands import Sm100Operand, operand_values, quantize_square, sm100_operand
from jax_mxfp8.primitives.attention_sm100_quant import quantize_square as quantize_ds
from jax_mxfp8.reference.attention_bwd import bwd_delta
from jax_mxfp8.reference.attention_tiling import Masking, mm, tile_logits

DQ_ACCUMS = ("fp32", "fp16", "fp16_reduce")


def bwd_prepass(
    do: jax.Array, o: jax.Array, dlse: jax.Array | None, q_len: jax.Array | None, scale_rounding: str = "up"
) -> tuple[Sm100Operand, jax.Array]:
    """The fused pre-pass: one read of dO (and O) gives dO's square-block operand (both orientations) and
    Delta. do, o: (B, T, N, H); dlse: (B, N, T) or None; q_len: (B,) or None. Rows >= q_len of dO are zeroed
    before quantizing (their blocks hold only valid rows' values). Returns (do operand, delta (B, N, T)
    float32 = rowsum(dO O) - dLSE from the unquantized dO and O)."""
    do = do.astype(jnp.float32)
    if q_len is not None:
        keep = jnp.arange(do.shape[1])[None, :] < q_len[:, None]
        do = jnp.where(keep[:, :, None, None], do, 0.0)
    delta = bwd_delta(do, o, None if dlse is None else jnp.swapaxes(dlse, 1, 2))  # (B, T, N)
    return sm100_operand(quantize_square(do, scale_rounding)), jnp.swapaxes(delta, 1, 2)


def _check_dq(dq_accum: str, dq_scale_log2: int) -> None:
    if dq_accum not in DQ_ACCUMS:
        raise ValueError(f"dq_accum={dq_accum!r} is not one of {DQ_ACCUMS}")
    lo, hi = DQ_FP16_SCALE_LOG2_RANGE
    if isinstance(dq_scale_log2, bool) or not isinstance(dq_scale_log2, int) or not lo <= dq_scale_log2 <= hi:
        raise ValueError(f"dq_scale_log2={dq_scale_log2!r} must be an int in [{lo}, {hi}]")


def _add_dq(acc: jax.Array, part: jax.Array, dq_accum: str, up: np.float32) -> jax.Array:
    """One key tile's dQ partial (float32) into the accumulator (float32, or float16 holding dQ 2^e)."""
    if dq_accum == "fp32":
        return acc + part
    if dq_accum == "fp16":
        return (acc.astype(jnp.float32) + part * up).astype(jnp.float16)
    return (acc.astype(jnp.float32) + (part * up).astype(jnp.float16).astype(jnp.float32)).astype(jnp.float16)


def emulate_bwd_sm100(
    q: Sm100Operand,
    k: Sm100Operand,
    v: Sm100Operand,
    do: Sm100Operand,
    lse: jax.Array,
    delta: jax.Array,
    lens: jax.Array | None,
    *,
    causal: bool,
    scale: float,
    p_scale: str = "const",
    dq_accum: str = "fp32",
    dq_scale_log2: int = DQ_FP16_SCALE_LOG2,
    domain: str = "log2",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The sm100 backward kernel's arithmetic (module docstring). Returns dq (B | 1, T, N, H), dk, dv (B, S, K,
    H) float32; rows past the lengths 0."""
    check_options(p_scale, domain)
    _check_dq(dq_accum, dq_scale_log2)
    bq, t, n, h = q.data.shape
    b, s, n_kv, _ = k.data.shape
    if bq not in (1, b) or v.data.shape != k.data.shape or do.data.shape != (b, t, n, h) or n % n_kv:
        raise ValueError(f"q {q.data.shape} / k {k.data.shape} / v {v.data.shape} / do {do.data.shape}: mismatch")
    if lse.shape != (b, n, t) or delta.shape != (b, n, t):
        raise ValueError(f"lse {lse.shape} and delta {delta.shape} must be (B, N, T) = {(b, n, t)}")
    g = n // n_kv

    def queries(op, orientation):  # (B, K, G, T, H): rows past T are never read back
        x = operand_values(op, orientation)[:, :t]
        return head_major(jnp.broadcast_to(x, (b,) + x.shape[1:]), g)

    def keys(op, orientation):  # (B, K, Sp, H), rows past S zero
        return head_major(operand_values(op, orientation), 1)[:, :, 0]

    q_s, q_dk, do_dp, do_dv = queries(q, "hd"), queries(q, "seq"), queries(do, "hd"), queries(do, "seq")
    k_s, k_dq, v_dp = keys(k, "hd"), keys(k, "seq"), keys(v, "hd")
    sp = k_s.shape[2]
    q_len, kv_len = lengths(lens, b, t, s)
    masking = Masking(is_causal=causal, s_real=sp, q_len=q_len, kv_len=kv_len, mask=None, bias=None)
    factor, ex, _ = exponent(domain, scale)
    lse5 = lse.reshape(b, n_kv, g, t).astype(jnp.float32)
    lse_use = jnp.where(lse5 == -jnp.inf, 0.0, lse5)  # rows with no valid key: every P is 0 anyway
    if domain == "log2":
        lse_use = lse_use * np.float32(LOG2E)  # the kernel converts each row's LSE once
    delta5 = delta.reshape(b, n_kv, g, t).astype(jnp.float32)
    tau, up = np.float32(scale), np.float32(2.0**dq_scale_log2)

    def tiles(x):
        return jnp.moveaxis(x.reshape(b, n_kv, sp // KV_TILE, KV_TILE, h), 2, 0)

    def step(dq_acc, xs):
        k_t, v_t, kdq_t, j = xs
        logits = tile_logits(q_s, k_t, j, masking, None, None, scale=float(factor))
        p = ex(jnp.minimum(logits - lse_use[..., None], 0.0))
        dv_t = mm("bkgts,bkgth->bksh", quantize_p(p, p_scale, -2), do_dv)
        ds = p * (mm("bkgth,bksh->bkgts", do_dp, v_t) - delta5[..., None])
        dsq = quantize_ds(ds)[1]
        dq_acc = _add_dq(dq_acc, mm("bkgts,bksh->bkgth", dsq, kdq_t) * tau, dq_accum, up)
        dk_t = mm("bkgts,bkgth->bksh", dsq, q_dk) * tau
        return dq_acc, (dk_t, dv_t)

    dq0 = jnp.zeros(q_s.shape, jnp.float32 if dq_accum == "fp32" else jnp.float16)
    xs = (tiles(k_s), tiles(v_dp), tiles(k_dq), jnp.arange(sp // KV_TILE, dtype=jnp.int32))
    dq, (dk, dv) = lax.scan(step, dq0, xs)
    if dq_accum != "fp32":
        dq = dq.astype(jnp.float32) * np.float32(2.0**-dq_scale_log2)

    def key_major(x):  # (Sp/128, B, K, 128, H) -> (B, S, K, H)
        return jnp.moveaxis(x, 0, 2).reshape(b, n_kv, sp, h)[:, :, :s].transpose(0, 2, 1, 3)

    dq = dq.reshape(b, n, t, h).transpose(0, 2, 1, 3)
    if bq == 1 and b > 1:  # broadcast_q: every batch row's dQ reduce-adds into the one query's
        dq = jnp.sum(dq, axis=0, keepdims=True)
    return dq, key_major(dk), key_major(dv)
