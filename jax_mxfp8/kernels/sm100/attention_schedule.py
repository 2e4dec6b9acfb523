"""Work items of the Blackwell attention kernels: which query rows of which head a persistent CTA runs, and
where that sequence lives in the operands (sm_100f; traced inside CuTe DSL kernels).

The CTAs are persistent (one per SM): CTA c runs items c, c + grid, c + 2 grid, ... of one schedule, and every
warp role of the CTA walks the same items. An item is one query head's Q tile pair (ITEM_ROWS = 256 rows,
two 128-row Q tiles) of one sequence:

  dense (padded batch, lens (2, B) int32: query and key lengths <= T, S):
      items = B * N * ceil(T / 256); non-causal: item t -> pair t % P, head row t // P (consecutive items
      share a head's K / V in L2); causal: the longest pairs first, t -> pair P - 1 - t // (B N), head row
      t % (B N) (longest-processing-time order over the static round robin)
  broadcast_q: the same items; Q (and its scales) are read at batch 0, O and LSE per batch row
  packed (one batch row of S sequences, seqs (6, S) int32 = first query row, first key row, query length,
      key length, first Q scale chunk, first K / V scale chunk; work (2, W) int32 = (sequence, pair) sorted
      longest first, sequence -1 = padding): items = W * N, t -> work entry t // N, head t % N

Every item's addressing is "a sequence in a flattened row space": data rows row0 .. row0 + rows - 1 of the
(rows, heads, H) operand (dense: batch b's rows b T .., rows = T; packed: cu[s] .., rows = the sequence
length), scale chunks chunk0 .. of scale group g (dense: g = b * heads + head, chunk0 = 0; packed: g = head,
chunk0 = the sequence's first chunk). The loads bound their TMA boxes at `rows` (kernels/sm100/
attention_loads.py: rows past it read as zero), the masks use the lengths, the stores stop at `rows`.
Traced inline (the decode is a few integer operations and loads of the tables); the backward's key-tile
items can reuse the sequence addressing (attention_loads.SeqAddr).
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32

from jax_mxfp8.kernels.sm100.attention_fwd_config import ITEM_ROWS, TILE_N
from jax_mxfp8.kernels.sm100.attention_loads import SeqAddr, dense_seq, packed_seq


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
            seq = work[0, entry]
            live = seq >= 0
            s = cutlass.max(seq, Int32(0))
            pair = work[1, entry]
            q_row0, kv_row0 = seqs[0, s], seqs[1, s]
            q_len, kv_len = seqs[2, s], seqs[3, s]
            kv_head = head // group
            q = packed_seq(q_row0, q_len, head, seqs[4, s])
            kv = packed_seq(kv_row0, kv_len, kv_head, seqs[5, s])
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
