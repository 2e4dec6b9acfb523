"""The epilogues of the Blackwell MX GEMM (kernels/sm100/mx_gemm.py): one accumulator tile, TMEM -> global.

Each of the 128 epilogue threads owns one row of the CTA's 128 x tile_n accumulator (TMEM lane 32 w + lane of
warp w) and walks it in 32-column chunks (tcgen05.ld 32x32b.x32, one chunk = one MX block along N). Per chunk,
from ONE read of TMEM:

  y = acc (+ bias[n])                                           float32 (IEEE adds)
  c = y in out_dtype                                            plain, or store_pre      (16-byte stores)
  z = gelu_tanh(y) (activation "gelu") or y
  row:  q[row, n0:n0+32], s[row, n0/32] = quantize of the thread's 32 values       (2 16-byte stores;
        the tile's 4 scale bytes of a row are adjacent in the blocked layout: one 4-byte store per row)
  col:  the warp's 32 rows x the chunk's 32 columns are 32 blocks along M; the warp transposes them
        through shared memory so that lane l owns column n0 + l and quantizes it like a row block (a
        thread-local amax), then writes qc[n, rows] (32 contiguous bytes of the transposed output, two
        16-byte stores) and sc[n, row/32] (config.column_amax "redux", the comparison schedule: one
        warp-wide REDUX per column instead, bytes transposed afterwards)

Blocked scales (formats/blocked_scales.py): a CTA tile (128 rows x 128 columns) is exactly one 128x4 scale
tile of s (rows, N/32 blocks) and one of sc (N rows, M/32 blocks), so the tile's threads write every byte of
their scale tiles, padding included: 0 for rows at or past M and for columns at or past N (a padded scale
must never be 0xFF: the next GEMM multiplies it by its zero K padding). Data is written only inside (M, N).
The accumulator buffer is released (tcgen05.fence::before_thread_sync, then every epilogue thread arrives)
right after the last chunk's TMEM load, before that chunk's arithmetic and stores.

Never run on a Blackwell GPU: compiled and checked statically (tools/check_sm100.py).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.common.fp32_math import gelu_tanh_f32
from jax_mxfp8.kernels.registry.gemm_sm100 import (
    COL_PITCH,
    COL_SCALES,
    COLUMN_SMEM_PER_WARP,
    CTA_ROWS,
    TRANSPOSE_PITCH,
    MXGemmSm100Config,
)
from jax_mxfp8.kernels.sm100 import epilogue_quantize as eq

CHUNK = eq.CHUNK
SCALE_TILE_BYTES = 512

OUT_BYTES = {"bfloat16": 2, "float32": 4}


class EpilogueTile:
    """The per-tile epilogue of one variant. Built at trace time from the config; `run` is called by every
    epilogue thread for every work tile."""

    def __init__(self, config: MXGemmSm100Config):
        self.cfg = config
        assert config.tile_n == 4 * CHUNK, "one 128x4 scale tile per CTA tile (tile_n 128)"
        self.chunks = config.tile_n // CHUNK

    def run(self, taddr: Uint32, warp: Int32, lane: Int32, tile, outs: dict, dims, release) -> None:
        """Epilogue of one tile. taddr: TMEM address of this accumulator buffer's column 0, lane 0; warp,
        lane: the thread's epilogue warp (0..3) and lane; tile: GemmTile (g, 128-row tile, N tile); outs:
        output name -> Int64 base address (c, q, s, qc, sc, bias), and "stage": the Int32 shared address of
        the column staging tiles (col / rowcol); dims: (M, N) Int32; release(): frees the accumulator
        buffer (called once, by every thread, after the last TMEM load)."""
        cfg = self.cfg
        m, n = dims
        row = tile.m_tile * CTA_ROWS + 32 * warp + lane  # row of the batch
        live = tile.m_tile * CTA_ROWS < m  # a pair's second CTA may hold no rows at all
        row_ok = row < m
        row64 = Int64(tile.g) * Int64(m) + Int64(row)  # row of the (G*M, N) outputs
        lane_addr = taddr + (Uint32(32 * warp) << Uint32(16))
        row_bytes = []
        for j in range(self.chunks):
            col0 = tile.n_tile * cfg.tile_n + CHUNK * j
            chunk_ok = col0 < n
            vals = eq.tmem_load_row32(lane_addr + Uint32(CHUNK * j))
            if cutlass.const_expr(j == self.chunks - 1):
                release()
            if cutlass.const_expr(cfg.has_bias):
                vals = eq.add_bias(vals, outs["bias"] + Int64(col0) * 4, chunk_ok)
            if cutlass.const_expr(cfg.writes_c):
                width = OUT_BYTES[cfg.out_dtype]
                addr = outs["c"] + (row64 * Int64(n) + Int64(col0)) * width
                eq.store_words(addr, eq.pack_out(vals, cfg.out_dtype), row_ok & chunk_ok)
            z = vals
            if cutlass.const_expr(cfg.activation == "gelu"):
                z = [gelu_tanh_f32(v) for v in vals]
            if cutlass.const_expr(cfg.epilogue in ("row", "rowcol")):
                b, words = eq.row_block_quantize(z)
                eq.store_words(outs["q"] + row64 * Int64(n) + Int64(col0), words, row_ok & chunk_ok)
                row_bytes.append(eq.select_u32(row_ok & chunk_ok, b, Uint32(0)))
            if cutlass.const_expr(cfg.epilogue in ("col", "rowcol")):
                self._column_chunk(z, outs, tile, warp, lane, row, row_ok, live, j, col0, chunk_ok, dims)
        if cutlass.const_expr(cfg.epilogue in ("row", "rowcol")):
            addr = self._row_scale_addr(outs["s"], tile, warp, lane, dims)
            ptx.st_global(addr, [eq.pack_bytes(row_bytes)], pred=live)

    def _row_scale_addr(self, base: Int64, tile, warp: Int32, lane: Int32, dims) -> Int64:
        """s (G, ceil(M/128) * ceil(N/128), 512): the 4 bytes of this row's blocks n_tile * 4 .. + 3, i.e.
        tile (m_tile, n_tile) byte lane * 16 + warp * 4 (rows r: (r % 32) 16 + ((r % 128) // 32) 4)."""
        m, n = dims
        tr, tc = (m + CTA_ROWS - 1) // CTA_ROWS, (n + 127) // 128
        t = (Int64(tile.g) * Int64(tr) + Int64(tile.m_tile)) * Int64(tc) + Int64(tile.n_tile)
        return base + t * SCALE_TILE_BYTES + Int64(16 * lane + 4 * warp)

    def _column_chunk(self, z, outs, tile, warp, lane, row, row_ok, live, j: int, col0, chunk_ok, dims) -> None:
        """The column orientation of one 32 x 32 block: the warp's 32 rows (lane l holds row l) x the chunk's
        32 columns. Either way, lane l ends up writing column col0 + l: its 32 E4M3 bytes (the block's rows,
        contiguous in the transposed qc) in two 16-byte stores and its scale byte."""
        m, n = dims
        ok = row_ok & chunk_ok  # M % 32 == 0: a warp's rows are all inside M or all outside
        stage = outs["stage"] + Int32(warp * COLUMN_SMEM_PER_WARP[self.cfg.column_amax])
        if cutlass.const_expr(self.cfg.column_amax == "transpose"):
            scale, words = self._transposed_block(z, stage, lane)
        else:
            scale, words = self._redux_block(z, stage, lane)
        # qc (G, N, M): row n = col0 + lane, the block's 32 rows from tile.m_tile * 128 + 32 * warp
        qrow = Int64(tile.g) * Int64(n) + Int64(col0 + lane)
        addr = outs["qc"] + qrow * Int64(m) + Int64(tile.m_tile * CTA_ROWS + 32 * warp)
        eq.store_words(addr, words, ok)
        # sc (G, ceil(N/128) * ceil(M/128), 512): row n = col0 + lane, block m_tile * 4 + warp
        trn, tcm = (n + 127) // 128, (m + CTA_ROWS - 1) // CTA_ROWS
        t = (Int64(tile.g) * Int64(trn) + Int64(tile.n_tile)) * Int64(tcm) + Int64(tile.m_tile)
        addr = outs["sc"] + t * SCALE_TILE_BYTES + Int64(16 * lane + 4 * j + warp)
        ptx.st_global_u8(addr, eq.select_u32(ok, scale, Uint32(0)), pred=live)

    def _transposed_block(self, z, stage, lane):
        """column_amax "transpose": lane l writes its row into a [32][33] float32 tile, reads column l back
        (both conflict-free: the odd pitch), and quantizes it as a row block (a thread-local amax)."""
        for c in range(CHUNK):
            ptx.st_shared_b32(stage + (lane * TRANSPOSE_PITCH + c) * 4, z[c])
        cute.arch.sync_warp()
        column = [ptx.ld_shared_b32(stage + (r * TRANSPOSE_PITCH + lane) * 4) for r in range(CHUNK)]
        cute.arch.sync_warp()  # the next chunk rewrites the tile
        return eq.row_block_quantize(column)

    def _redux_block(self, z, stage, lane):
        """column_amax "redux": per 4 columns, 4 warp-wide amaxes (REDUX.MAX.U32), their scales and factors,
        one quantize4 word whose bytes go to a [column][row] E4M3 staging tile (COL_PITCH bytes per
        column), and the 4 scale bytes (the same in every lane) beside it; lane l then reads column l."""
        for c4 in range(0, CHUNK, 4):
            scale_bytes, factors = eq.column_block_scales(z[c4 : c4 + 4])
            word = eq.column_block_quantize(z[c4 : c4 + 4], factors)
            for i in range(4):
                ptx.st_shared_u8(stage + Int32((c4 + i) * COL_PITCH) + lane, eq.byte_of(word, i))
            ptx.st_shared_b32(stage + Int32(COL_SCALES + c4), eq.pack_bytes(scale_bytes))
        cute.arch.sync_warp()
        mine = stage + lane * COL_PITCH
        data = [*ptx.ld_shared_v4(mine), *ptx.ld_shared_v4(mine + 16)]
        scale = ptx.ld_shared_u8(stage + Int32(COL_SCALES) + lane)
        cute.arch.sync_warp()  # the next chunk rewrites the staging tile
        return scale, data


def make_release(acc_pipeline, acc_state):
    """The epilogue's release of an accumulator buffer: order the TMEM loads before the arrive."""

    def release():
        cute.arch.fence_view_async_tmem_load()
        acc_pipeline.consumer_release(acc_state)

    return release
