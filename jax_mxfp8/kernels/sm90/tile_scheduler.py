"""Work-item decode for Hopper (sm_90a) kernels: which tile a CTA runs.

The GEMMs' persistent schedule (sm90 and sm100 MX GEMMs) is kernels/common/gemm_schedule.py.

Attention forward (kernels/sm90/attention_fwd.py): one CTA per work tile, a 128-row (CTA_M) query tile of
one query head against its KV head, in one of two schedules:
  DenseTileScheduler   grid (Tp / CTA_M, B * N): padded batches, per-batch lengths lens (2, B) int32
                       (query lengths, KV lengths); causal runs the last (longest) query tiles first
  PackedTileScheduler  grid (W, N): packed jagged sequences in one batch row; per sequence
                       seqs (4, S) int32 = (first query tile, first KV tile, query length, KV length), and a
                       work list work (2, W) int32 = (sequence, query tile inside it), sequence -1 = no work
Both give a WorkTile whose tile index, lengths and masks are relative to the sequence and whose qt0 / kt0
locate the sequence in the operands, so the CTA body is the same code for both. Plain Python (traced
inline): the caller branches on WorkTile.live (a run-time Boolean for packed, Python True for dense).

Attention backward (kernels/sm90/attention_bwd.py): KeyTileScheduler, one CTA per 128-key tile of one KV
head (grid (Sp / 128, B * K), packed (Sp / 128, K)), which visits the 64-row query tiles of every query head
of its group that can see the tile (KeyTile; the range comes from attention_mask.AttentionMask.
query_tile_range): dense padded batches with lens (2, B) as the forward's, or packed sequences with the
forward's seqs table and a work list of the same form whose items are the aligned layout's key tiles in
order (item n = key tile n: (its sequence, key tile inside it), (-1, 0) for a tile in no sequence, whose dk,
dv rows are written 0). Packed rows stay global in the aligned layout; the causal mask is offset by the
sequence's KV-to-query row shift. kernels/common/packed_sequences.packed_item is the one decode of a
work-list item both use (and the Blackwell kernels).
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from jax_mxfp8.kernels.common.packed_sequences import SEQ_TILE, packed_item


class WorkTile(NamedTuple):
    """One CTA's work (DSL Int32 values unless noted)."""

    m_tile: Int32  # query tile (CTA_M rows) counted from the sequence start
    bn: Int32  # query head row of the per-head operands: b * N + n (packed: n)
    bkv: Int32  # its KV head row: b * K + n // (N / K) (GQA/MQA)
    q_len: Int32  # valid query rows of the sequence
    kv_len: Int32  # valid keys of the sequence
    qt0: Int32 | int  # the sequence's first query tile in the operands (0 for a dense batch)
    kt0: Int32 | int  # the sequence's first KV tile in the operands (0 for a dense batch)
    live: cutlass.Boolean | bool  # False: a padding item past the end of the packed work list


class DenseTileScheduler:
    """Padded batch: block (x, y) = (query tile, b * N + n); grid x = Tp / CTA_M."""

    def __init__(self, causal: bool):
        self.causal = causal

    def work_tile(self, lens: cute.Tensor, q_heads: Int32, kv_heads: Int32) -> WorkTile:
        """lens (2, B) int32: query and KV length per batch; q_heads = B * N, kv_heads = B * K rows."""
        bx, by, _ = cute.arch.block_idx()
        gx, _, _ = cute.arch.grid_dim()
        # Longest rows first under causal masking: the last query tiles have the most KV tiles.
        m_tile = gx - 1 - bx if self.causal else bx
        bn = by
        n_heads = q_heads // lens.shape[1]
        n_kv = kv_heads // lens.shape[1]
        b = bn // n_heads
        bkv = b * n_kv + (bn % n_heads) // (n_heads // n_kv)
        return WorkTile(m_tile, bn, bkv, lens[0, b], lens[1, b], 0, 0, True)


