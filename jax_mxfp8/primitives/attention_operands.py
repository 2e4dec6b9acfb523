"""The Hopper attention kernels' producer pass (layer 5): square-block MX operands -> the kernels' inputs.

  prepare(q, k, v, *, scale, q_len, kv_len) -> AlignedOperands   XLA, head-major MXArrays; runs anywhere
  prepare_sequence_major(q, k, v, ..., path="cuda") -> AlignedOperands
      the same from (B, L, N, H) MXArrays: exponents in XLA, the FP8 data through the realign call
      (attention_realign.py; path "emulated" runs its XLA body)

Shared by the forward kernel call (attention_fwd.py) and the backward's pre-pass (attention_bwd.py). The
kernels take the contract's square-block MX operands re-encoded to one exponent per GEMM sub-tile ("way
(a)", docs/numerics.md "Hopper attention kernel"):

* Q, K: every 32-row block gets e_row = max of its H/32 block exponents; each element is re-rounded
  to E4M3 at that exponent: q' = RNE(q * 2^(e_block - e_row)), starting from the MX element q (so Q^ is
  reproduced wherever the shift loses nothing: exact unless an element drops below E4M3's normal range,
  error <= 2^-10 * 2^e_row per element).
* V: every (128-key tile, 32 head-dim columns) gets e_tile = max of its 4 block exponents; elements as
  above, stored transposed (B, K, H, Sp) with the keys of every 32-key chunk permuted by pv_permutation
  (the order the kernel's P fragment has them in).

Exponents are clamped to [-126, 126] so that 2^e and 2^-e are normal float32 numbers; finite float32 input
never produces a block exponent above 120 (docs/numerics.md), and raising a tiny exponent only flushes
elements below 2^-135 relative to the block, which E4M3 already rounds to 0. A block whose scale byte is
0xFF (NaN) makes its whole row block (Q, K) or tile column group (V) NaN.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.scales import mul_pow2, pow2
from jax_mxfp8.primitives.attention_layout import (
    E_MAX,
    E_MIN,
    LOG2E,
    TILE_M,
    TILE_N,
    V_SPREAD,
    permute_keys_transposed,
    realign_elements,
    round_up,
)
from jax_mxfp8.primitives.attention_realign import realign


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AlignedOperands:
    """The kernel's inputs (shapes with Tp, Sp = T, S rounded up to 128; N = K * G query heads)."""

    q: jax.Array  # (B, N, Tp, H) float8_e4m3fn
    k: jax.Array  # (B, K, Sp, H) float8_e4m3fn
    vt: jax.Array  # (B, K, H, Sp) float8_e4m3fn, keys permuted within 32
    qs: jax.Array  # (B, N, Tp/32) float32: tau * log2(e) * 2^eQ
    ks: jax.Array  # (B, K, Sp/32) float32: 2^eK
    vs: jax.Array  # (B, K, Sp/128 * H/32) float32: 2^eV
    vi: jax.Array  # (B, K, Sp/128 * H/32) float32: 2^-eV
    lens: jax.Array  # (2, B) int32: query lengths, KV lengths


