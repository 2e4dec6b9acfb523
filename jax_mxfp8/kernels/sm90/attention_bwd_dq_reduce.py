"""The float32 dQ reductions of the Hopper attention backward (kernels/sm90/attention_bwd.py): each consumer's
dQ tile (64 query rows x its head-dim columns, float32 wgmma accumulator) times tau, added into dq.

Supported features (AttentionBwdConfig.dq_store and dq_red_width; dq_accum "fp32", not deterministic --
the other dQ modes are kernels/sm90/attention_bwd_dq.py's, dispatched from store_dq):
  "red"         red.global.add from the registers: dq_red_width 1 (.f32 per element) or 2 (.v2.f32, a
                thread's two adjacent columns)
  "tma_warp"    the tile staged in a 128-byte-swizzled float32 tile (the layout of the TMA tensor map's
                (16, 32) boxes on dq; attention_bwd_dq_layout.py), then each warp issues one
                cp.reduce.async.bulk.tensor .add per box of its 16 rows after a __syncwarp
  "tma_writer"  the same staging; the consumers arrive on a named barrier and warp 1 of the producer
                warpgroup issues every box (AttentionBwdDqReduce.write_dq, FA3's dQ writer)
Rows >= q_len are never added (the TMA stores add +0.0 to the rows q_len .. Tp - 1 of a tile that crosses
q_len: the zero-filled dq stays +0.0 there).
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

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


class DqTma(NamedTuple):
    """The TMA dQ stores' partitions: the reduce-add atom, the staging tile's boxes (index (None, stage)) and
    dq's (index (None, 16-row tile, 64-column block, head))."""

    atom: cute.CopyAtom
    staged: cute.Tensor
    target: cute.Tensor


class DqTarget(NamedTuple):
    """Where a consumer's dQ tile goes (fixed per CTA): dq's global address and row count Tp, the staging
    tile's shared address, this consumer's first head-dim column, the scale the tile is multiplied by (tau,
    times 2^-8 with p_scaled), the TMA partitions (None for "red" and the dQ modes) and the dQ modes'
    (dq_sem address, tau 2^e, the CTA's key tile) (None otherwise)."""

    base: Int64
    staging: Int32
    tp: Int32
    col0: Int32
    scale: Float32
    tma: DqTma | None
    mode: tuple | None


