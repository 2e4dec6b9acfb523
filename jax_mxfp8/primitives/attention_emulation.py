"""The Hopper attention forward kernel's arithmetic in XLA (layer 5): the tight oracle for the kernel.

  emulate_fwd(ops, *, causal, t, p_scale, p_rounding) -> (o (B, N, T, H) float32, lse (B, N, T))
  p_tile_offset(...)   the kernel's per-(row, KV tile) P offset for p_scale="block"
  p_to_e4m3(p)         the kernel's P rounding (cvt.rn.satfinite.e4m3)
  p_options(p_scale, p_rounding)   checked P options

P~ is quantized as the kernel does it: p_scale="const" stores E4M3(256 P~); "block" stores E4M3(P~ * 2^offset)
with one offset per (query row, 128-key tile) from the contract's block rule on the row-tile's amax
(p_tile_offset; docs/numerics.md "Hopper attention kernel" says why this reproduces the contract's 32-key
blocks except below 2^-6 of the row-tile scale).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.formats.decode import decode_elements
from jax_mxfp8.formats.scales import pow2
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives.attention_layout import TILE_N
from jax_mxfp8.primitives.attention_operands import AlignedOperands
from jax_mxfp8.reference.attention_tiling import rounded


def p_options(p_scale: str, p_rounding: str) -> tuple[str, str]:
    """Checked (p_scale, p_rounding), p_rounding normalized to "up" for "const" (one fixed scale, no rule)."""
    if p_scale not in registry.P_SCALES:
        raise ValueError(f"p_scale={p_scale!r} is not one of {registry.P_SCALES}")
    if p_rounding not in registry.SCALE_ROUNDINGS:
        raise ValueError(f"p_rounding={p_rounding!r} is not one of {registry.SCALE_ROUNDINGS}")
    return p_scale, (p_rounding if p_scale == "block" else "up")


def p_tile_offset(tile_max: jax.Array, m_use: jax.Array, prev: jax.Array, p_rounding: str) -> jax.Array:
    """p_scale="block": the kernel's P offset per (query row, KV tile), as AttentionForwardSm90._p_offset.

    Args (log2 domain, float32, any common shape): tile_max: the row's largest logit in the tile (-inf when
      the tile is fully masked for the row); m_use: the running max the tile is exponentiated against
      (tile_max <= m_use); prev: the row's offset of the previous tile. p_rounding: "up" or "floor".
    Returns float32 integers in [8, P_OFFSET_MAX]: the tile stores E4M3(P~ * 2^offset), i.e. its scale is
    the contract's block scale for an amax of 2^-d, d = m_use - tile_max ("up": 2^ceil(-d - log2 448),
    "floor": 2^(floor(-d) - 8)), capped at 2^-P_OFFSET_MAX below; fully masked tiles keep `prev`; NaN
    rows get P_OFFSET_MAX (fmin ignores NaN, as the kernel's min.f32 does).
    """
    d = m_use - tile_max
    if p_rounding == "up":
        off = jnp.floor(d + np.float32(registry.LOG2_E4M3_MAX))
    elif p_rounding == "floor":
        off = jnp.ceil(d) + np.float32(registry.P_CONST_OFFSET)
    else:
        raise ValueError(f"p_rounding={p_rounding!r} is not one of {registry.SCALE_ROUNDINGS}")
    off = jnp.fmin(off, np.float32(registry.P_OFFSET_MAX))
    return jnp.where(tile_max == -jnp.inf, prev, off).astype(jnp.float32)


def p_to_e4m3(p: jax.Array) -> jax.Array:
    """The kernel's P rounding, cvt.rn.satfinite.e4m3: float32 P (>= 0, or NaN) -> E4M3 values as float32.

    Saturates at 448 (an "up" tile's max can land just above 448 where float rounding of d picked the
    finer scale; "floor" tiles reach [256, 512) by design, as the contract's own saturation does)."""
    return decode_elements(jnp.minimum(p, np.float32(448.0)).astype(jnp.float8_e4m3fn))


def _pow2f(k: jax.Array) -> jax.Array:
    """2^k for integer-valued float32 k in [-126, 127] (exact, from the bits)."""
    return pow2(k.astype(jnp.int32))


def emulate_fwd(
    ops: AlignedOperands, *, causal: bool, t: int, p_scale: str = "const", p_rounding: str = "up"
) -> tuple[jax.Array, jax.Array]:
    """The kernel's arithmetic in XLA (float32 GEMMs on the aligned operands, same tile order, exp2 with the
    max offset, E4M3 P, per-tile V exponents): the tight oracle for the kernel and a CPU check of
    `prepare`. p_scale "const": P = E4M3(256 P~); "block": P = E4M3(P~ * 2^offset) with the per-(row, tile)
    p_tile_offset, l kept in 2^-8 units, acc_O in the current tile's P units (rescaled by
    2^(offset_j - offset_{j-1}) with alpha), O = acc * 2^(8 - offset_last) * 2^eV / l.
    Returns o (B, N, T, H) float32 and lse (B, N, T) float32."""
    p_scale, p_rounding = p_options(p_scale, p_rounding)
    block = p_scale == "block"
    b, n, tp, h = ops.q.shape
    nk, sp = ops.k.shape[1], ops.k.shape[2]
    g, hg, nt = n // nk, h // 32, sp // TILE_N
    hp = lax.Precision.HIGHEST
    q = decode_elements(ops.q).reshape(b, nk, g, tp, h)
    k = decode_elements(ops.k)
    # undo the key permutation of V'^T: slot 16h + 4q + 2ib + i0 holds key 16h + 8ib + 2q + i0 (a transpose,
    # not a gather, so the emulation closes over no array constants: custom_partitioning needs that)
    v = decode_elements(ops.vt).reshape(b, nk, h, sp // 32, 2, 4, 2, 2).swapaxes(-3, -2)
    v = v.reshape(b, nk, h, sp).swapaxes(-1, -2)
    qs = jnp.repeat(ops.qs.reshape(b, nk, g, tp // 32), 32, axis=-1)[..., None]  # (b, nk, g, tp, 1)
    ks = jnp.repeat(ops.ks, 32, axis=-1).reshape(b, nk, nt, TILE_N)
    vs = ops.vs.reshape(b, nk, nt, hg)
    vi = ops.vi.reshape(b, nk, nt, hg)
    q_len, kv_len = ops.lens[0], ops.lens[1]
    rows = jnp.arange(tp)[:, None]
    const_off = np.float32(registry.P_CONST_OFFSET)

    def step(carry, j):
        m, lsum, acc, v_prev, off_prev = carry
        kj = lax.dynamic_slice_in_dim(k, j * TILE_N, TILE_N, axis=2)
        vj = lax.dynamic_slice_in_dim(v, j * TILE_N, TILE_N, axis=2)
        s = jnp.einsum("bkgth,bksh->bkgts", q, kj, precision=hp) * (qs * ks[:, :, None, j, None, :])
        cols = j * TILE_N + jnp.arange(TILE_N)[None, :]
        bad = cols[None] >= kv_len[:, None, None]
        if causal:
            bad = bad | (cols > rows)[None]
        # the kernel rounds each logit once (mul.rn) and both the max and the exponent read that value;
        # `rounded` keeps XLA from contracting the multiply into the exponent's subtraction
        s = jnp.where(bad[:, None, None], -jnp.inf, rounded(s))
        tile_max = jnp.max(s, axis=-1)
        m_new = jnp.maximum(m, tile_max)
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        off = p_tile_offset(tile_max, m_use, off_prev, p_rounding) if block else off_prev
        # P~ in this tile's P units (2^off): (S - m) <= 0 exactly, 0 at the max, then the integer offset, so
        # P~ * 2^off <= 2^off whatever the logits' magnitude (S - (m - off) would round m - off)
        p = jnp.exp2((s - m_use[..., None]) + off[..., None])
        alpha = jnp.exp2(m - m_use)
        if block:
            # l in fixed 2^-8 units; acc_O moves into this tile's P units (exact powers of two)
            lsum = alpha * lsum + jnp.sum(p, axis=-1) * _pow2f(const_off - off)
            alpha = alpha * _pow2f(off - off_prev)
        else:
            lsum = alpha * lsum + jnp.sum(p, axis=-1)
        pq = p_to_e4m3(p)
        ratio = jnp.where(j == 0, 1.0, v_prev * vi[:, :, j])  # (b, nk, hg)
        ratio = jnp.repeat(ratio, 32, axis=-1)[:, :, None, None, :]
        acc = acc * alpha[..., None] * ratio + jnp.einsum("bkgts,bksh->bkgth", pq, vj, precision=hp)
        return (m_new, lsum, acc, vs[:, :, j], off), None

    init = (
        jnp.full((b, nk, g, tp), -jnp.inf, jnp.float32),
        jnp.zeros((b, nk, g, tp), jnp.float32),
        jnp.zeros((b, nk, g, tp, h), jnp.float32),
        jnp.ones((b, nk, hg), jnp.float32),
        jnp.full((b, nk, g, tp), const_off, jnp.float32),
    )
    (m, lsum, acc, v_last, off_last), _ = lax.scan(step, init, jnp.arange(nt))
    live = (lsum > 0) | jnp.isnan(lsum)
    live = live & (jnp.arange(tp)[None, None, None, :] < q_len[:, None, None, None])
    if block:
        acc = acc * _pow2f(const_off - off_last)[..., None]  # back to the fixed 2^-8 units of l
    o = jnp.where(live[..., None], acc * jnp.repeat(v_last, 32, axis=-1)[:, :, None, None, :] / lsum[..., None], 0.0)
    lse = jnp.where(live, (m - 8.0 + jnp.log2(lsum)) * np.float32(np.log(2.0)), -jnp.inf)
    return o.reshape(b, n, tp, h)[:, :, :t], lse.reshape(b, n, tp)[:, :, :t]
