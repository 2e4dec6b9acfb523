"""The compute warps of the Blackwell attention backward (kernels/sm100/attention_bwd.py, warps 4-11): P and
dS of every step, quantized for the block-scaled GEMMs (primitives/attention_bwd_sm100_emulation.py's
arithmetic, docs/perf/blackwell-attention.md "Backward").

Thread (warp w, lane l) owns key row r = 32 (w % 4) + l of the CTA's tile (TMEM lane r) and the 64 queries
64 h .. 64 h + 63 of each step, h = (w - 4) // 4 (two 32-query blocks: chunks c = 0, 1). Per step:
  S^T     two tcgen05.ld of 32 columns; then both warps of the lane quarter meet (named barrier: P^T is
          written over S^T's first 32 columns, which the other warp may still be loading) and one lane per
          warp arrives on s_drained (the MMA warp then copies dP's scales into S^T's columns)
  P       t = mul.rn(acc, c) (c = float32(tau log2 e)), -inf where masked (only on tiles crossing the
          diagonal, q_len or kv_len), x = sub.rn(t, L) (L = LSE log2 e from the stats stage),
          P = ex2(min.NaN(x, 0)) <= 1 (a NaN logit stays NaN)
  P^T     quantized along the queries (dV contracts them): "const" E4M3(2^8 P), scale byte 0x77 (written once
          into its chunk); "block" 1x32 per key and query block (kernels/sm100/attention_quant.quantize32 of
          the thread's own 32 values), its two bytes into the chunk; tcgen05.st of 8 words per block; p_full
  dP^T    two tcgen05.ld; the lane quarter's barrier again (dS^T goes over dP^T's first 32 columns);
          dp_drained
  dS      sub.rn then mul.rn: P (dP - Delta) in float32 (never contracted into an FMA, as the emulation)
  dS      one 32 x 32 (key, query) block per warp and chunk: lane amax (FMNMX.NAN), warp amax
          (CREDUX.MAXABS.F32.NAN: a NaN anywhere gives byte 0xFF), byte and factor from its bits (rule "up"),
          elements cvt.rn.satfinite; the same E4M3 block serves dK (dS^T to TMEM, tcgen05.st) and dQ (dS to
          shared memory, MN-major: key row r holds its 128 query bytes, 16-byte chunks XOR-swizzled by r % 8,
          the 128B-swizzle of attention_bwd_gemms' ds_smem); the block's byte goes into dK's SFA chunk (rows =
          keys) and dQ's (rows = queries); fence.proxy.async, ds_full, stats_empty.
Scale chunks (sSF_c): [P^T's SFA | dS^T's SFA (rows keys) | dS's SFA (rows queries)], the 128x4 blocked
layout: byte (row, block) at (row % 32) 16 + (row // 32) 4 + block.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.sm100 import attention_bwd_ptx as px
from jax_mxfp8.kernels.sm100 import attention_quant as aq
from jax_mxfp8.kernels.sm100 import float32_ops as f32
from jax_mxfp8.kernels.sm100 import tmem_rows
from jax_mxfp8.kernels.sm100.attention_bwd_config import BAR_COMPUTE_PAIR
from jax_mxfp8.kernels.sm100.attention_bwd_load import STATS_STAGE_BYTES
from jax_mxfp8.kernels.sm100.attention_geometry import SCALE_CHUNK, TILE
from jax_mxfp8.kernels.sm100.attention_mask import mask_queries

HALF = TILE // 2


def _elected_arrive(mbar) -> None:
    """One lane arrives for the warp, after the warp's lanes are done (tcgen05 work ordered first)."""
    tmem_rows.fence_before_sync()
    cute.arch.sync_warp()
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive(mbar)


