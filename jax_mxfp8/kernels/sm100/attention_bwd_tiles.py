"""Work tiles of the Blackwell attention backward (kernels/sm100/attention_bwd.py): which keys a CTA owns,
which query tiles it visits, and the global views its TMA loads read. Traced inside CuTe DSL kernels.

One CTA per (KV head, batch row, 128-key tile) -- dense grid (K, B, ceil(S / 128)) -- or per (KV head, key
scale chunk) of packed sequences -- grid (K, 1, n_chunks_k), chunk i belonging to the sequence s with
chunk_k[s] <= i < chunk_k[s + 1] (packed tiles start at sequence starts; chunks past chunk_k[S] do nothing).
The key tile is the slowest grid index, so CTAs launch key tile by key tile across all heads: the longest
causal key tiles first, and, in the deterministic dQ mode, a key tile's predecessor of the same head is
never launched later and is usually a wave ahead (no wavefront of ordered adds inside one wave).
It visits, for each of the G = N / K query heads of its KV head (GQA / MQA: dK, dV accumulate over them in
TMEM), the query tiles m_lo .. m_hi - 1 in ascending order: m_hi = ceil(q_len / 128), m_lo = the key tile's
index under causal masking (tiles above the diagonal hold no valid logit) and 0 otherwise; a key tile at or
past kv_len visits nothing (its dK, dV rows are written as zeros). Every warp role walks the same
(g, m) sequence, the step counter i = g * (m_hi - m_lo) + m - m_lo giving ring stages and mbarrier phases.

Global views (host side): a (B, L, heads, H) E4M3 operand becomes the TMA tensor (L, H, heads, B) (rows,
head_dim, heads, batch), or, packed, a "ragged" view (2^30, H, heads, 2^31 - 1) whose row mode and last mode
share the row stride on a base shifted back by 2^30 rows: a sequence at rows [off, off + len) is read through
row coordinate 2^30 - len + r and last coordinate off + len, so the hardware bounds check on the row mode
stops every box at the sequence's end (rows past it read as zero, never the next sequence's bytes).
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64, Uint32

from jax_mxfp8.kernels.sm100 import attention_bwd_ptx as px
from jax_mxfp8.kernels.sm100.attention_bwd_config import TILE

RAGGED_ROWS = 2**30
RAGGED_LAST = 2**31 - 1
SEARCH_LEVELS = 4
"""32-ary search levels of the packed tile -> sequence lookup: up to 32^4 sequences."""


# ----------------------------------------------------------------------------------------- host views
def tma_rows(t: cute.Tensor, packed: bool) -> cute.Tensor:
    """(B, L, heads, H) row-major -> the TMA source view (module docstring)."""
    b, length, heads, h = t.shape
    row = heads * h
    if not packed:
        layout = cute.make_layout((length, h, heads, b), stride=(row, 1, h, length * row))
        return cute.make_tensor(t.iterator, layout)
    layout = cute.make_layout((RAGGED_ROWS, h, heads, RAGGED_LAST), stride=(row, 1, h, row))
    return cute.make_tensor(t.iterator + (-RAGGED_ROWS) * row, layout)


def cta_rows(tma_tensor: cute.Tensor, packed: bool, batch: Int32, offset: Int32, length: Int32) -> cute.Tensor:
    """One batch row's (dense) or one sequence's (packed: rows offset .. offset + length - 1) (L, H, heads)
    view of a TMA tensor made from tma_rows."""
    if not packed:
        return tma_tensor[(None, None, None, batch)]
    view = tma_tensor[(None, None, None, offset + length)]
    return cute.domain_offset((RAGGED_ROWS - length, 0, 0), view)


# -------------------------------------------------------------------------------------------- device
@dataclasses.dataclass(frozen=True)
class Work:
    """One CTA's work (run-time values; frozen, so the DSL reads it in run-time branches and loops).

    valid: the CTA owns a key tile (packed: its chunk is inside some sequence); b, bq: batch row of k / v /
    dO and of q (0 when q has batch 1); kv: KV head; n: key tile inside the sequence; q_off, k_off: first
    packed row of the sequence (0 dense); q_len, kv_len: valid queries / keys; q_chunk0, k_chunk0: first scale
    chunk of the sequence (0 dense); groups: G; m_lo, m_hi: query tiles visited per head (m_hi = m_lo when
    the CTA has no work); steps: G (m_hi - m_lo)."""

    valid: Boolean
    b: Int32
    bq: Int32
    kv: Int32
    n: Int32
    q_off: Int32
    k_off: Int32
    q_len: Int32
    kv_len: Int32
    q_chunk0: Int32
    k_chunk0: Int32
    groups: Int32
    m_lo: Int32
    m_hi: Int32
    steps: Int32

    def masked(self, m: Int32, causal: bool) -> Boolean:
        """Whether step (., m) has any masked logit: the causal diagonal tile, or a tile crossing q_len or kv_len."""
        edge = (m + 1) * TILE > self.q_len
        edge = edge | ((self.n + 1) * TILE > self.kv_len)
        if causal:
            edge = edge | (m == self.n)
        return edge


def _steps(n: Int32, q_len: Int32, kv_len: Int32, groups: Int32, causal: bool):
    m_hi = (q_len + (TILE - 1)) // TILE
    m_lo = n if causal else Int32(0)
    has = (n * TILE < kv_len) & (m_lo < m_hi)
    steps = cutlass.select_(has, groups * (m_hi - m_lo), Int32(0))
    return m_lo, cutlass.select_(has, m_hi, m_lo), steps


def dense_work(lens: Int64, t: Int32, s: Int32, q_batch: Int32, groups: Int32, causal: bool) -> Work:
    """The CTA's work on a dense padded batch: lens (2, B) int32 (query, key lengths, clamped to T, S)."""
    kv, b, n = cute.arch.block_idx()
    nb = cute.arch.grid_dim()[1]
    q_len = cutlass.min(px.ld_global_i32(lens + Int64(b) * 4), t)
    kv_len = cutlass.min(px.ld_global_i32(lens + (Int64(nb) + Int64(b)) * 4), s)
    m_lo, m_hi, steps = _steps(n, q_len, kv_len, groups, causal)
    bq = cutlass.select_(q_batch > 1, b, Int32(0))
    zero = Int32(0)
    return Work(valid=Boolean(True), b=b, bq=bq, kv=kv, n=n, q_off=zero, k_off=zero, q_len=q_len, kv_len=kv_len,
                q_chunk0=zero, k_chunk0=zero, groups=groups, m_lo=m_lo, m_hi=m_hi, steps=steps)  # fmt: skip


