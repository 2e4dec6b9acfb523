"""The dQ staging offsets of the Hopper attention backward's TMA dQ stores (dq_store "tma_warp" / "tma_writer";
kernels/sm90/attention_bwd_dq_layout.py), on the CPU: every element of a consumer's 64 x 64 float32 dQ
fragment lands where the TMA tensor reduce-add reads it -- its (row, column) in a (16 rows x 32 columns) box
with the 128-byte swizzle -- and the 128 threads' 4096 elements cover the 16 KB block exactly once.

The model here is independent of the kernel's derivation: the wgmma m64nNk16 float32 accumulator fragment
(PTX ISA: thread t holds rows 16 (t // 32) + (t % 32) // 4 + 8 v1, columns 2 (t % 4) + v0 + 8 nbk) and the
TMA SWIZZLE_128B rule (16-byte chunk index XOR address bits 7-9, from a 1024-byte aligned box base).
"""

from __future__ import annotations

import pytest

from jax_mxfp8.kernels.sm90 import attention_bwd_dq_layout as dq_layout


def _swizzle_128b(offset: int) -> int:
    return offset ^ (((offset >> 7) & 7) << 4)


def _tma_offset(row: int, col: int, blk: int) -> int:
    """Where the TMA box (16 rows x 32 float32 columns, 128-byte rows, swizzled) holds dQ[row, 64 blk + col]:
    block blk's warp w at (4 blk + w) 4 KB, its two boxes at 2 KB."""
    box, cc = col // 32, col % 32
    return (4 * blk + row // 16) * 4096 + box * 2048 + _swizzle_128b((row % 16) * 128 + cc * 4)


@pytest.mark.parametrize("blk", [0, 1])
def test_staging_offsets_match_the_tma_boxes(blk):
    seen = {}
    for t in range(128):
        row_in, col_in = 16 * (t // 32) + (t % 32) // 4, 2 * (t % 4)
        base, x0 = dq_layout.thread_base(row_in, col_in, blk)
        for v1 in range(2):
            for nbk in range(8):
                pair = base + dq_layout.elem_offset(x0, v1, nbk)
                for v0 in range(2):
                    row, col = row_in + 8 * v1, col_in + v0 + 8 * nbk
                    got = pair + 4 * v0
                    assert got == _tma_offset(row, col, blk), (t, v1, nbk, v0)
                    assert got not in seen, f"thread {t} element ({row}, {col}) overwrites {seen.get(got)}"
                    seen[got] = (row, col)
    lo = blk * dq_layout.BLOCK_BYTES
    assert sorted(seen) == list(range(lo, lo + dq_layout.BLOCK_BYTES, 4))


def test_a_warps_store_is_conflict_free():
    """One STS.64 of a warp (fixed v1, nbk): 8 rows x 32 bytes on distinct 16-byte chunk pairs, so each
    4-byte bank is hit by exactly two of the 64 words (2 wavefronts, the minimum for 256 bytes)."""
    for v1 in range(2):
        for nbk in range(8):
            banks = {}
            for lane in range(32):
                base, x0 = dq_layout.thread_base(lane // 4, 2 * (lane % 4), 0)
                pair = base + dq_layout.elem_offset(x0, v1, nbk)
                for w in (pair, pair + 4):
                    banks[(w // 4) % 32] = banks.get((w // 4) % 32, 0) + 1
            assert sorted(banks.values()) == [2] * 32, (v1, nbk)