class ComputeRole:
    """The compute warps' method of AttentionBwdSm100."""

    @cute.jit
    def compute(self, ctx, tmem, warp):
        cfg, w, bars, c = self.config, ctx.work, ctx.bars, self.cols
        st = cfg.stages
        quarter = warp % 4
        half = (warp - 4) // 4
        lane = cute.arch.lane_idx()
        row = quarter * 32 + lane
        key = w.n * TILE + row
        base = Uint32(tmem.toint())
        s_addr = tmem_rows.lane_addr(base, quarter, c["S^T"]) + Uint32(HALF * half)
        p_addr = tmem_rows.lane_addr(base, quarter, c["P^T"]) + Uint32(16 * half)
        dp_addr = tmem_rows.lane_addr(base, quarter, c["dP^T"]) + Uint32(HALF * half)
        ds_addr = tmem_rows.lane_addr(base, quarter, c["dS^T"]) + Uint32(16 * half)
        sf = ctx.smem_addr("sSF_c")
        own_sf = lane * 16 + quarter * 4 + 2 * half  # (this key row, query blocks 2 h, 2 h + 1)
        stats = ctx.smem_addr("sStats")
        ds_row = ctx.smem_addr("sdS") + row * TILE
        # the valid queries of this key row: lo <= q < hi (within the sequence)
        lo = key if cutlass.const_expr(cfg.causal) else Int32(0)
        hi = cutlass.select_(key < w.kv_len, w.q_len, Int32(0))
        if cutlass.const_expr(cfg.p_scale == "const"):
            ptx.st_shared_u16(sf + own_sf, Uint32(aq.P_CONST_SCALE_BYTE * 0x101))
            tmem_rows.fence_async_shared()
        i = Int32(0)
        for _gi in cutlass.range(w.groups, unroll=1):
            for m in cutlass.range(w.m_lo, w.m_hi, unroll=1):
                s, ph, p1 = i % st, (i // st) % 2, i % 2
                q0 = m * TILE + HALF * half
                stage = stats + s * STATS_STAGE_BYTES + 4 * HALF * half
                # S^T -> P
                cute.arch.mbarrier_wait(bars.ptr("s_full"), p1)
                tmem_rows.fence_after_sync()
                acc = tmem_rows.load_cols(s_addr, HALF, Float32)
                px.named_barrier(BAR_COMPUTE_PAIR + quarter, 64)
                _elected_arrive(bars.ptr("s_drained"))
                cute.arch.mbarrier_wait(bars.ptr("stats_full", s), ph)
                t = [f32.mul_rn(x, ctx.scale_log2) for x in acc]
                if w.masked(m, cfg.causal):
                    t = mask_queries(t, q0, lo, hi)
                p = []
                for j4 in cutlass.range_constexpr(HALF // 4):
                    lv = ptx.ld_shared_v4_f32(stage + 16 * j4)
                    p += [f32.exp2_min0(f32.sub_rn(t[4 * j4 + e], lv[e])) for e in range(4)]
                self._store_p(p, p_addr, sf + own_sf)
                _elected_arrive(bars.ptr("p_full"))
                # dP^T -> dS
                cute.arch.mbarrier_wait(bars.ptr("dp_full"), p1)
                tmem_rows.fence_after_sync()
                dp = tmem_rows.load_cols(dp_addr, HALF, Float32)
                px.named_barrier(BAR_COMPUTE_PAIR + quarter, 64)
                _elected_arrive(bars.ptr("dp_drained"))
                ds = []
                for j4 in cutlass.range_constexpr(HALF // 4):
                    dv = ptx.ld_shared_v4_f32(stage + TILE * 4 + 16 * j4)
                    ds += [f32.mul_rn(p[4 * j4 + e], f32.sub_rn(dp[4 * j4 + e], dv[e])) for e in range(4)]
                self._store_ds(ds, ds_addr, ds_row, row, half, sf, own_sf, lane, quarter)
                _elected_arrive(bars.ptr("ds_full"))
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive(bars.ptr("stats_empty", s))
                i += 1

    def _store_p(self, p, p_addr, sf_addr) -> None:
        """P^T's two blocks of this thread into TMEM (and, p_scale "block", their scale bytes into the chunk)."""
        nbytes = []
        for chunk in range(2):
            vals = p[32 * chunk : 32 * chunk + 32]
            if self.config.p_scale == "const":
                words = aq.p_const_words(vals)
            else:
                b, words = aq.quantize32(vals, aq.abs_max(vals))
                nbytes.append(b)
            tmem_rows.store_cols(p_addr + Uint32(8 * chunk), words)
        if self.config.p_scale == "block":
            ptx.st_shared_u16(sf_addr, nbytes[0] | (nbytes[1] << Uint32(8)))
            tmem_rows.fence_async_shared()
        tmem_rows.wait_st()

    def _store_ds(self, ds, ds_addr, ds_row, row, half, sf, own_sf, lane, quarter) -> None:
        """dS's two 32 x 32 blocks of this warp: E4M3 into TMEM (dS^T, dK's A) and the shared dS tile (dQ's A),
        the bytes into dK's and dQ's scale chunks (module docstring)."""
        nbytes = []
        for chunk in range(2):
            vals = ds[32 * chunk : 32 * chunk + 32]
            b, words = aq.quantize32(vals, aq.square_block_amax(aq.abs_max(vals)))
            nbytes.append(b)
            tmem_rows.store_cols(ds_addr + Uint32(8 * chunk), words)
            for k in range(2):
                ptx.st_shared_v4(self._ds_addr(ds_row, row, half, chunk, k), words[4 * k : 4 * k + 4])
            # dQ's SFA: rows = queries 32 (2 h + chunk) + lane, block = this warp's keys (quarter)
            ptx.st_shared_u8(sf + 2 * SCALE_CHUNK + lane * 16 + (2 * half + chunk) * 4 + quarter, b)
        ptx.st_shared_u16(sf + SCALE_CHUNK + own_sf, nbytes[0] | (nbytes[1] << Uint32(8)))
        tmem_rows.fence_async_shared()
        tmem_rows.wait_st()

    def _ds_addr(self, ds_row, row, half, chunk: int, k: int) -> Int32:
        """Shared address of this thread's 16-byte piece k of block `chunk` in its dS row (chunk16 index
        4 h + 2 chunk + k, swizzled by row % 8)."""
        return ds_row + (((half * 4 + (2 * chunk + k)) ^ (row % 8)) * 16)
