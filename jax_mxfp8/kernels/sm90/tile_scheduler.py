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
dv rows are written 0; causal: sorted longest first, below). Packed rows stay global in the aligned layout;
the causal mask is offset by the sequence's KV-to-query row shift. kernels/common/packed_sequences.packed_item
is the one decode of a work-list item both use (and the Blackwell kernels).

Launch order and the causal backward. The block scheduler hands out CTAs in linear block order, x fastest,
then y (CUDA does not document it, but every H100 / H200 launch does so, and FA3's and CUTLASS's rasterisers
rely on it): block (x, y) is launch number y * grid_x + x. With block (x, y) = (key tile, KV head) that is
head by head, key tiles ascending within a head. Under (top-left) causal masking key tile n visits the query
tiles from its diagonal (2n) on, so within a head the order is already longest first (tile 0 runs all Tp / 64
query tiles, the last one 2), but over the grid it is a sawtooth: the last head's long tiles start in the
last wave, next to short ones, and leave SMs idle at the end (up to a longest tile's time: Tp / 64 steps of a
~B K Tp^2 / (2 * 64 * 128 * SMs) steps per SM). So the causal variants decode the launch number instead
(_longest_first): in sections of hs KV heads (all of them unless their Q and dO outgrow the L2 budget,
SECTION_BYTES), key tiles ascending on the slow axis and the section's heads on the fast one: every head's
tile 0, then every head's tile 1, ...; the grid's last CTAs are its shortest tiles. The sections keep the
query rows that concurrently running CTAs re-read inside L2 (a section of hs heads reads hs * Tp * G query
rows; the dense order read ~SMs / (Sp / 128) heads at a time). The packed causal work list is sorted by work
(query tiles visited) host-side (primitives/attention_packed.key_tile_work), its items then decoded the same
way. Within a head the key tiles stay ascending, so the deterministic dQ mode's wait on lower key tiles of
the same head still never waits on a later-launched CTA. Non-causal tiles all do the same work: the grid order
is kept.
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


SECTION_BYTES = 32 << 20
"""L2 budget of one causal section's Q and dO (16-bit copies: 4 H bytes per query row); hs = the KV heads whose
G Tp query rows fit it (at least 1, at most all)."""


class KeyTileScheduler:
    """The backward's schedule: block (x, y) = (key tile, KV head row); grid (Sp / CTA_N, B * K) dense,
    (Sp / CTA_N, K) packed (CTA_N = SEQ_TILE). `mask` (an AttentionMask over TILE_M-row query tiles and
    CTA_N-key tiles) gives the query tiles a key tile visits. Causal: the launch number decoded longest first
    (module docstring); head_dim sizes the L2 sections."""

    def __init__(self, mask, packed: bool, head_dim: int):
        self.mask = mask
        self.packed = packed
        self.section_rows = SECTION_BYTES // (4 * head_dim)

    def _longest_first(self, rows_per_head: Int32) -> tuple[Int32, Int32]:
        """(key tile or work item, KV head row) of this CTA's launch number y * grid_x + x: sections of hs
        heads (section_rows // rows_per_head, at least 1; the last section may hold fewer), each item-major
        (item i of the section's heads in turn, i ascending)."""
        bx, by, _ = cute.arch.block_idx()
        gx, gy, _ = cute.arch.grid_dim()
        launch = by * gx + bx
        hs = cutlass.min(cutlass.max(Int32(self.section_rows) // rows_per_head, Int32(1)), gy)
        base = launch // (hs * gx) * hs  # the section's first head
        heads = cutlass.min(hs, gy - base)
        local = launch - base * gx
        item = local // heads
        return item, base + local - item * heads

    def work_tile(self, lens: cute.Tensor, work, q_heads: Int32, kv_heads: Int32, q_rows: Int32) -> KeyTile:
        """lens: (2, B) int32 query and KV lengths (dense), or for packed the seqs (4, S) table (first query
        tile, first KV tile, query length, KV length per sequence) with work (2, Sp / CTA_N) its key-tile
        items (None dense): in key-tile order, or causal longest first with a padding item's tile its global
        key tile. q_heads = B * N rows of the per-query-head operands (LSE), kv_heads = B * K, q_rows = Tp."""
        n, bk, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.mask.causal):
            n, bk = self._longest_first(q_rows * (q_heads // kv_heads))
        if self.packed:
            group = q_heads // kv_heads
            it = packed_item(work, lens, n)  # item n; key tile n unless causal
            if cutlass.const_expr(self.mask.causal):
                n = cutlass.select_(it.live, it.kv_tile0 + it.tile, it.tile)
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
