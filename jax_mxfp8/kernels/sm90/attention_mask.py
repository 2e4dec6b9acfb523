"""Causal and length masking of attention score tiles for Hopper (sm_90a) attention kernels.

Causal masking is top-left (query i sees keys j <= i); keys >= kv_len and queries >= q_len are masked.
Forward (kernels/sm90/attention_fwd.py): how many KV tiles a query tile visits (kv_tile_count) and -inf on
the S accumulator elements a query may not see (apply); rows and keys are counted from the sequence start
(tile_scheduler.WorkTile). S is a 64 x tile_n wgmma accumulator fragment (wgmma_fragment.acc_coords): this
thread's rows are row0 and row0 + 8, its columns col_in_tile + v0 + 8 nb.
Backward (kernels/sm90/attention_bwd.py), the transposed view: which query tiles a key tile visits
(query_tile_range, for tile_scheduler.KeyTileScheduler) and 0 on the P^T accumulator elements (keys x
queries: this thread's keys key0, key0 + 8, its queries qcol0 + v0 + 8 nb) a query may not see
(apply_transposed). Its rows are global; a packed sequence's causal mask compares key - (its first KV row)
with query - (its first query row), i.e. key <= query + shift.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords


class AttentionMask:
    """Masks for query tiles of cta_m rows against KV tiles of tile_n keys (trace-time parameters)."""

    def __init__(self, causal: bool, cta_m: int, tile_n: int):
        self.causal = causal
        self.cta_m = cta_m
        self.tile_n = tile_n

    @cute.jit
    def kv_tile_count(self, m_tile: Int32, q_len: Int32, kv_len: Int32) -> Int32:
        """KV tiles query tile m_tile visits: those holding any valid key (and, causal, any key <= its rows);
        0 for a tile past q_len under causal masking."""
        n = (kv_len + (self.tile_n - 1)) // self.tile_n
        if cutlass.const_expr(self.causal):
            last_row = cutlass.min(m_tile * self.cta_m + self.cta_m, q_len) - 1
            n_causal = Int32(0)
            if last_row >= 0:
                n_causal = last_row // self.tile_n + 1
            n = cutlass.min(n, n_causal)
        return n

    @cute.jit
    def apply(self, acc_s, j: Int32, m_tile: Int32, row0: Int32, col_in_tile: Int32, kv_len: Int32):
        """acc_s (64 x tile_n float32 accumulator of KV tile j) gets -inf where the key is >= kv_len or, causal,
        after the row. Only tiles that straddle a boundary run the per-element selects (a run-time branch)."""
        col_base = j * self.tile_n + col_in_tile
        need_mask = (j + 1) * self.tile_n > kv_len
        if cutlass.const_expr(self.causal):
            need_mask = need_mask | ((j + 1) * self.tile_n > m_tile * self.cta_m + 1)
        if need_mask:
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                v0, v1, nb = acc_coords(i)
                col = col_base + v0 + 8 * nb
                bad = col >= kv_len
                if cutlass.const_expr(self.causal):
                    bad = bad | (col > row0 + 8 * v1)
                acc_s[i] = cutlass.select_(bad, -Float32.inf, acc_s[i])

    @cute.jit
    def query_tile_range(self, n: Int32, q_row0, q_len: Int32, kv_len: Int32, shift) -> tuple[Int32, Int32]:
        """(first query tile, number of query tiles) of cta_m rows that key tile n (tile_n keys) visits: from
        the sequence's first query row q_row0 (None: a dense batch row, 0) or, causal, from the first tile
        holding a query that sees the key tile's first key, to the tile holding row q_len - 1; none when the
        key tile holds no key < kv_len. shift: the packed causal offset (key <= query + shift), None dense."""
        if cutlass.const_expr(shift is None):
            m_start = Int32(0)
            if cutlass.const_expr(self.causal):
                m_start = n * (self.tile_n // self.cta_m)
        else:
            m_start = q_row0 // self.cta_m
            if cutlass.const_expr(self.causal):
                m_start = (n * self.tile_n - shift) // self.cta_m
        n_m = (q_len + (self.cta_m - 1)) // self.cta_m - m_start
        if n * self.tile_n >= kv_len:
            n_m = Int32(0)
        if n_m < 0:
            n_m = Int32(0)
        return m_start, n_m

    @cute.jit
    def apply_transposed(self, acc, n: Int32, m: Int32, key0: Int32, qcol0: Int32, q_len: Int32, kv_len: Int32, shift):
        """acc (P^T of key tile n and query tile m: a 64 keys x cta_m queries accumulator fragment, this thread's
        keys key0 + 8 v1, queries qcol0 + v0 + 8 nb) gets 0 where the key is >= kv_len, the query >= q_len or,
        causal, the key after the query (+ shift: packed). Only tiles that straddle a boundary run the
        per-element selects (a run-time branch)."""
        need = ((n + 1) * self.tile_n > kv_len) | ((m + 1) * self.cta_m > q_len)
        if cutlass.const_expr(self.causal):
            if cutlass.const_expr(shift is not None):
                need = need | (m * self.cta_m + shift < (n + 1) * self.tile_n)
            else:
                need = need | (m * self.cta_m < (n + 1) * self.tile_n)
        if need:
            for i in cutlass.range_constexpr(cute.size(acc)):
                v0, v1, nbk = acc_coords(i)
                key = key0 + 8 * v1
                query = qcol0 + v0 + 8 * nbk
                bad = (key >= kv_len) | (query >= q_len)
                if cutlass.const_expr(self.causal):
                    if cutlass.const_expr(shift is not None):
                        query = query + shift
                    bad = bad | (key > query)
                acc[i] = cutlass.select_(bad, Float32(0.0), acc[i])