class PackedTileScheduler:
    """Packed sequences: block (x, y) = (work item, head n); grid x = W (items, longest first)."""

    def work_tile(self, work: cute.Tensor, seqs: cute.Tensor, q_heads: Int32, kv_heads: Int32) -> WorkTile:
        """work (2, W), seqs (4, S) int32 as in the module docstring; q_heads = N, kv_heads = K rows."""
        bx, by, _ = cute.arch.block_idx()
        it = packed_item(work, seqs, bx)
        bn = by
        bkv = by // (q_heads // kv_heads)
        return WorkTile(it.tile, bn, bkv, it.q_len, it.kv_len, it.q_tile0, it.kv_tile0, it.live)


class KeyTile(NamedTuple):
    """One backward CTA's work: key tile n (CTA_N keys) of KV head row bk against query tiles m_start ..
    m_start + n_m - 1 (TILE_M rows each) of each of the group's query heads bn0 .. bn0 + group - 1, taken
    head-major: loop step it is (head it // n_m, query tile m_start + it % n_m). DSL Int32 values unless
    noted; rows and tiles are global in the operands (packed: a sequence's rows in the aligned layout)."""

    n: Int32  # key tile
    bk: Int32  # KV head row: b * K + kv (packed: kv)
    bn0: Int32  # the group's first query head row: bk * group (query head n of batch b is b * N + n)
    group: Int32  # query heads per KV head
    q_len: Int32  # end of the valid query rows (dense: the batch row's query length)
    kv_len: Int32  # end of the valid keys
    m_start: Int32  # first query tile visited
    n_m: Int32  # query tiles visited per head (0: none)
    steps: Int32  # loop steps: group * n_m
    shift: Int32 | None  # packed: first KV row - first query row of the sequence (None for a dense batch)

    def step(self, it: Int32, tile_m: int) -> tuple[Int32, Int32, Int32]:
        """(query tile m, query head row bn, first query row q0) of loop step it."""
        g = it // self.n_m
        m = self.m_start + it - g * self.n_m
        return m, self.bn0 + g, m * tile_m


class KeyTileScheduler:
    """The backward's schedule: block (x, y) = (key tile, KV head row); grid (Sp / CTA_N, B * K) dense,
    (Sp / CTA_N, K) packed (CTA_N = SEQ_TILE). `mask` (an AttentionMask over TILE_M-row query tiles and
    CTA_N-key tiles) gives the query tiles a key tile visits."""

    def __init__(self, mask, packed: bool):
        self.mask = mask
        self.packed = packed

    def work_tile(self, lens: cute.Tensor, work, q_heads: Int32, kv_heads: Int32) -> KeyTile:
        """lens: (2, B) int32 query and KV lengths (dense), or for packed the seqs (4, S) table (first query
        tile, first KV tile, query length, KV length per sequence) with work (2, Sp / CTA_N) its key-tile
        items in key-tile order (None dense). q_heads = B * N rows of the per-query-head operands (LSE),
        kv_heads = B * K."""
        n, bk, _ = cute.arch.block_idx()
        if self.packed:
            group = q_heads // kv_heads
            it = packed_item(work, lens, n)  # item n is key tile n
            q_row0, kv_row0 = it.q_tile0 * SEQ_TILE, it.kv_tile0 * SEQ_TILE
            q_len = q_row0 + it.q_len
            kv_len = cutlass.select_(it.live, kv_row0 + it.kv_len, Int32(0))  # no sequence: no key, dk, dv rows 0
            shift = kv_row0 - q_row0
        else:
            nb = lens.shape[1]
            n_kv = kv_heads // nb  # KV heads per batch row
            group = q_heads // kv_heads
            b = bk // n_kv
            q_len = lens[0, b]
            kv_len = lens[1, b]
            q_row0, shift = None, None
        m_start, n_m = self.mask.query_tile_range(n, q_row0, q_len, kv_len, shift)
        steps = group * n_m
        bn0 = bk * group
        return KeyTile(n, bk, bn0, group, q_len, kv_len, m_start, n_m, steps, shift)
