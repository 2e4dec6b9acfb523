"""Work decode of the Blackwell attention kernels (sm_100f; traced inside CuTe DSL kernels): which query rows
or keys of which head a CTA runs, and where that sequence lives in the operands. The counterpart of
kernels/sm90/tile_scheduler.py; the operand views are attention_loads.py's, the masks attention_mask.py's.

Forward (kernels/sm100/attention_fwd.py), AttentionSchedule: the CTAs are persistent (one per SM); CTA c runs
items c, c + grid, c + 2 grid, ... and every warp role of the CTA walks the same items. An item is one query
head's Q tile pair (ITEM_ROWS = 256 rows, two 128-row Q tiles) of one sequence:

  dense (padded batch, lens (2, B) int32: query and key lengths <= T, S):
      items = B * N * ceil(T / 256); non-causal: item t -> pair t % P, head row t // P (consecutive items
      share a head's K / V in L2); causal: the longest pairs first, t -> pair P - 1 - t // (B N), head row
      t % (B N) (longest-processing-time order over the static round robin)
  broadcast_q: the same items; Q (and its scales) are read at batch 0, O and LSE per batch row
  packed (one batch row of S sequences; the packed encoding of kernels/common/packed_sequences.py, seqs (6, S)
      and work (2, W) = (sequence, pair) sorted longest first, sequence -1 = padding): items = W * N,
      t -> work entry t // N, head t % N

Every item's addressing is "a sequence in a flattened row space": data rows row0 .. row0 + rows - 1 of the
(rows, heads, H) operand (dense: batch b's rows b T .., rows = T; packed: cu[s] .., rows = the sequence
length), scale chunks chunk0 .. of scale group g (dense: g = b * heads + head, chunk0 = 0; packed: g = head,
chunk0 = the sequence's first chunk). The loads bound their TMA boxes at `rows` (rows past it read as zero),
the masks use the lengths, the stores stop at `rows`.

Backward (kernels/sm100/attention_bwd.py), KeyTile: one CTA per (KV head, batch row, 128-key tile) -- dense
grid (K, B, ceil(S / 128)) -- or per (KV head, key scale chunk) of packed sequences -- grid (K, 1,
n_chunks_k), chunk i being item i of the key-tile work list (its sequence and key tile inside it, read with
packed_item: no search; packed tiles start at sequence starts; an item of no sequence does nothing). The key
tile is the slowest grid index, so CTAs launch key tile by key tile across all heads: the longest causal key
tiles first, and, in the deterministic dQ mode, a key tile's predecessor of the same head is never launched
later and is usually a wave ahead (no wavefront of ordered adds inside one wave). It visits, for each of the G
= N / K query heads of its KV head (GQA / MQA: dK, dV accumulate over them in TMEM), the query tiles m_lo ..
m_hi - 1 in ascending order: m_hi = ceil(q_len / 128), m_lo = the key tile's index under causal masking (tiles
above the diagonal hold no valid logit) and 0 otherwise; a key tile at or past kv_len visits nothing (its dK,
dV rows are written as zeros). Every warp role walks the same (g, m) sequence, the step counter i = g * (m_hi
- m_lo) + m - m_lo giving ring stages and mbarrier phases.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64

from jax_mxfp8.kernels.common.packed_sequences import packed_item, sequence_rows
from jax_mxfp8.kernels.sm100 import attention_bwd_ptx as px
from jax_mxfp8.kernels.sm100.attention_fwd_config import ITEM_ROWS, TILE_N
from jax_mxfp8.kernels.sm100.attention_geometry import TILE
from jax_mxfp8.kernels.sm100.attention_loads import SeqAddr, dense_seq, packed_seq
from jax_mxfp8.kernels.sm100.attention_mask import step_needs_mask


class AttentionWorkItem(NamedTuple):
    """One item (DSL Int32 values): Q tile pair `pair` of query head `head` against KV head `kv_head`."""

    live: Boolean  # False: a padding entry of the packed work list (nothing to do, nothing to write)
    pair: Int32  # rows 256 pair .. 256 pair + 255, counted from the sequence's start
    head: Int32
    kv_head: Int32
    q: SeqAddr  # Q's sequence (and Q's scale group and chunks)
    kv: SeqAddr  # K's and V's sequence
    o: SeqAddr  # O's sequence (broadcast_q: the batch row's, not Q's)
    q_len: Int32  # valid query rows (rows >= q_len get O = 0, LSE = -inf)
    kv_len: Int32  # valid keys (keys >= kv_len are masked)
    lse_off: Int32  # index of the sequence's row 0 in the flat LSE (heads-major rows)
    n_kv: Int32  # KV tiles the pair visits (0: O = 0 and LSE = -inf on its rows, no MMA)


def kv_tile_count(pair: Int32, q_len: Int32, kv_len: Int32, causal: bool) -> Int32:
    """KV tiles a pair visits: those holding a valid key and (causal) a key <= the pair's last valid row;
    0 when the pair holds no valid row (causal) or there is no valid key."""
    n = (kv_len + (TILE_N - 1)) // TILE_N
    if cutlass.const_expr(causal):
        last = cutlass.min(pair * ITEM_ROWS + ITEM_ROWS, q_len) - 1
        n = Int32(cutlass.select_(last >= 0, cutlass.min(n, last // TILE_N + 1), Int32(0)))
    return n


class AttentionSchedule:
    """The persistent schedule of one forward variant (trace-time parameters)."""

    def __init__(self, causal: bool, packed: bool, broadcast_q: bool):
        self.causal, self.packed, self.broadcast_q = causal, packed, broadcast_q

    def total(self, dims) -> Int32:
        """Items of the problem. dims: (B, T, S, N, K, W) Int32 (W: packed work entries, else unused)."""
        b, t, _, n, _, w = dims
        if cutlass.const_expr(self.packed):
            return w * n
        return b * n * ((t + (ITEM_ROWS - 1)) // ITEM_ROWS)

    @cute.jit
    def item(self, idx: Int32, dims, tables) -> AttentionWorkItem:
        """Item idx. tables: (lens,) dense / broadcast_q, (seqs, work) packed (module docstring)."""
        b_, t_, s_, heads, kv_heads, _ = dims
        group = heads // kv_heads
        if cutlass.const_expr(self.packed):
            seqs, work = tables
            entry = idx // heads
            head = idx - entry * heads
            it = packed_item(work, seqs, entry)
            live, pair, q_len, kv_len = it.live, it.tile, it.q_len, it.kv_len
            q_row0, kv_row0 = sequence_rows(seqs, it.seq)
            kv_head = head // group
            q = packed_seq(q_row0, q_len, head, it.q_tile0)
            kv = packed_seq(kv_row0, kv_len, kv_head, it.kv_tile0)
            o = q
            lse_off = head * t_ + q_row0
        else:
            (lens,) = tables
            pairs = (t_ + (ITEM_ROWS - 1)) // ITEM_ROWS
            if cutlass.const_expr(self.causal):
                bn = b_ * heads
                pair = pairs - 1 - idx // bn
                hrow = idx - (idx // bn) * bn
            else:
                pair = idx % pairs
                hrow = idx // pairs
            b = hrow // heads
            head = hrow - b * heads
            kv_head = head // group
            live = Boolean(True)
            q_len, kv_len = lens[0, b], lens[1, b]
            q_b = Int32(0) if cutlass.const_expr(self.broadcast_q) else b
            q_g = head if cutlass.const_expr(self.broadcast_q) else hrow
            q = dense_seq(q_b, t_, q_g)
            kv = dense_seq(b, s_, b * kv_heads + kv_head)
            o = dense_seq(b, t_, hrow)
            lse_off = hrow * t_
        n_kv = kv_tile_count(pair, q_len, kv_len, self.causal)
        return AttentionWorkItem(live, pair, head, kv_head, q, kv, o, q_len, kv_len, lse_off, n_kv)


@dataclasses.dataclass(frozen=True)
class KeyTile:
    """One backward CTA's work (run-time values; frozen, so the DSL reads it in run-time branches and loops).

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
        """Whether step (., m) has any masked logit (attention_mask.step_needs_mask)."""
        return step_needs_mask(m, self.n, self.q_len, self.kv_len, causal)


