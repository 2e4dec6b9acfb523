"""MXFP8 attention forward (XLA reference): online softmax over KV tiles with quantized P~.

Numerics (docs/numerics.md): S = tau Q^ K^T in float32, masked to -inf; per KV tile a running row max
m, P~ = exp(S - m) in float32, l accumulated from the unquantized P~, P~ quantized along KV, and
O = (sum over tiles of rescale * quant(P~) @ V^) / l; LSE = m + log l.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.reference.attention_quant import fake_quant_p
from jax_mxfp8.reference.attention_tiling import (
    Masking,
    gemm_dtype,
    mm,
    pad_axis,
    pad_masking,
    round_up,
    tile_logits,
    tiled,
    to_tiles,
)


def attention_fwd(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    masking: Masking,
    *,
    scale: float,
    config: AttentionConfig,
) -> tuple[jax.Array, jax.Array]:
    """Forward pass on dequantized operands.

    Args:
      q: (B, K, G, T, H) Q^ as used by S = Q K^T. k: (B, K, S, H) K^ for S. v: (B, K, S, H) V^ for O = P V.
      masking: validity of logits and bias (see Masking); mask/bias last axis 1 or S.
      scale: softmax scale tau. config: numerics options (p_scale, scale_rounding, kv_tile are used).

    Returns:
      o: (B, K, G, T, H) float32, normalized output; 0 on rows where every logit is masked.
      lse: (B, K, G, T) float32 log-sum-exp of the masked logits; -inf on fully masked rows.
    """
    kt = config.kv_tile
    s_pad = round_up(k.shape[-2], kt)
    dt = gemm_dtype()
    q = q.astype(dt)
    k_tiles = to_tiles(pad_axis(k.astype(dt), -2, s_pad), -2, kt)
    v_tiles = to_tiles(pad_axis(v.astype(dt), -2, s_pad), -2, kt)
    masking = pad_masking(masking, s_pad)
    xs = (k_tiles, v_tiles, jnp.arange(s_pad // kt, dtype=jnp.int32), tiled(masking.mask, kt), tiled(masking.bias, kt))

    def step(carry, x):
        m, lsum, acc = carry
        k_t, v_t, j, mask_t, bias_t = x
        s = tile_logits(q, k_t, j, masking, mask_t, bias_t, scale=scale)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        # A row with no valid logit yet keeps m = -inf; exponentiate against 0 there so that
        # exp(-inf - m) is 0 rather than NaN.
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - m_use[..., None])
        alpha = jnp.exp(m - m_use)
        lsum = alpha * lsum + jnp.sum(p, axis=-1)  # l from the unquantized P~
        pq = fake_quant_p(p, -1, config.p_scale, config.scale_rounding)
        acc = alpha[..., None] * acc + mm("bkgts,bksh->bkgth", pq, v_t)
        return (m_new, lsum, acc), None

    # *_like keeps q's varying manual axes, so the scan also type-checks inside shard_map bodies
    init = (
        jnp.full_like(q[..., 0], -jnp.inf, jnp.float32),
        jnp.zeros_like(q[..., 0], jnp.float32),
        jnp.zeros_like(q, jnp.float32),
    )
    (m, lsum, acc), _ = lax.scan(step, init, xs)
    has = lsum != 0  # 0 only where every logit is masked; NaN (a NaN operand) propagates, never turns into 0
    o = jnp.where(has[..., None], acc / jnp.where(has, lsum, 1.0)[..., None], 0.0)
    lse = jnp.where(has, m + jnp.log(jnp.where(has, lsum, 1.0)), -jnp.inf)
    return o, lse
