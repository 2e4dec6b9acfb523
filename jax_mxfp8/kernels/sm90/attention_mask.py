"""Causal and length masking of attention score tiles for Hopper (sm_90a) attention kernels.

For the sm_90a attention kernels (forward; the backward recomputes S on the same tiles): how many KV tiles
a query tile visits, and -inf on the S accumulator elements a query may not see. Causal masking is
top-left (query i sees keys j <= i); keys >= kv_len are masked; rows and keys are counted from the
sequence start (tile_scheduler.WorkTile). S is a 64 x tile_n wgmma accumulator fragment
(wgmma_fragment.acc_coords): this thread's rows are row0 and row0 + 8, its columns col_in_tile + v0 + 8 nb.
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