def find_sequence(table: Int64, n_seq: Int32, i: Int32) -> Int32:
    """The largest s in [0, n_seq) with table[s] <= i (table: n_seq + 1 ascending int32, table[0] = 0),
    found by the whole warp: each level, lane l reads the start of the l-th of 32 sub-ranges and a ballot
    counts the sub-ranges starting at or before i (SEARCH_LEVELS dependent loads)."""
    lane = cute.arch.lane_idx()
    lo, span = Int32(0), n_seq
    for _ in range(SEARCH_LEVELS):
        stride = (span + 31) // 32
        idx = lo + lane * stride
        inside = idx < lo + span
        start = px.ld_global_i32_pred(table + Int64(idx) * 4, inside, 2**31 - 1)
        count = px.popc(px.ballot(inside & (start <= i)))
        new_lo = lo + (count - 1) * stride
        span = cutlass.min(stride, lo + span - new_lo)
        lo = new_lo
    return lo


def packed_work(seqs: Int64, n_seq: Int32, groups: Int32, causal: bool) -> Work:
    """The CTA's work on packed sequences: seqs (4, S + 1) int32 = cu_q, cu_k, chunk_q, chunk_k."""
    kv, _, i = cute.arch.block_idx()
    row = Int64(n_seq + 1) * 4

    def at(r: int, s) -> Int32:
        return px.ld_global_i32(seqs + Int64(r) * row + Int64(s) * 4)

    valid = i < at(3, n_seq)
    s = find_sequence(seqs + 3 * row, n_seq, i)
    q_off, k_off = at(0, s), at(1, s)
    q_len, kv_len = at(0, s + 1) - q_off, at(1, s + 1) - k_off
    k_chunk0 = at(3, s)
    n = i - k_chunk0
    m_lo, m_hi, steps = _steps(n, q_len, kv_len, groups, causal)
    steps = cutlass.select_(valid, steps, Int32(0))
    m_hi = cutlass.select_(valid, m_hi, m_lo)
    zero = Int32(0)
    return Work(valid=valid, b=zero, bq=zero, kv=kv, n=n, q_off=q_off, k_off=k_off, q_len=q_len, kv_len=kv_len,
                q_chunk0=at(2, s), k_chunk0=k_chunk0, groups=groups, m_lo=m_lo, m_hi=m_hi, steps=steps)  # fmt: skip


def scale_chunk(base: Int64, batch: Int32, head: Int32, heads: Int32, tiles: Int32, tile: Int32) -> Int64:
    """Global address of the 512-byte scale chunk of (batch, head, tile) in a (B, heads, tiles, 512) blocked
    scale buffer (the "hd" layout (B, heads, Lp/128, 1, 512) and the "seq" layout (B, heads, 1, Lp/128, 512)
    of head_dim <= 128 are both this)."""
    return base + ((Int64(batch) * Int64(heads) + Int64(head)) * Int64(tiles) + Int64(tile)) * 512


def lane_quarter(warp: Int32) -> Int32:
    """The TMEM lane quarter a warp reaches (warp % 4)."""
    return warp % 4


def u32(x) -> Uint32:
    return Uint32(x)
