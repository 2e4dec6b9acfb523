"""The float32 dQ reductions of the Hopper attention backward (kernels/sm90/attention_bwd.py): each consumer's
dQ tile (64 query rows x its head-dim columns, float32 wgmma accumulator) times tau, added into dq.

Supported features (AttentionBwdConfig.dq_store and dq_red_width; dq_accum "fp32", not deterministic --
the other dQ modes are kernels/sm90/attention_bwd_dq.py's, dispatched from _store_dq):
  "red"   red.global.add from the registers: dq_red_width 1 (.f32 per element), 2 (.v2.f32, a thread's two
          adjacent columns), 4 (.v4.f32 after a lane-pair exchange)
  "bulk"  the tile staged in shared memory (rows padded by 32 bytes), then one 256-byte
          cp.reduce.async.bulk .add.f32 per row from warp 0 (two rows per lane); in two parts for overlap
  "tma"   the tile staged in a 128-byte-swizzled float32 tile (the layout of the TMA tensor map's (64, 32)
          boxes on dq), then one cp.reduce.async.bulk.tensor .add per consumer and tile (its 64 columns),
          issued by warp 0's elected lane after the consumer's barrier; no overlap, dq_keys "cta" only
  "tma_warp"  the same with (16, 32) boxes: each warp reduces its own 16 rows after a __syncwarp (no
          barrier across the consumer's warps); dq_keys "cta" or "own" (each consumer's two 64-column
          halves at H128 staged in turn in its own block)
Rows >= q_len are never added ("tma" adds +0.0 to the rows q_len .. Tp - 1 of a tile that crosses q_len:
the zero-filled dq stays +0.0 there). A mixin of AttentionBackwardSm90 (it reads self.config, self.h, ...).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.sm90 import attention_bwd_dq_layout as dq_layout
from jax_mxfp8.kernels.sm90 import warp_specialization as ws
from jax_mxfp8.kernels.sm90.attention_bwd_blocks import (
    DQ_BARRIER0,
    DQ_EMPTY_BARRIER,
    DQ_FULL_BARRIER,
    NUM_CONSUMERS,
    TILE_M,
    bulk_commit,
    bulk_reduce_add_f32,
    bulk_wait,
    bulk_wait_read,
    red_add_f32,
    red_add_v2_f32,
    red_add_v4_f32,
    st_shared_v2_f32,
    tma_tile_partition,
)
from jax_mxfp8.kernels.sm90.attention_bwd_dq import store_dq_mode
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords


class AttentionBwdDqReduce:
    """dQ's float32 stores (mixin of AttentionBackwardSm90)."""

    @cute.jit
    def _store_dq(
        self, acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, col0, col_in, q_len, scale, c, warp_wg, lane,
        part: str = "all",
    ):  # fmt: skip
        """dq[bn, q0 + row, col0 + col] += tau * acc_dq for this consumer's dQ tile (64 rows, 64 head-dim
        columns from col0; rows >= q_len skipped), by dq_store: "red" (per element) or "bulk" (the tile
        staged in shared memory, then one 256-byte bulk reduction per row, two rows per lane of warp 0).
        "bulk" in two parts (trace-time `part`): "stage" (registers -> staging tile), "issue" (the bulk
        reductions); "all" both."""
        if cutlass.const_expr(self.dq_mode):
            sem_base, dq_scale = self.dq_extra
            store_dq_mode(
                self.config, acc_dq, dq_base, sem_base, bn, tp, q0 + row_in, col0 + col_in, q0, q_len, dq_scale, c,
                warp_wg * 32 + lane, DQ_BARRIER0 + c,
            )  # fmt: skip
        elif cutlass.const_expr(self.tma_dq):
            self._reduce_dq_tma(acc_dq, sdq_base, bn, q0, row_in, col0, col_in, q_len, scale, c, warp_wg)
        elif cutlass.const_expr(not self.bulk_dq):
            self._add_dq(acc_dq, dq_base, bn, tp, q0 + row_in, col0 + col_in, q_len, scale)
        else:
            bar = DQ_BARRIER0 + c
            if cutlass.const_expr(part != "issue"):
                if warp_wg == 0:
                    bulk_wait_read()  # the previous tile's reductions have read the staging tile
                cute.arch.barrier(barrier_id=bar, number_of_threads=ws.WARPGROUP_THREADS)
                for i in cutlass.range_constexpr(0, cute.size(acc_dq), 2):
                    _, v1, nbk = acc_coords(i)
                    addr = sdq_base + (row_in + 8 * v1) * self.dq_pitch + (col0 + col_in + 8 * nbk) * 4
                    st_shared_v2_f32(addr, acc_dq[i] * scale, acc_dq[i + 1] * scale)
                cute.arch.fence_view_async_shared()
        if cutlass.const_expr(self.bulk_dq and part != "stage"):
            bar = DQ_BARRIER0 + c
            cute.arch.barrier(barrier_id=bar, number_of_threads=ws.WARPGROUP_THREADS)
            if warp_wg == 0:
                for rr in cutlass.range_constexpr(TILE_M // 32):
                    r = lane + 32 * rr
                    if q0 + r < q_len:
                        dst = dq_base + ((Int64(bn) * Int64(tp) + Int64(q0 + r)) * Int64(self.h) + Int64(col0)) * 4
                        bulk_reduce_add_f32(dst, sdq_base + r * self.dq_pitch + col0 * 4, 256)
                bulk_commit()

    def _partition_dq_tma(self):
        """dq_store "tma" / "tma_warp": the TMA partitions of the staging tile's boxes and of dq (kept on self
        for _reduce_dq_tma). The layout is the one _reduce_dq_tma's stores assume (checked at trace time)."""
        tma_dq, mdQt, sDQ = self.dq_tma
        rows = self.dq_box_rows
        stages = self.dq_stage_blocks * (TILE_M // rows)
        stride = 0 if stages == 1 else rows * 64
        want = f"((8,{rows // 8}),(32,2),(1,{stages})):((32,256),(1,{rows * 32}),(0,{stride}))"
        assert str(sDQ.layout) == want, f"dQ staging layout {sDQ.layout} is not {want}"
        self.tDsDQ, self.tDgDQ = tma_tile_partition(tma_dq, mdQt, sDQ, (rows, 64))

    @cute.jit
    def _reduce_dq_tma(self, acc_dq, sdq_base, bn, q0, row_in, col0, col_in, q_len, scale, c, warp_wg):
        """dq[bn, q0 .., 64 c ..] += tau * acc_dq by TMA tensor reduce-adds of this consumer's 64 x 64 tile
        (c = 0 at H64): tau * acc (0 in rows >= q_len) into the staging tile (its previous reads were waited
        for before the dS barrier), fence.proxy.async, then "tma": the consumer's barrier and warp 0 issues
        the tile (two 64 x 32 boxes); "tma_warp": __syncwarp and each warp issues its 16 rows (two 16 x 32
        boxes). The copy elects its lane (elect.sync): the whole warp takes the branch.

        dq_keys "own" ("tma_warp" only): the tile is dq's columns col0 .. col0 + 63 (a multiple of 64) and is
        staged in consumer c's own 16 KB block; each warp first waits until its previous reduction (the
        previous half or tile) has read that block (wait_group.read in the issuing lane, then __syncwarp).

        Staging addresses by hand (kernels/sm90/attention_bwd_dq_layout.py): cute's partition of the swizzled
        tile kept 16 addresses live across the loop (40 spill stores instead of 10)."""
        lim = q_len - q0
        blk = c if self.dq_split else 0  # the staging block (16 KB) and dq's 64-column block
        col_blk = blk
        if cutlass.const_expr(self.dq_own):
            blk, col_blk = c, col0 // 64
            bulk_wait_read()
            cute.arch.sync_warp()
        warp_boxes = self.dq_box_rows == 16
        offset, x0 = dq_layout.thread_base(row_in, col_in, blk, warp_boxes)
        base = sdq_base + offset
        for i in cutlass.range_constexpr(0, cute.size(acc_dq), 2):
            _, v1, nbk = acc_coords(i)
            live = row_in + 8 * v1 < lim
            addr = base + dq_layout.elem_offset(x0, v1, nbk, warp_boxes)
            lo = cutlass.select_(live, acc_dq[i] * scale, Float32(0.0))
            hi = cutlass.select_(live, acc_dq[i + 1] * scale, Float32(0.0))
            st_shared_v2_f32(addr, lo, hi)
        cute.arch.fence_view_async_shared()  # the generic-proxy stores, visible to the TMA (async proxy)
        if cutlass.const_expr(self.dq_writer):
            # the writer warp issues the reductions once every staging warp has arrived
            cute.arch.barrier_arrive(barrier_id=DQ_FULL_BARRIER, number_of_threads=self._dq_writer_threads())
        elif cutlass.const_expr(warp_boxes):
            cute.arch.sync_warp()
            stage = blk * (TILE_M // 16) + warp_wg
            row_tile = q0 // 16 + warp_wg
            cute.copy(self.dq_tma[0], self.tDsDQ[(None, stage)], self.tDgDQ[(None, row_tile, col_blk, bn)])
            bulk_commit()
        else:
            cute.arch.barrier(barrier_id=DQ_BARRIER0 + c, number_of_threads=ws.WARPGROUP_THREADS)
            if warp_wg == 0:
                cute.copy(self.dq_tma[0], self.tDsDQ[(None, blk)], self.tDgDQ[(None, q0 // TILE_M, blk, bn)])
                bulk_commit()

    def _dq_writer_threads(self) -> int:
        """dq_store "tma_writer": the threads of the DQ_FULL / DQ_EMPTY barriers, the staging consumers (both
        at H128, consumer 0 at H64) and the writer warp."""
        return (NUM_CONSUMERS if self.dq_split else 1) * ws.WARPGROUP_THREADS + 32

    @cute.jit
    def _write_dq(self, n_iter, n_m, m_start, bn0):
        """dq_store "tma_writer", warp 1 of the producer warpgroup (FA3's dQ writer): per query tile, wait until
        the consumers have staged the tile (DQ_FULL), issue its TMA reduce-adds (one per 16-row box pair:
        8 at H128, 4 at H64), wait until they have read the staging tile and free it (DQ_EMPTY). The
        consumers then never wait for a TMA issue; the staging tile is single-buffered, as before."""
        self._partition_dq_tma()
        threads = self._dq_writer_threads()
        if n_iter > 0:  # the tile starts free (one arrival per consumer sync: none left pending at exit)
            cute.arch.barrier_arrive(barrier_id=DQ_EMPTY_BARRIER, number_of_threads=threads)
        for it in cutlass.range(n_iter, unroll=1):
            m, bn, _ = self._tile(it, n_m, m_start, bn0)  # the consumers' tile order (AttentionBwdConsumer)
            cute.arch.barrier(barrier_id=DQ_FULL_BARRIER, number_of_threads=threads)
            for blk in cutlass.range_constexpr(self.dq_stage_blocks if self.dq_split else 1):
                for w in cutlass.range_constexpr(TILE_M // 16):
                    row_tile = m * (TILE_M // 16) + w
                    cute.copy(
                        self.dq_tma[0], self.tDsDQ[(None, blk * (TILE_M // 16) + w)],
                        self.tDgDQ[(None, row_tile, blk, bn)],
                    )  # fmt: skip
            bulk_commit()
            bulk_wait_read()
            if it + 1 < n_iter:
                cute.arch.barrier_arrive(barrier_id=DQ_EMPTY_BARRIER, number_of_threads=threads)
        bulk_wait()  # the last reductions, before the CTA (and its shared memory) goes away

    @cute.jit
    def _add_dq(self, acc_dq, dq_base, bn, tp, row0, col0, q_len, scale):
        """dq[bn, row, col] += tau * acc (red.global.add.f32) for this thread's rows row0 (+ 8) < q_len."""
        h = self.h
        if cutlass.const_expr(self.config.dq_red_width == 4):
            self._add_dq_v4(acc_dq, dq_base, bn, tp, row0, col0, q_len, scale)
        for v1 in cutlass.range_constexpr(2 if self.config.dq_red_width != 4 else 0):
            row = row0 + 8 * v1
            if row < q_len:
                base = dq_base + (Int64(bn) * Int64(tp) + Int64(row)) * Int64(h * 4)
                for i in cutlass.range_constexpr(cute.size(acc_dq)):
                    v0, vv, nbk = acc_coords(i)
                    if cutlass.const_expr(vv == v1 and self.config.dq_red_width == 2):
                        if cutlass.const_expr(v0 == 0):  # columns c, c + 1: one 8-byte red.global.add.v2.f32
                            addr = base + Int64((col0 + 8 * nbk) * 4)
                            red_add_v2_f32(addr, acc_dq[i] * scale, acc_dq[i + 1] * scale)
                    elif cutlass.const_expr(vv == v1):
                        red_add_f32(base + Int64((col0 + v0 + 8 * nbk) * 4), acc_dq[i] * scale)

    @cute.jit
    def _add_dq_v4(self, acc_dq, dq_base, bn, tp, row0, col0, q_len, scale):
        """dq_red_width 4: lanes 2j, 2j + 1 (columns c, c + 1 and c + 2, c + 3 of rows row0, row0 + 8) swap
        half their values (one shfl.bfly 1 per value pair), so that the even lane holds 4 adjacent columns
        of row row0 and the odd lane of row row0 + 8: one 16-byte red.global.add.v4.f32 per thread and
        8-column block (half the instructions of width 2). The lane's parity is bit 1 of col0."""
        odd = ((col0 >> 1) & 1) == 1
        row = row0 + cutlass.select_(odd, Int32(8), Int32(0))
        col = col0 - cutlass.select_(odd, Int32(2), Int32(0))
        base = dq_base + (Int64(bn) * Int64(tp) + Int64(row)) * Int64(self.h * 4)
        for nbk in cutlass.range_constexpr(cute.size(acc_dq) // 4):
            a0 = acc_dq[4 * nbk] * scale  # row0: columns c, c + 1
            a1 = acc_dq[4 * nbk + 1] * scale
            b0 = acc_dq[4 * nbk + 2] * scale  # row0 + 8
            b1 = acc_dq[4 * nbk + 3] * scale
            r0 = Uint32(ptx.shfl_bfly(Float32(cutlass.select_(odd, a0, b0)).bitcast(Uint32), 1)).bitcast(Float32)
            r1 = Uint32(ptx.shfl_bfly(Float32(cutlass.select_(odd, a1, b1)).bitcast(Uint32), 1)).bitcast(Float32)
            if row < q_len:
                red_add_v4_f32(
                    base + Int64((col + 8 * nbk) * 4),
                    cutlass.select_(odd, r0, a0), cutlass.select_(odd, r1, a1),
                    cutlass.select_(odd, b0, r0), cutlass.select_(odd, b1, r1),
                )  # fmt: skip