def _pad_seq(mx_data: jax.Array, mx_scale: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
    """Zero-pads (..., L, H) data and (..., L/32, H/32) scales along L to `length`."""
    extra = length - mx_data.shape[-2]
    if extra == 0:
        return mx_data, mx_scale
    pad = [(0, 0)] * (mx_data.ndim - 2) + [(0, extra), (0, 0)]
    spad = [(0, 0)] * (mx_scale.ndim - 2) + [(0, extra // 32), (0, 0)]
    return jnp.pad(mx_data, pad), jnp.pad(mx_scale, spad)


def _exponents(scale: jax.Array) -> tuple[jax.Array, jax.Array]:
    e = scale.astype(jnp.int32) - 127
    return e, scale == 255


def row_exponents(scale: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(..., L/32, H/32) square-block scales of Q or K -> (e_row (..., L/32), nan_row, shift, nan) with
    shift = e_block - e_row (..., L/32, H/32) and nan the blocks' NaN flags."""
    e, nan = _exponents(scale)
    e_row = jnp.clip(jnp.max(jnp.where(nan, E_MIN, e), axis=-1), E_MIN, E_MAX)
    return e_row, jnp.any(nan, axis=-1), e - e_row[..., None], nan


def _sequence_max(e_tile: jax.Array, tile_seq: jax.Array | None) -> jax.Array:
    """(..., Sp/128, H/32) -> the largest e_tile of each tile's sequence: all tiles (tile_seq None), or the
    tiles with the same id in tile_seq (Sp/128,) (packed sequences: one sequence's V never moves another's)."""
    if tile_seq is None:
        return jnp.max(e_tile, axis=-2, keepdims=True)
    moved = jnp.moveaxis(e_tile, -2, 0)
    seg = jax.ops.segment_max(moved, tile_seq, num_segments=moved.shape[0], indices_are_sorted=True)
    return jnp.moveaxis(seg[tile_seq], 0, -2)


def v_exponents(
    scale: jax.Array, tile_seq: jax.Array | None = None
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(..., Sp/32, H/32) square-block scales of V -> (e_tile (..., Sp/128, H/32), nan_tile, shift (..., Sp/32,
    H/32), nan): one exponent per (128-key tile, 32 columns), raised to within V_SPREAD of the sequence's
    largest, and each block's shift to it. tile_seq: see _sequence_max."""
    e, nan = _exponents(scale)
    *lead, sb, hb = e.shape
    et = e.reshape(*lead, sb // 4, 4, hb)
    nt = nan.reshape(et.shape)
    e_tile = jnp.clip(jnp.max(jnp.where(nt, E_MIN, et), axis=-2), E_MIN, E_MAX)
    # The kernel keeps acc_O in the current tile's units: bound the spread between tiles (zero tiles, padding)
    e_tile = jnp.maximum(e_tile, _sequence_max(e_tile, tile_seq) - V_SPREAD)
    shift = (et - e_tile[..., None, :]).reshape(e.shape)
    return e_tile, jnp.any(nt, axis=-2), shift, nan


def align_rows(data: jax.Array, scale: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(..., L, H) square-block MX operand -> (data', e_row (..., L/32), nan_row (..., L/32))."""
    e_row, nan_row, shift, _ = row_exponents(scale)
    *lead, length, h = data.shape
    blocks = data.reshape(*lead, length // 32, 32, h // 32, 32)
    out = realign_elements(blocks, shift[..., :, None, :, None]).reshape(data.shape)
    return out, e_row, nan_row


def align_v(data: jax.Array, scale: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(..., Sp, H) square-block V -> (V'^T (..., H, Sp) permuted, e_tile (..., Sp/128 * H/32), nan)."""
    e_tile, nan_tile, shift, _ = v_exponents(scale)
    *lead, s, h = data.shape
    blocks = data.reshape(*lead, s // 32, 32, h // 32, 32)
    v = realign_elements(blocks, shift[..., :, None, :, None]).reshape(data.shape)
    return permute_keys_transposed(v), e_tile.reshape(*lead, -1), nan_tile.reshape(*lead, -1)


def _factor(e: jax.Array, nan: jax.Array, mult: float = 1.0) -> jax.Array:
    return jnp.where(nan, jnp.nan, jnp.float32(mult) * pow2(e)).astype(jnp.float32)


def prepare(
    q: MXArray, k: MXArray, v: MXArray, *, scale: float, q_len: jax.Array | None, kv_len: jax.Array | None
) -> AlignedOperands:
    """The producer pass.

    Args:
      q: (B, N, T, H) square-block MXArray (float8_e4m3fn, blocks over (T, H)); head n uses KV head n // G.
      k, v: (B, K, S, H) square-block MXArrays. Padding positions must already be zero (their blocks too).
      scale: softmax scale tau. q_len, kv_len: (B,) int32 or None (= T, S).
    """
    b, n, t, h = q.shape
    s = k.shape[-2]
    tp, sp = round_up(t, TILE_M), round_up(s, TILE_N)
    qd, qsc = _pad_seq(q.data, q.scale, tp)
    kd, ksc = _pad_seq(k.data, k.scale, sp)
    vd, vsc = _pad_seq(v.data, v.scale, sp)
    q_al, eq, nq = align_rows(qd, qsc)
    k_al, ek, nk = align_rows(kd, ksc)
    vt, ev, nv = align_v(vd, vsc)
    return AlignedOperands(
        q=q_al,
        k=k_al,
        vt=vt,
        qs=_factor(eq, nq, float(np.float32(scale * LOG2E))),
        ks=_factor(ek, nk),
        vs=_factor(ev, nv),
        vi=_factor(-ev, nv),
        lens=_lengths(q_len, kv_len, b, t, s),
    )


def _lengths(q_len, kv_len, b: int, t: int, s: int) -> jax.Array:
    ql = jnp.full((b,), t, jnp.int32) if q_len is None else q_len.astype(jnp.int32)
    kl = jnp.full((b,), s, jnp.int32) if kv_len is None else kv_len.astype(jnp.int32)
    return jnp.stack([ql, kl])


def head_major_scale(x: MXArray, padded: int) -> jax.Array:
    """(B, L/32, N, H/32) scales of a sequence-major MXArray -> (B, N, Lp/32, H/32), zero blocks past L."""
    sc = x.scale.transpose(0, 2, 1, 3)
    return jnp.pad(sc, [(0, 0), (0, 0), (0, padded // 32 - sc.shape[2]), (0, 0)])


def _shift_bytes(shift: jax.Array, nan: jax.Array, length: int) -> jax.Array:
    """(B, N, Lp/32, H/32) block shifts -> the realign kernel's int8 (B, L/32, N, H/32): shifts below -126 all
    flush the block (-127), NaN blocks keep their (NaN) elements (0)."""
    sh = jnp.where(nan, 0, jnp.maximum(shift, -127)).astype(jnp.int8)
    return sh[:, :, : length // 32].transpose(0, 2, 1, 3)


def aligned_rows(x: MXArray, padded: int, path: str = "cuda", mult: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """A sequence-major square MXArray (B, L, N, H) -> (x' (B, N, Lp, H) float8_e4m3fn re-encoded to one exponent
    per 32 rows, head-major and zero-padded to Lp = padded; its row factors (B, N, Lp/32) float32 mult * 2^e,
    NaN for row blocks holding a NaN block): Q and K of prepare_sequence_major, and the backward's FP8 copies
    of V and dO (kernels/sm90/attention_bwd.py sdp_fp8). Padding positions must already be zero."""
    e, nan_row, shift, nan = row_exponents(head_major_scale(x, padded))
    return realign(x.data, _shift_bytes(shift, nan, x.shape[1]), "rows", path), _factor(e, nan_row, mult)


def prepare_sequence_major(
    q: MXArray,
    k: MXArray,
    v: MXArray,
    *,
    scale: float,
    q_len: jax.Array | None,
    kv_len: jax.Array | None,
    kv_tile_seq: jax.Array | None = None,
    path: str = "cuda",
) -> AlignedOperands:
    """The producer pass on sequence-major operands, bit-identical to `prepare` on their head-major transposes.

    Args:
      q: (B, T, N, H) square-block MXArray (float8_e4m3fn, blocks over (T, H): axes (-3, -1)); T % 32 == 0.
      k, v: (B, S, K, H) likewise. Padding positions must already be zero (their blocks too).
      scale: softmax scale tau. q_len, kv_len: (B,) int32 or None (= T, S).
      kv_tile_seq: packed sequences (B = 1) only: (Sp/128,) int32 non-decreasing sequence id of every KV
        tile, so that V's exponent spread is bounded per sequence (None: per batch row).
    The exponent arithmetic runs in XLA on the scales; the FP8 data is re-encoded and transposed to the
    kernel's layouts by the realign kernel (kernels/sm90/attention_realign.py), one read and one write per
    byte. path="emulated" runs that call's XLA emulation through the same partitioning (CPU tests).
    q may hold one batch row for all of k's (broadcast_q, primitives/attention_fwd.py): its operands then
    keep batch 1 and q_len must be given (B,).
    """
    _, t, n, h = q.shape
    b, s = k.shape[:2]
    tp, sp = round_up(t, TILE_M), round_up(s, TILE_N)
    q_al, qs = aligned_rows(q, tp, path, float(np.float32(scale * LOG2E)))
    k_al, ks = aligned_rows(k, sp, path)
    ev, nv, shv, nanv = v_exponents(head_major_scale(v, sp), kv_tile_seq)
    ev, nv = ev.reshape(b, ev.shape[1], -1), nv.reshape(b, nv.shape[1], -1)  # (B, K, Sp/128 * H/32)
    return AlignedOperands(
        q=q_al,
        k=k_al,
        vt=realign(v.data, _shift_bytes(shv, nanv, s), "v", path),
        qs=qs,
        ks=ks,
        vs=_factor(ev, nv),
        vi=_factor(-ev, nv),
        lens=_lengths(q_len, kv_len, b, t, s),
    )


DO_F16_TOP = 7
"""The dv_f16 variants' dO operand puts its largest block exponent at 2^7: |dO 2^-shift| <= 448 * 2^7 = 57344,
below float16's 65504, and every E4M3 value of a block within 22 binades of it stays exact in float16."""


def do_shift(dos: jax.Array, group: int) -> jax.Array:
    """(B, N, Tp/32) float32 row factors 2^e of dO's FP8 copy (aligned_rows; NaN for row blocks holding a NaN
    block) -> (B, K) int32: the largest e over each KV head's `group` query heads and row blocks, NaN ones
    skipped (E_MIN when none is left), minus DO_F16_TOP. The same rows' largest square-block exponent: e_row
    is the max of its blocks'."""
    b, n, r = dos.shape
    top = jnp.max(jnp.where(jnp.isnan(dos), 0.0, dos).reshape(b, n // group, group * r), axis=-1)
    _, e = jnp.frexp(top)  # top = 2^(e - 1) (a power of two, or 0)
    e = jnp.where(top > 0, e - 1, E_MIN)
    return (e - DO_F16_TOP).astype(jnp.int32)


def shift_per_query_head(shift: jax.Array, n: int) -> jax.Array:
    """(B, K) per-KV-head shifts -> (B, N, 1, 1): query head n takes KV head n // G's."""
    return jnp.repeat(shift, n // shift.shape[1], axis=1)[:, :, None, None]


def do_float16(do: jax.Array, dos: jax.Array, shift: jax.Array) -> jax.Array:
    """dV's dO operand of the dv_f16 variants: do (B, N, Tp, H) (the MX values dO^, bfloat16 or float32) times
    2^-shift[b, n // G] (shift (B, K) from do_shift of the row factors dos (B, N, Tp/32)), rounded to float16:
    exact for every element of a block within 22 binades of the group's largest (float16's subnormals then
    hold E4M3's 4 significant bits). A row block whose factor is NaN (it holds a NaN block) is NaN as a whole,
    as in the FP8 copies (its finite blocks were left out of the shift and could exceed float16)."""
    x = mul_pow2(do.astype(jnp.float32), -shift_per_query_head(shift, do.shape[1]))
    nan_rows = jnp.repeat(jnp.isnan(dos), 32, axis=2)[..., None]  # (B, N, Tp, 1)
    return jnp.where(nan_rows, jnp.nan, x).astype(jnp.float16)


def do_float16_scales(scale: jax.Array, dos: jax.Array, shift: jax.Array) -> jax.Array:
    """The dequantize call's scale bytes that give do_float16's values (a float16 dequantize of dO's FP8 bytes,
    no float32 pass): (B, N, Lp/32, H/32) head-major square-block E8M0 bytes -> each lowered by shift[b, n // G]
    (clamped at 0, where the block lies below float16's range either way: +-0), 0xFF (NaN) kept, and every
    block of a row block whose factor in dos (B, N, Lp/32) is NaN set to 0xFF (do_float16's NaN rows)."""
    s = shift_per_query_head(shift, scale.shape[1])
    b = scale.astype(jnp.int32)
    out = jnp.where(b == 255, 255, jnp.maximum(b - s, 0))  # b - s <= 128 + DO_F16_TOP (e_row <= 126): never 0xFF
    return jnp.where(jnp.isnan(dos)[..., None], 255, out).astype(jnp.uint8)