class AttentionBwdDqReduce:
    """dQ's float32 stores (mixin of AttentionBackwardSm90: reads self.config, self.h, self.dq_split, ...)."""

    def dq_writer_threads(self) -> int:
        """dq_store "tma_writer": the threads of the DQ_FULL / DQ_EMPTY barriers, the staging consumers (both
        at H128, consumer 0 at H64) and the writer warp."""
        return (NUM_CONSUMERS if self.dq_split else 1) * ws.WARPGROUP_THREADS + 32

    def partition_dq_tma(self, atom, dq: cute.Tensor, staging: cute.Tensor) -> DqTma:
        """The TMA partitions of the staging tile (16 rows, 64 columns, stages) and of dq (rows, H, heads). The
        layout is the one reduce_dq_tma's hand-computed stores assume (checked at trace time)."""
        stages = self.dq_stage_blocks * (TILE_M // 16)
        stride = 0 if stages == 1 else 16 * 64
        want = f"((8,2),(32,2),(1,{stages})):((32,256),(1,512),(0,{stride}))"
        assert str(staging.layout) == want, f"dQ staging layout {staging.layout} is not {want}"
        staged, target = tma_tile_partition(atom, dq, staging, (16, 64))
        return DqTma(atom, staged, target)

    @cute.jit
    def store_dq(self, acc_dq, dq: DqTarget, bn, q0, row_in, col_in, q_len, c, warp_wg, lane):
        """dq[bn, q0 + row, col0 + col] += scale * acc_dq for this consumer's dQ tile (64 rows, 64 head-dim
        columns from col0; rows >= q_len skipped), by the dQ mode (attention_bwd_dq.py) or dq_store."""
        if cutlass.const_expr(self.dq_mode):
            sem_base, dq_scale, key_tile = dq.mode
            store_dq_mode(
                self.config, acc_dq, dq.base, sem_base, bn, dq.tp, q0 + row_in, dq.col0 + col_in, q0, q_len,
                dq_scale, c, warp_wg * 32 + lane, DQ_BARRIER0 + c, key_tile,
            )  # fmt: skip
        elif cutlass.const_expr(self.tma_dq):
            self.reduce_dq_tma(acc_dq, dq, bn, q0, row_in, col_in, q_len, c, warp_wg)
        else:
            self.add_dq(acc_dq, dq.base, bn, dq.tp, q0 + row_in, dq.col0 + col_in, q_len, dq.scale)

    @cute.jit
    def reduce_dq_tma(self, acc_dq, dq: DqTarget, bn, q0, row_in, col_in, q_len, c, warp_wg):
        """dq[bn, q0 .., 64 c ..] += scale * acc_dq by TMA tensor reduce-adds of this consumer's 64 x 64 tile
        (c = 0 at H64): scale * acc (0 in rows >= q_len) into the staging tile (its previous reads were waited
        for before the dS barrier), fence.proxy.async, then "tma_warp": __syncwarp and each warp issues its
        16 rows (two 16 x 32 boxes; the copy elects its lane: the whole warp takes the branch), or
        "tma_writer": an arrival on the writer warp's barrier.

        Staging addresses by hand (kernels/sm90/attention_bwd_dq_layout.py): cute's partition of the swizzled
        tile kept 16 addresses live across the loop (40 spill stores instead of 10)."""
        lim = q_len - q0
        blk = c if self.dq_split else 0  # the staging block (16 KB) and dq's 64-column block
        col_blk = blk
        offset, x0 = dq_layout.thread_base(row_in, col_in, blk)
        base = dq.staging + offset
        for i in cutlass.range_constexpr(0, cute.size(acc_dq), 2):
            _, v1, nbk = acc_coords(i)
            live = row_in + 8 * v1 < lim
            addr = base + dq_layout.elem_offset(x0, v1, nbk)
            lo = cutlass.select_(live, acc_dq[i] * dq.scale, Float32(0.0))
            hi = cutlass.select_(live, acc_dq[i + 1] * dq.scale, Float32(0.0))
            st_shared_v2_f32(addr, lo, hi)
        cute.arch.fence_view_async_shared()  # the generic-proxy stores, visible to the TMA (async proxy)
        if cutlass.const_expr(self.dq_writer):
            # the writer warp issues the reductions once every staging warp has arrived
            cute.arch.barrier_arrive(barrier_id=DQ_FULL_BARRIER, number_of_threads=self.dq_writer_threads())
        else:
            cute.arch.sync_warp()
            stage = blk * (TILE_M // 16) + warp_wg
            row_tile = q0 // 16 + warp_wg
            cute.copy(dq.tma.atom, dq.tma.staged[(None, stage)], dq.tma.target[(None, row_tile, col_blk, bn)])
            bulk_commit()

    @cute.jit
    def write_dq(self, tile, tma: DqTma):
        """dq_store "tma_writer", warp 1 of the producer warpgroup (FA3's dQ writer): per query tile of the key
        tile's loop, wait until the consumers have staged the tile (DQ_FULL), issue its TMA reduce-adds (one per
        16-row box pair: 8 at H128, 4 at H64), wait until they have read the staging tile and free it
        (DQ_EMPTY). The consumers then never wait for a TMA issue; the staging tile is single-buffered."""
        threads = self.dq_writer_threads()
        steps = tile.steps
        if steps > 0:  # the tile starts free (one arrival per consumer sync: none left pending at exit)
            cute.arch.barrier_arrive(barrier_id=DQ_EMPTY_BARRIER, number_of_threads=threads)
        for it in cutlass.range(steps, unroll=1):
            m, bn, _ = tile.step(it, TILE_M)  # the consumers' tile order
            cute.arch.barrier(barrier_id=DQ_FULL_BARRIER, number_of_threads=threads)
            for blk in cutlass.range_constexpr(self.dq_stage_blocks if self.dq_split else 1):
                for w in cutlass.range_constexpr(TILE_M // 16):
                    row_tile = m * (TILE_M // 16) + w
                    staged = tma.staged[(None, blk * (TILE_M // 16) + w)]
                    cute.copy(tma.atom, staged, tma.target[(None, row_tile, blk, bn)])
            bulk_commit()
            bulk_wait_read()
            if it + 1 < steps:
                cute.arch.barrier_arrive(barrier_id=DQ_EMPTY_BARRIER, number_of_threads=threads)
        bulk_wait()  # the last reductions, before the CTA (and its shared memory) goes away

    @cute.jit
    def add_dq(self, acc_dq, dq_base, bn, tp, row0, col0, q_len, scale):
        """dq[bn, row, col] += scale * acc (red.global.add.f32, or .v2.f32 of column pairs with dq_red_width
        2) for this thread's rows row0 (+ 8) < q_len."""
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
