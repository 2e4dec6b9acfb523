"""The float32 dQ reductions of the Hopper attention backward (kernels/sm90/attention_bwd.py): each consumer's
dQ tile (64 query rows x its head-dim columns, float32 wgmma accumulator) times tau, added into dq.

Supported features (AttentionBwdConfig.dq_store and dq_red_width; dq_accum "fp32", not deterministic --
the other dQ modes are kernels/sm90/attention_bwd_dq.py's, dispatched from _store_dq):
  "red"         red.global.add from the registers: dq_red_width 1 (.f32 per element) or 2 (.v2.f32, a
                thread's two adjacent columns)
  "tma_warp"    the tile staged in a 128-byte-swizzled float32 tile (the layout of the TMA tensor map's
                (16, 32) boxes on dq; attention_bwd_dq_layout.py), then each warp issues one
                cp.reduce.async.bulk.tensor .add per box of its 16 rows after a __syncwarp
  "tma_writer"  the same staging; the consumers arrive on a named barrier and warp 1 of the producer
                warpgroup issues every box (_write_dq, FA3's dQ writer)
Rows >= q_len are never added (the TMA stores add +0.0 to the rows q_len .. Tp - 1 of a tile that crosses
q_len: the zero-filled dq stays +0.0 there). A mixin of AttentionBackwardSm90 (it reads self.config, self.h, ...).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from jax_mxfp8.kernels.sm90 import attention_bwd_dq_layout as dq_layout
from jax_mxfp8.kernels.sm90 import warp_specialization as ws
from jax_mxfp8.kernels.sm90.attention_bwd_blocks import (
    DQ_BARRIER0,
    DQ_EMPTY_BARRIER,
    DQ_FULL_BARRIER,
    NUM_CONSUMERS,
    TILE_M,
    bulk_commit,
    bulk_wait,
    bulk_wait_read,
    red_add_f32,
    red_add_v2_f32,
    st_shared_v2_f32,
    tma_tile_partition,
)
from jax_mxfp8.kernels.sm90.attention_bwd_dq import store_dq_mode
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords


class AttentionBwdDqReduce:
    """dQ's float32 stores (mixin of AttentionBackwardSm90)."""

    @cute.jit
    def _store_dq(self, acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, col0, col_in, q_len, scale, c, warp_wg, lane):
        """dq[bn, q0 + row, col0 + col] += tau * acc_dq for this consumer's dQ tile (64 rows, 64 head-dim
        columns from col0; rows >= q_len skipped), by the dQ mode (attention_bwd_dq.py) or dq_store."""
        if cutlass.const_expr(self.dq_mode):
            sem_base, dq_scale = self.dq_extra
            store_dq_mode(
                self.config, acc_dq, dq_base, sem_base, bn, tp, q0 + row_in, col0 + col_in, q0, q_len, dq_scale, c,
                warp_wg * 32 + lane, DQ_BARRIER0 + c,
            )  # fmt: skip
        elif cutlass.const_expr(self.tma_dq):
            self._reduce_dq_tma(acc_dq, sdq_base, bn, q0, row_in, col0, col_in, q_len, scale, c, warp_wg)
        else:
            self._add_dq(acc_dq, dq_base, bn, tp, q0 + row_in, col0 + col_in, q_len, scale)

    def _partition_dq_tma(self):
        """The TMA dQ stores: the TMA partitions of the staging tile's boxes and of dq (kept on self for
        _reduce_dq_tma). The layout is the one _reduce_dq_tma's stores assume (checked at trace time)."""
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
        for before the dS barrier), fence.proxy.async, then "tma_warp": __syncwarp and each warp issues its
        16 rows (two 16 x 32 boxes; the copy elects its lane: the whole warp takes the branch), or
        "tma_writer": an arrival on the writer warp's barrier.

        Staging addresses by hand (kernels/sm90/attention_bwd_dq_layout.py): cute's partition of the swizzled
        tile kept 16 addresses live across the loop (40 spill stores instead of 10)."""
        lim = q_len - q0
        blk = c if self.dq_split else 0  # the staging block (16 KB) and dq's 64-column block
        col_blk = blk
        offset, x0 = dq_layout.thread_base(row_in, col_in, blk)
        base = sdq_base + offset
        for i in cutlass.range_constexpr(0, cute.size(acc_dq), 2):
            _, v1, nbk = acc_coords(i)
            live = row_in + 8 * v1 < lim
            addr = base + dq_layout.elem_offset(x0, v1, nbk)
            lo = cutlass.select_(live, acc_dq[i] * scale, Float32(0.0))
            hi = cutlass.select_(live, acc_dq[i + 1] * scale, Float32(0.0))
            st_shared_v2_f32(addr, lo, hi)
        cute.arch.fence_view_async_shared()  # the generic-proxy stores, visible to the TMA (async proxy)
        if cutlass.const_expr(self.dq_writer):
            # the writer warp issues the reductions once every staging warp has arrived
            cute.arch.barrier_arrive(barrier_id=DQ_FULL_BARRIER, number_of_threads=self._dq_writer_threads())
        else:
            cute.arch.sync_warp()
            stage = blk * (TILE_M // 16) + warp_wg
            row_tile = q0 // 16 + warp_wg
            cute.copy(self.dq_tma[0], self.tDsDQ[(None, stage)], self.tDgDQ[(None, row_tile, col_blk, bn)])
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
        """dq[bn, row, col] += tau * acc (red.global.add.f32, or .v2.f32 of column pairs with dq_red_width 2)
        for this thread's rows row0 (+ 8) < q_len."""
        h = self.h
        for v1 in cutlass.range_constexpr(2):
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
