"""The Blackwell MX GEMM's operand producer (CuTe DSL, sm_100f): MX quantize with the scales in the 128x4 blocked
layout the block-scaled tcgen05 MMA reads, in one pass over x. NOT RUN ON HARDWARE (compiled and checked).

Supported features (kernels/registry/blocked_operands.py): x (G, R, C) row-major bfloat16 / float32, R and C
multiples of 32; per orientation, exactly formats.quantize(x, axis, dtype, scale_rounding) -- the contract's
blocks of 32, no 128-run alignment (the tensor core applies one scale per 32-block of K):
  "row": blocks along C -> data (G, R, C) FP8 (x's layout, K-major for a GEMM contracting C), scale
         (G, ceil(R/128), ceil(C/128), 512) u8: formats/blocked_scales.py's layout of the (R, C/32) scales
  "col": blocks along R, written TRANSPOSED (K-major for a GEMM contracting R) -> data (G, C, R), scale
         (G, ceil(C/128), ceil(R/128), 512) u8: the blocked layout of the (C, R/32) scales
  "both": the four outputs from one read of x.
Host call (2-D row-major views, 16-byte aligned): x (G*R, C), row data (G*R, C), row scale (G, Rt*Ct*512),
col data (G*C, R), col scale (G, Ct*Rt*512) (Rt, Ct = ceil(R/128), ceil(C/128)); "both": (x, row data, row
scale, col data, col scale, stream), "row" / "col": (x, data, scale, stream).

Design: the Hopper producer's (kernels/common/gemm_operands.py, GemmOperands: one CTA of 4 warps per 128 x 128
tile, the same loads, block amaxes, scale rule and FP8 conversions) without the run alignment: every element
is quantized with its own block's scale, and the scale bytes go to the blocked layout, where a CTA's 128 x
128 tile is exactly one 512-byte scale tile per orientation -- byte (r % 32) 16 + (r / 32) 4 + b of tile
(tile row, tile column) for tile-local row r and block b. The CTA's threads write all 512 bytes of its
tiles, padding included: rows at or past R and columns at or past C load as zeros, whose block scale is 0
(never 0xFF, which the next GEMM would multiply with its zero padding into NaN). Data is written only inside
(R, C): row data with the row pitch C, column data (4x4 byte transposes in registers, 16 contiguous bytes of
an output row per lane) with the pitch R.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.common.gemm_operands import _FP8_TYPES, ROWS, TILE, WARPS, GemmOperands
from jax_mxfp8.kernels.registry.blocked_operands import BlockedOperandsConfig

SCALE_TILE_BYTES = 512


class BlockedOperands(GemmOperands):
    """One pass over x (G, R, C): contract MX quantization, "row" and/or "col", scales in the blocked layout."""

    def _output_pair_fakes(self, s):
        """(dtype, shape) of one orientation's (data, scale) in the AOT signature: data (rows, K), scale (G,
        tiles * 512) uint8."""
        return (_FP8_TYPES[self.elem], (s(), s(divisibility=32))), (cutlass.Uint8, (s(), s(divisibility=512)))

    def _dims(self, mX, mRS, mCD):
        """(G, R, C): G is the row scale's rows ("row"/"both"), else R is the column data's width."""
        c = Int32(mX.shape[1])
        if cutlass.const_expr(self.do_row):
            g = Int32(mRS.shape[0])
            r = Int32(mX.shape[0]) // g
        else:
            r = Int32(mCD.shape[1])
            g = Int32(mX.shape[0]) // r
        return g, r, c

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mRD: cute.Tensor, mRS: cute.Tensor, mCD: cute.Tensor, mCS: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, bz = cute.arch.block_idx()
        _, r, c = self._dims(mX, mRS, mCD)
        co = self._coords(tidx, bx, by, bz, r, c, mCD, Int32(0))
        co["tiles"] = (Int64((r + (TILE - 1)) // TILE), Int64((c + (TILE - 1)) // TILE))  # (Rt, Ct)
        self._tile(self._load(mX, co), co, mRD, mRS, mCD, mCS)

    def _tile(self, regs, co, mRD, mRS, mCD, mCS) -> None:
        """One 128 x 128 tile: block scales and factors, the scale bytes, then row by row the FP8 elements
        (the input registers die as it goes) and the transposed column stores."""
        rows = self._row_blocks(regs) if self.do_row else None
        col_bytes, col_factors = self._col_block_scales(regs) if self.do_col else (None, None)
        if self.do_row:
            self._row_scale_bytes(rows, mRS, co)
        if self.do_col:
            self._col_scale_bytes(col_bytes, mCS, co)
        col_words = [[], []]
        for i in range(ROWS):
            if self.do_row:
                self._row_data(regs[i], rows[i], i, mRD, co)
            if self.do_col:
                for u in range(2):
                    words = regs[i][0] if self.bf16 else regs[i][u]
                    col_words[u].append(self._quantize4(words, u, col_factors[4 * u : 4 * u + 4]))
        if self.do_col:
            self._col_store(col_words, mCD, co)

    # ------------------------------------------------------------------------------------------ rows
    def _row_blocks(self, regs) -> list:
        """Per row i of the thread: [(E8M0 byte, factor)] per chunk: the block's amax over the thread's
        elements and a butterfly over the group lanes of its 32-column block, the contract's scale rule."""
        out = []
        for i in range(ROWS):
            blocks = []
            for h in range(self.nch):
                a = self._abs_max(regs[i][h])
                if cutlass.const_expr(self.bf16):
                    a = ptx.max_u32(a & ptx._u32(0xFFFF), a >> 16) << 16  # the larger of the pair, as float32 bits
                s = 1
                while s < self.group:
                    a = ptx.max_u32(a, ptx.shfl_bfly(a, s))
                    s *= 2
                blocks.append(ptx.scale_and_factor(a, self.elem, self.config.scale_rounding))
            out.append(blocks)
        return out

    def _row_data(self, words, blocks, i: int, mRD, co) -> None:
        """Row row0 + i of the row data (G, R, C): 8 bytes (bf16) or 2 x 4 bytes (f32) per lane, inside C."""
        c64 = Int64(co["c"])
        base = mRD.iterator.toint() + (co["g"] * Int64(co["r"]) + Int64(co["row0"] + i)) * c64 + Int64(co["kt"] * TILE)
        for h, (_, f) in enumerate(blocks):
            out = [self._quantize4(words[h], half, [f] * 4) for half in range(2 if self.bf16 else 1)]
            ok = co["row_ok"] & co["col_ok"][h]
            ptx.st_global(base + Int64(co["tcol"][h]), out, pred=ok)

    def _row_scale_bytes(self, rows, mRS, co) -> None:
        """The tile's 128 x 4 row scales: the first lane of each block group writes its block's byte of each
        of its 16 rows (tile-local row r = 32 warp + 16 band + i: byte (r % 32) 16 + warp 4 + block)."""
        rt, ct = co["tiles"]
        tile = mRS.iterator.toint() + ((co["g"] * rt + Int64(co["rt"])) * ct + Int64(co["kt"])) * SCALE_TILE_BYTES
        leader = co["li"] % self.group == 0
        for h in range(self.nch):
            block = co["tcol"][h] // 32
            for i in range(ROWS):
                byte = (co["band"] * 16 + i) * 16 + co["warp"] * 4 + block
                ptx.st_global_u8(tile + Int64(byte), rows[i][h][0], pred=leader)

    # --------------------------------------------------------------------------------------- columns
    def _col_store_ok(self, co, u: int):
        """Column data (G, C, R) is not padded: the thread's columns inside C and its rows inside R."""
        return co["col_ok"][0 if self.bf16 else u] & co["row_ok"]

    def _col_scale_bytes(self, bs, mCS, co) -> None:
        """The tile's column scales: tile (kt, rt) of the (C, R/32) scales in the blocked layout; the thread's
        column cl (tile-local) and row block `warp` is byte (cl % 32) 16 + (cl / 32) 4 + warp. Band 0 writes
        (band 1 holds the same bytes)."""
        rt, ct = co["tiles"]
        tile = mCS.iterator.toint() + ((co["g"] * ct + Int64(co["kt"])) * rt + Int64(co["rt"])) * SCALE_TILE_BYTES
        for tc in range(8):
            cl = self._tile_col(co, tc)
            byte = (cl % 32) * 16 + (cl // 32) * 4 + co["warp"]
            ptx.st_global_u8(tile + Int64(byte), bs[tc], pred=co["band"] == 0)


def make_kernel(config: BlockedOperandsConfig) -> BlockedOperands:
    return BlockedOperands(config)


__all__ = ["WARPS", "BlockedOperands", "make_kernel"]
