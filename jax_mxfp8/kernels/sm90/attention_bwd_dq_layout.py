"""Byte offsets of the Hopper attention backward's dQ staging tile (dq_store "tma" / "tma_warp";
kernels/sm90/attention_bwd_dq_reduce.py), as plain arithmetic on Python ints or CuTe DSL Int32 values (no
cutlass import: tests/test_attention_bwd_dq_layout.py checks them on the CPU against the TMA boxes' layout).

Supported features: the consumer's 64 x 64 float32 dQ accumulator fragment (wgmma M = 64, thread rows
row_in, row_in + 8 with row_in = 16 warp + lane // 4, columns col_in + v0 + 8 nbk with col_in = 2 (lane % 4),
nbk in [0, 8)), head-dim column block blk (64 columns, 16 KB), TMA boxes of 32 columns (128 bytes) and 64
rows ("tma") or 16 rows ("tma_warp": each warp's own rows), the TMA's 128-byte swizzle.

Layout (bytes, from the 1024-byte aligned staging base): block blk at 16 KB blk; "tma": its two boxes (64
rows x 128 bytes) at 8 KB, rows at 128 bytes; "tma_warp": warp w's 4 KB at 4 KB w, its two boxes (16 rows x
128 bytes) at 2 KB. Inside a box the 16-byte chunk index is XORed with row % 8 (SWIZZLE_128B). For a
thread's element: row % 8 = row_in % 8 (lane // 4), row // 8 = 2 w + v1, and the unswizzled chunk is
(col_in >> 2) + 2 (nbk % 4) with no carry (col_in <= 6), so the swizzled chunk is
((col_in >> 2) ^ row % 8) ^ 2 (nbk % 4): a per-thread part (thread_base, x0) once, then trace-time constants
and one XOR per element pair (elem_offset), which keeps 2 registers live instead of 16 addresses.
"""

from __future__ import annotations

BLOCK_BYTES = 16384  # one 64-column block of a consumer's tile (64 rows x 256 bytes)


def thread_base(row_in, col_in, blk, warp_boxes: bool):
    """(byte offset of this thread's first element pair without the chunk, x0 = its swizzled chunk bits):
    row_in, col_in, blk ints or Int32; warp_boxes trace-time ("tma_warp")."""
    warp_bytes = 4096 if warp_boxes else 2048  # rows 16 w .. 16 w + 15
    r8 = row_in % 8
    base = blk * BLOCK_BYTES + (row_in // 16) * warp_bytes + r8 * 128 + (col_in % 4) * 4
    return base, (col_in // 4) ^ r8


def elem_offset(x0, v1: int, nbk: int, warp_boxes: bool):
    """Byte offset of the element pair (row_in + 8 v1, col_in + 8 nbk .. + 1) past thread_base's base (v1,
    nbk trace-time ints; x0 from thread_base)."""
    box_bytes = 2048 if warp_boxes else 8192
    return (v1 * 1024 + (nbk // 4) * box_bytes) + (x0 ^ (2 * (nbk % 4))) * 16
