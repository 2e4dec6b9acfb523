"""The Blackwell attention forward's softmax warps (sm_100f, CuTe DSL): online softmax with the P quantization
riding on it. SoftmaxRole is a method mixin of kernels/sm100/attention_fwd.AttentionForwardSm100.

Softmax warpgroup s (warps 4 s .. 4 s + 3) owns Q tile s; thread = query row r = 32 (warp % 4) + lane (its
TMEM lane). Per KV tile j (primitives/attention_sm100_emulation.py is this arithmetic in XLA):

  acc   = tcgen05.ld S_s (128 float32)          then "S_s drained" (named barrier with the MMA warp)
  t     = mul.rn(acc, c), c = fl(tau log2 e)   (one rounding; no FFMA contraction with what follows;
                                               FMUL2 / FADD2 pairs: kernels/sm100/float32_ops.py)
  masked tiles only: t_k = -inf for key >= kv_len or (causal) key > row      (attention_mask.py)
  m_new = max(m, max_k t)  (FMNMX3.NAN: a NaN row stays NaN);  m_use = m_new == -inf ? 0 : m_new
  alpha = ex2(m - m_use) -> shared memory, mbarrier "stats_s" (the correction warps rescale O_s)
  P~    = ex2(t - m_use) <= 1 (t - m_use <= 0 exactly: m_use is the max of the same rounded t)
  l     = alpha l + sum_k P~        (from the unquantized P~)
  P     const: E4M3(2^8 P~) (exact product, cvt.rn.satfinite), PV's A-scale byte 0x77 (a constant
              shared-memory chunk written once)
        block: per 32 keys b = "up"(amax P~) from the amax's bits (P~ >= 0: a NaN-keeping max3 tree;
              ptx.scale_and_factor), E4M3(P~ 2^(127 - b)) (the factor's product is exact); the
              row's 4 bytes -> shared memory at the 128x4 chunk position of (row, key block), where the MMA
              warp's tcgen05.cp picks them up for SF_PV_s
  tcgen05.st P into P_s (32 columns), then mbarrier "P_s ready"
After the item's last tile: l and m (log2 units) -> shared memory (mbarrier "final_s"; "final_empty_s" keeps
the buffer from being overwritten before the correction warps read it).

Large logits: t - m_use <= 0 for any finite magnitude (mul, then sub, never fused), so P~ <= 1 and 2^8 P~ <=
256 < 448: the E4M3 P never saturates, with no rescale threshold (the contract's exact running max).
Never run on hardware.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32
from cutlass.cute.arch import inline_ptx

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.sm100 import attention_quant as aq
from jax_mxfp8.kernels.sm100 import float32_ops as f32
from jax_mxfp8.kernels.sm100 import tmem_rows
from jax_mxfp8.kernels.sm100.attention_fwd_config import ITEM_ROWS, TILE_M, TILE_N
from jax_mxfp8.kernels.sm100.attention_fwd_mma import S_DRAINED_BARRIER, S_DRAINED_THREADS
from jax_mxfp8.kernels.sm100.attention_mask import key_limit, mask_row, tile_needs_mask
from jax_mxfp8.reference.attention_quant import P_CONST_LOG2

BLOCK = 32


def ex2(x: Float32) -> Float32:
    """2^x by MUFU.EX2 (ex2.approx.ftz: 2^-22 relative; 2^-inf = 0, NaN stays NaN)."""
    return inline_ptx("ex2.approx.ftz.f32 {$w0}, {$r0};", write_only_types=[Float32], read_only_args=[x])


class SoftmaxRole:
    """Softmax warps 0-7. Mixin of AttentionForwardSm100: uses self.cfg, self.sched."""

    @cute.jit
    def softmax_role(self, tmem_base: Uint32, smem: dict, bars: dict, total_items, dims, tables, scale_log2: Float32):
        cfg = self.cfg
        cols = cfg.tmem_columns
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        s = warp // 4
        r = (warp % 4) * 32 + cute.arch.lane_idx()
        taddr = tmem_rows.lane_base(tmem_base, warp)
        s_addr = taddr + Uint32(cutlass.select_(s == 0, Int32(cols["S_0"]), Int32(cols["S_1"])))
        p_addr = taddr + Uint32(cutlass.select_(s == 0, Int32(cols["P_0"]), Int32(cols["P_1"])))
        sfp_addr = smem["sfp_addr"] + s * 512 + (r % 32) * 16 + (r // 32) * 4
        stats = smem["stats"]  # (TILE_M, stage, [alpha, row sum, row max]) float32

        first, step, total = cute.arch.block_idx()[0], cute.arch.grid_dim()[0], total_items
        tiles = Int32(0)
        done = Int32(0)  # items finished (the final-stats buffer's phase)
        for idx in cutlass.range(first, total, step, unroll=1):
            it = self.sched.item(idx, dims, tables)
            if it.live and it.n_kv > 0:
                first_row = it.pair * ITEM_ROWS + s * TILE_M
                row = first_row + r
                m = -Float32.inf
                lsum = Float32(0.0)
                for j in cutlass.range(it.n_kv, unroll=1):
                    tmem_rows.Mbarrier(bars["s_full"], s).wait(tiles % 2)
                    tmem_rows.fence_after_sync()
                    acc = [b.bitcast(Float32) for b in tmem_rows.load_cols(s_addr, TILE_N)]
                    tmem_rows.fence_before_sync()
                    cute.arch.barrier_arrive(barrier_id=S_DRAINED_BARRIER[0] + s, number_of_threads=S_DRAINED_THREADS)
                    state = (m, lsum, scale_log2, stats, r, s, bars, p_addr, sfp_addr)
                    if tile_needs_mask(j, it.kv_len, first_row, cfg.causal):
                        m, lsum = self._softmax_tile(acc, key_limit(j, it.kv_len, row, cfg.causal), *state)
                    else:
                        m, lsum = self._softmax_tile(acc, None, *state)
                    tmem_rows.wait_st()
                    tmem_rows.fence_before_sync()
                    tmem_rows.Mbarrier(bars["p_ready"], s).arrive()
                    tiles += 1
                tmem_rows.Mbarrier(bars["final_empty"], s).wait((done % 2) ^ 1)
                stats[r, s, 1] = lsum
                stats[r, s, 2] = m
                tmem_rows.Mbarrier(bars["final_full"], s).arrive()
                done += 1

    @cute.jit
    def _softmax_tile(self, acc, limit, m, lsum, scale_log2, stats, r, s, bars, p_addr, sfp_addr):
        """One tile of one row (module docstring): the logits t = round(acc c), -inf at keys k >= limit
        (limit None: an unmasked tile, known at trace time), alpha to the correction warps, P (and its scale
        bytes) to TMEM (and shared memory). Returns the new (m, l)."""
        t = []
        for k in cutlass.range_constexpr(0, TILE_N, 2):  # FMUL2: two logits per instruction, each rounded once
            t += list(f32.mul2(acc[k], acc[k + 1], scale_log2))
        if cutlass.const_expr(limit is not None):
            t = mask_row(t, limit)  # masked after the scaling, as the reference: -inf whatever the sign of c
        m_new = f32.max3(m, f32.max_all(t), m)
        m_use = Float32(cutlass.select_(m_new == -Float32.inf, Float32(0.0), m_new))
        alpha = ex2(m - m_use)
        stats[r, s, 0] = alpha
        tmem_rows.Mbarrier(bars["stats"], s).arrive()
        # per 32 keys: P~, its partial row sum and its quantization (only one chunk of P~ is live at a time)
        sums, scale_bytes = [], []
        for c in cutlass.range_constexpr(TILE_N // BLOCK):
            p = []
            for k in cutlass.range_constexpr(BLOCK * c, BLOCK * (c + 1), 2):
                x0, x1 = f32.sub2(t[k], t[k + 1], m_use)
                p += [ex2(x0), ex2(x1)]
            sums.append(f32.sum_pairs(p))
            if cutlass.const_expr(self.cfg.p_scale == "const"):
                factor = Float32(2.0**P_CONST_LOG2)
            else:
                # P~ >= 0 (or NaN): the amax is the plain max (FMNMX3.NAN: NaN kept, then byte 0xFF)
                amax_bits = f32.max_all(p).bitcast(Uint32) & Uint32(0x7FFFFFFF)
                byte, factor_bits = ptx.scale_and_factor(amax_bits, aq.E4M3, "up")
                scale_bytes.append(byte)
                factor = factor_bits.bitcast(Float32)
            w = [f32.e4m3x4(p[4 * i : 4 * i + 4], factor) for i in range(BLOCK // 4)]
            tmem_rows.store_cols(p_addr + Uint32(c * BLOCK // 4), w)
        lsum = alpha * lsum + ((sums[0] + sums[1]) + (sums[2] + sums[3]))
        if cutlass.const_expr(self.cfg.p_scale == "block"):
            ptx.st_shared_b32(sfp_addr, ptx.pack_bytes4(*scale_bytes))
            tmem_rows.fence_async_shared()
        return m_new, lsum