def _steps(n: Int32, q_len: Int32, kv_len: Int32, groups: Int32, causal: bool):
    m_hi = (q_len + (TILE - 1)) // TILE
    m_lo = n if causal else Int32(0)
    has = (n * TILE < kv_len) & (m_lo < m_hi)
    steps = cutlass.select_(has, groups * (m_hi - m_lo), Int32(0))
    return m_lo, cutlass.select_(has, m_hi, m_lo), steps


def dense_key_tile(lens: Int64, t: Int32, s: Int32, q_batch: Int32, groups: Int32, causal: bool) -> KeyTile:
    """The CTA's work on a dense padded batch: lens (2, B) int32 (query, key lengths, clamped to T, S)."""
    kv, b, n = cute.arch.block_idx()
    nb = cute.arch.grid_dim()[1]
    q_len = cutlass.min(px.ld_global_i32(lens + Int64(b) * 4), t)
    kv_len = cutlass.min(px.ld_global_i32(lens + (Int64(nb) + Int64(b)) * 4), s)
    m_lo, m_hi, steps = _steps(n, q_len, kv_len, groups, causal)
    bq = cutlass.select_(q_batch > 1, b, Int32(0))
    zero = Int32(0)
    return KeyTile(valid=Boolean(True), b=b, bq=bq, kv=kv, n=n, q_off=zero, k_off=zero, q_len=q_len, kv_len=kv_len,
                q_chunk0=zero, k_chunk0=zero, groups=groups, m_lo=m_lo, m_hi=m_hi, steps=steps)  # fmt: skip


def packed_key_tile(seqs: cute.Tensor, key_tiles: cute.Tensor, groups: Int32, causal: bool) -> KeyTile:
    """The CTA's work on packed sequences: grid z = item i of key_tiles (2, n_chunks_k) (key chunk i: its
    sequence and key tile inside it, or -1), seqs (6, S) (kernels/common/packed_sequences.py)."""
    kv, _, i = cute.arch.block_idx()
    it = packed_item(key_tiles, seqs, i)
    q_off, k_off = sequence_rows(seqs, it.seq)
    m_lo, m_hi, steps = _steps(it.tile, it.q_len, it.kv_len, groups, causal)
    steps = cutlass.select_(it.live, steps, Int32(0))
    m_hi = cutlass.select_(it.live, m_hi, m_lo)
    zero = Int32(0)
    return KeyTile(valid=it.live, b=zero, bq=zero, kv=kv, n=it.tile, q_off=q_off, k_off=k_off, q_len=it.q_len,
                kv_len=it.kv_len, q_chunk0=it.q_tile0, k_chunk0=it.kv_tile0, groups=groups, m_lo=m_lo, m_hi=m_hi,
                steps=steps)  # fmt: skip
