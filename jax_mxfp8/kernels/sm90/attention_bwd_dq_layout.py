"""Byte offsets of the Hopper attention backward's dQ staging tile (the TMA dQ stores "tma_warp" /
"tma_writer"; kernels/sm90/attention_bwd_dq_reduce.py), as plain arithmetic on Python ints or CuTe DSL Int32
values (no cutlass import: tests/attention/test_attention_bwd_dq_layout.py checks them on the CPU against the TMA boxes'
layout).

Supported features: the consumer's 64 x 64 float32 dQ accumulator fragment (wgmma M = 64, thread rows
row_in, row_in + 8 with row_in = 16 warp + lane // 4, columns col_in + v0 + 8 nbk with col_in = 2 (lane % 4),
nbk in [0, 8)), head-dim column block blk (64 columns, 16 KB), TMA boxes of 16 rows (each warp's own) x 32
columns (128 bytes), the TMA's 128-byte swizzle.

Layout (bytes, from the 1024-byte aligned staging base): block blk at 16 KB blk; warp w's 4 KB at 4 KB w,
its two boxes (16 rows x 128 bytes) at 2 KB. Inside a box the 16-byte chunk index is XORed with row % 8
(SWIZZLE_128B). For a thread's element: row % 8 = row_in % 8 (lane // 4), row // 8 = 2 w + v1, and the
unswizzled chunk is (col_in >> 2) + 2 (nbk % 4) with no carry (col_in <= 6), so the swizzled chunk is
((col_in >> 2) ^ row % 8) ^ 2 (nbk % 4): a per-thread part (thread_base, x0) once, then trace-time constants
and one XOR per element pair (elem_offset), which keeps 2 registers live instead of 16 addresses.
"""

from __future__ import annotations

BLOCK_BYTES = 16384  # one 64-column block of a consumer's tile (64 rows x 256 bytes)
WARP_BYTES = 4096  # a warp's 16 rows of a block (two boxes)
BOX_BYTES = 2048  # one 16-row x 32-column box


def thread_base(row_in, col_in, blk):
    """(byte offset of this thread's first element pair without the chunk, x0 = its swizzled chunk bits):
    row_in, col_in, blk ints or Int32."""
    r8 = row_in % 8
    base = blk * BLOCK_BYTES + (row_in // 16) * WARP_BYTES + r8 * 128 + (col_in % 4) * 4
    return base, (col_in // 4) ^ r8


def elem_offset(x0, v1: int, nbk: int):
    """Byte offset of the element pair (row_in + 8 v1, col_in + 8 nbk .. + 1) past thread_base's base (v1,
    nbk trace-time ints; x0 from thread_base)."""
    return (v1 * 1024 + (nbk // 4) * BOX_BYTES) + (x0 ^ (2 * (nbk % 4))) * 16
