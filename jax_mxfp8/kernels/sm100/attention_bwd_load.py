"""The load warp of the Blackwell attention backward (kernels/sm100/attention_bwd.py, warp 13).

Once per CTA: the K and V tiles (TMA, zero rows past the sequence) and their scale chunks (K "hd" and "seq",
V "hd": 1-D bulk copies of 512 bytes) on the kv_full mbarrier. Per step (query head g, query tile m), into
ring stage i % stages once the MMA warp has released it: Q and its "hd" and "seq" chunks (q_full), dO and
its chunks (do_full); and, once the compute warps have released the stage, the tile's 128 LSE and Delta
values (stats_full), loaded by the 32 lanes (4 rows each) with the rows past the sequence's queries set to
L = 0, Delta = 0. L = LSE log2(e) (float32 multiply), 0 where LSE = -inf: the exponent's base-2 offset the
compute warps subtract (primitives/attention_bwd_sm100_emulation.py).
Shared memory: sSF_kv = [K hd | K seq | V hd]; sSF_q, sSF_do = [hd chunks of the stages | seq chunks];
sStats stage s = [L (128 float32) | Delta (128 float32)].
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.sm100 import attention_bwd_ptx as px
from jax_mxfp8.kernels.sm100 import float32_ops as f32
from jax_mxfp8.kernels.sm100.attention_bwd_gemms import BwdGemms
from jax_mxfp8.kernels.sm100.attention_geometry import SCALE_CHUNK, TILE
from jax_mxfp8.kernels.sm100.attention_loads import ragged_coords, scale_chunk_addr, sequence_view

LOG2E = math.log2(math.e)
STATS_STAGE_BYTES = 2 * TILE * 4


def _partition(atom, tiled_mma, tiler, smem, gmem, operand: str):
    """(smem, gmem) TMA partitions of one operand's tiles (operand "A": tiles of the tiler's M and K;
    "B": of N and K)."""
    thr = tiled_mma.get_slice(0)
    if operand == "A":
        g = thr.partition_A(cute.local_tile(gmem, cute.slice_(tiler, (None, 0, None)), (None, None, None)))
    else:
        g = thr.partition_B(cute.local_tile(gmem, cute.slice_(tiler, (0, None, None)), (None, None, None)))
    return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 3), cute.group_modes(g, 0, 3))


def _sequence(packed: bool, batch, row0, rows):
    """(L coordinate, row shift) of the CTA's sequence in a rows_view: the batch row (dense) or the ragged
    packed sequence (attention_loads.ragged_coords)."""
    return ragged_coords(row0, rows) if packed else (batch, 0)


class LoadRole:
    """The load warp's method of AttentionBwdSm100."""

    @cute.jit
    def load(self, ctx, q, k, v, do):
        cfg = self.config
        w, bars, a = ctx.work, ctx.bars, ctx.addrs
        g = BwdGemms(cfg.head_dim, cfg.stages)
        st = cfg.stages
        sK = ctx.storage.sK.get_tensor(g.k_smem.outer, swizzle=g.k_smem.inner)
        sV = ctx.storage.sV.get_tensor(g.k_smem.outer, swizzle=g.k_smem.inner)
        sQ = ctx.storage.sQ.get_tensor(g.q_smem.outer, swizzle=g.q_smem.inner)
        sdO = ctx.storage.sdO.get_tensor(g.q_smem.outer, swizzle=g.q_smem.inner)
        kv_rows = _sequence(cfg.packed, w.b, w.k_off, w.kv_len)
        q_rows = _sequence(cfg.packed, w.bq, w.q_off, w.q_len)
        do_rows = _sequence(cfg.packed, w.b, w.q_off, w.q_len)
        tKs, tKg = _partition(k[0], g.mma["S"], g.tiler["S"], sK, sequence_view(k[1], *kv_rows, cfg.packed), "A")
        tVs, tVg = _partition(v[0], g.mma["dP"], g.tiler["dP"], sV, sequence_view(v[1], *kv_rows, cfg.packed), "A")
        tQs, tQg = _partition(q[0], g.mma["S"], g.tiler["S"], sQ, sequence_view(q[1], *q_rows, cfg.packed), "B")
        tOs, tOg = _partition(do[0], g.mma["dP"], g.tiler["dP"], sdO, sequence_view(do[1], *do_rows, cfg.packed), "B")
        sf_kv, sf_q, sf_do = ctx.smem_addr("sSF_kv"), ctx.smem_addr("sSF_q"), ctx.smem_addr("sSF_do")
        stats = ctx.smem_addr("sStats")
        lane = cute.arch.lane_idx()
        k_tile = w.k_chunk0 + w.n
        if w.steps > 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(bars.ptr("kv_full"), cfg.kv_tx)
                cute.copy(k[0], tKg[(None, w.n, 0, w.kv)], tKs, tma_bar_ptr=bars.ptr("kv_full"))
                cute.copy(v[0], tVg[(None, w.n, 0, w.kv)], tVs, tma_bar_ptr=bars.ptr("kv_full"))
                kv_bar = bars.addr("kv_full")
                chunks = ((a["k_sf_hd"], 0), (a["k_sf_seq"], 1), (a["v_sf_hd"], 2))
                for base, slot in chunks:
                    src = scale_chunk_addr(base, w.b, w.kv, ctx.kv_heads, ctx.k_chunks, k_tile)
                    px.bulk_load(sf_kv + slot * SCALE_CHUNK, src, SCALE_CHUNK, kv_bar)
        i = Int32(0)
        for gi in cutlass.range(w.groups, unroll=1):
            head = w.kv * w.groups + gi
            for m in cutlass.range(w.m_lo, w.m_hi, unroll=1):
                s = i % st
                phase = (i // st) % 2
                q_tile = w.q_chunk0 + m
                with cute.arch.elect_one():
                    cute.arch.mbarrier_wait(bars.ptr("q_empty", s), phase ^ 1)
                    cute.arch.mbarrier_arrive_and_expect_tx(bars.ptr("q_full", s), cfg.q_stage_tx)
                    cute.copy(q[0], tQg[(None, m, 0, head)], tQs[(None, s)], tma_bar_ptr=bars.ptr("q_full", s))
                    self._chunks(ctx, a["q_sf_hd"], a["q_sf_seq"], w.bq, head, q_tile, sf_q, s, bars.addr("q_full", s))
                self._stats(ctx, stats + s * STATS_STAGE_BYTES, head, m, lane, bars, s, phase)
                with cute.arch.elect_one():
                    cute.arch.mbarrier_wait(bars.ptr("do_empty", s), phase ^ 1)
                    cute.arch.mbarrier_arrive_and_expect_tx(bars.ptr("do_full", s), cfg.q_stage_tx)
                    cute.copy(do[0], tOg[(None, m, 0, head)], tOs[(None, s)], tma_bar_ptr=bars.ptr("do_full", s))
                    do_bar = bars.addr("do_full", s)
                    self._chunks(ctx, a["do_sf_hd"], a["do_sf_seq"], w.b, head, q_tile, sf_do, s, do_bar)
                i += 1

    def _chunks(self, ctx, hd, seq, batch, head, tile, smem, s, bar) -> None:
        """The "hd" and "seq" scale chunks of one query tile into ring stage s."""
        st = self.config.stages
        for base, slot in ((hd, s), (seq, st + s)):
            src = scale_chunk_addr(base, batch, head, ctx.n_heads, ctx.q_chunks, tile)
            px.bulk_load(smem + slot * SCALE_CHUNK, src, SCALE_CHUNK, bar)

    @cute.jit
    def _stats(self, ctx, smem: Int32, head, m, lane, bars, s, phase) -> None:
        """L and Delta of query tile m of `head` into one stats stage (the whole warp; module docstring)."""
        w = ctx.work
        cute.arch.mbarrier_wait(bars.ptr("stats_empty", s), phase ^ 1)
        rows = Int64(w.b) * Int64(ctx.n_heads) + Int64(head)
        ls, ds = [], []
        for j in cutlass.range_constexpr(4):
            r = m * TILE + 4 * lane + j
            ok = r < w.q_len
            off = (rows * Int64(ctx.seq_q) + Int64(w.q_off + r)) * 4
            lse = px.ld_global_f32(ctx.addrs["lse"] + off, ok, float("-inf"))
            use = f32.select_f32(lse == Float32(float("-inf")), Float32(0.0), lse)
            ls.append(f32.mul_rn(use, Float32(LOG2E)))
            ds.append(px.ld_global_f32(ctx.addrs["delta"] + off, ok, 0.0))
        ptx.st_shared_v4(smem + 16 * lane, [x.bitcast(cutlass.Uint32) for x in ls])
        ptx.st_shared_v4(smem + TILE * 4 + 16 * lane, [x.bitcast(cutlass.Uint32) for x in ds])
        cute.arch.sync_warp()
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(bars.ptr("stats_full", s))
