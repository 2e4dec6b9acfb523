"""MXFP8 attention backward (XLA reference), tiled over KV like the forward.

Numerics (docs/numerics.md): dO^ in 32x32 square blocks; Delta = rowsum(dO * O) from the unquantized
dO and O; P = exp(S - LSE); dV = quant(P)^T @ dO^; dP = dO^ @ V^T; dS = P * (dP - Delta) in 32x32 square
blocks (scale rounding "up"); dQ = tau dS^ @ K^ accumulated over KV tiles in float32 or float16 (x 2^e,
e = config.dq_fp16_scale_log2, one rounding per tile, tiles in ascending order);
dK = tau dS^T @ Q^. GQA: dK and dV sum the G query heads of a group in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.reference.attention_quant import fake_quant_p, fake_quant_square
from jax_mxfp8.reference.attention_tiling import (
    Masking,
    from_tiles,
    gemm_dtype,
    mm,
    pad_axis,
    pad_masking,
    round_up,
    tile_logits,
    tiled,
    to_tiles,
)


def _sum_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Sums the axes of x that `shape` broadcasts (size 1 in shape), keeping them."""
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape, strict=True)) if b == 1 and a != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def attention_bwd(
    q_s: jax.Array,
    k_s: jax.Array,
    v_dp: jax.Array,
    q_dk: jax.Array,
    k_dq: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    do: jax.Array,
    dlse: jax.Array | None,
    masking: Masking,
    *,
    scale: float,
    config: AttentionConfig,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
    """Backward pass on dequantized operands.

    Args:
      q_s, k_s: Q^ (B, K, G, T, H) and K^ (B, K, S, H) exactly as the forward used them for S.
      v_dp: V^ (B, K, S, H) for dP = dO V^T. q_dk: Q^ for dK = dS^T Q. k_dq: K^ for dQ = dS K.
      o: (B, K, G, T, H) the forward output (as returned to the caller). lse: (B, K, G, T) float32.
      do: (B, K, G, T, H) output cotangent (rows that are padding must already be zero).
      dlse: optional (B, K, G, T) cotangent of the LSE (it adds P * dLSE to dS), or None.
      masking, scale, config: as in the forward.

    Returns:
      dq (B, K, G, T, H), dk and dv (B, K, S, H), float32; dbias with masking.bias's shape (float32) or None.
    """
    do = do.astype(jnp.float32)
    do_q = fake_quant_square(do, config.scale_rounding)
    return attention_bwd_quantized(
        q_s, k_s, v_dp, q_dk, k_dq, lse, do_q, bwd_delta(do, o, dlse), masking, scale=scale, config=config
    )


def bwd_delta(do: jax.Array, o: jax.Array, dlse: jax.Array | None) -> jax.Array:
    """Delta = rowsum(dO * O) - dLSE in float32 from the unquantized dO and O (..., T, H) -> (..., T).

    d LSE / d S = P, so an LSE cotangent enters dS = P * (dP - Delta + dLSE): it is folded into Delta.
    """
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    if dlse is not None:
        delta = delta - dlse.astype(jnp.float32)
    return delta


def attention_bwd_quantized(
    q_s: jax.Array,
    k_s: jax.Array,
    v_dp: jax.Array,
    q_dk: jax.Array,
    k_dq: jax.Array,
    lse: jax.Array,
    do_q: jax.Array,
    delta: jax.Array,
    masking: Masking,
    *,
    scale: float,
    config: AttentionConfig,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
    """The backward after dO's quantization and Delta (the part the Hopper backward kernel computes).

    Args as attention_bwd, except do_q: dO^ (B, K, G, T, H), the square-quantized (dequantized) output
    cotangent, and delta: (B, K, G, T) float32 (bwd_delta). Returns what attention_bwd returns.
    """
    kt = config.kv_tile
    s_len = k_s.shape[-2]
    s_pad = round_up(s_len, kt)
    dt = gemm_dtype()
    do_q = do_q.astype(dt)
    delta = delta.astype(jnp.float32)
    # Fully masked rows have LSE = -inf and every logit -inf: any finite base gives P = 0 there.
    lse_use = jnp.where(lse == -jnp.inf, 0.0, lse)
    q_s, q_dk = q_s.astype(dt), q_dk.astype(dt)

    def kv_tiles(x):
        return to_tiles(pad_axis(x.astype(dt), -2, s_pad), -2, kt)

    masking = pad_masking(masking, s_pad)
    bias = masking.bias
    xs = (
        kv_tiles(k_s),
        kv_tiles(v_dp),
        kv_tiles(k_dq),
        jnp.arange(s_pad // kt, dtype=jnp.int32),
        tiled(masking.mask, kt),
        tiled(bias, kt),
    )
    fp16 = config.dq_accum == "fp16"
    e = config.dq_fp16_scale_log2
    up = jnp.float32(2.0**e)

    def step(dq_acc, x):
        k_t, v_t, kdq_t, j, mask_t, bias_t = x
        s = tile_logits(q_s, k_t, j, masking, mask_t, bias_t, scale=scale)
        # P <= 1 as softmax probabilities are: S never exceeds the forward's LSE when the forward recomputed
        # these exact logits, but an LSE from the kernel forward (realigned operands) can sit below S by far
        # more than 1 where |S| is huge, and exp would overflow to inf (then NaN gradients); NaN stays NaN
        p = jnp.exp(jnp.minimum(s - lse_use[..., None], 0.0))
        # dV = P^T dO contracts the query axis: block-scaled P is blocked along T here.
        pq = fake_quant_p(p, -2, config.p_scale, config.scale_rounding)
        dv_t = mm("bkgts,bkgth->bksh", pq, do_q)
        dp = mm("bkgth,bksh->bkgts", do_q, v_t)
        ds = p * (dp - delta[..., None])
        dsq = fake_quant_square(ds, "up")
        dq_part = mm("bkgts,bksh->bkgth", dsq, kdq_t) * jnp.float32(scale)
        if fp16:
            # The float16 accumulator holding dQ * 2^e: one rounding per KV tile, tiles in ascending order
            # (the kernel's deterministic mode; beyond float16's range: +-Inf, then NaN, never clamped).
            dq_acc = (dq_acc.astype(jnp.float32) + dq_part * up).astype(jnp.float16)
        else:
            dq_acc = dq_acc + dq_part
        dk_t = mm("bkgts,bkgth->bksh", dsq, q_dk) * jnp.float32(scale)
        db_t = None
        if bias is not None:
            # The bias gradient is the unquantized dS (the logits' cotangent), summed over broadcast axes.
            db_shape = bias.shape[:-1] + ((kt,) if bias_t is not None else (1,))
            db_t = _sum_to(ds, db_shape)
        return dq_acc, (dk_t, dv_t, db_t)

    dq0 = jnp.zeros_like(q_s, jnp.float16 if fp16 else jnp.float32)  # *_like: shard_map-varying like q
    dq_acc, (dk, dv, db) = lax.scan(step, dq0, xs)
    dq = dq_acc.astype(jnp.float32) * jnp.float32(2.0**-e) if fp16 else dq_acc
    dk = from_tiles(dk, -2)[..., :s_len, :]
    dv = from_tiles(dv, -2)[..., :s_len, :]
    dbias = None
    if bias is not None:
        dbias = from_tiles(db, -1)[..., :s_len] if bias.shape[-1] != 1 else jnp.sum(db, axis=0)
    return dq, dk, dv, dbias
