"""The consumer warpgroups of the Hopper attention backward (kernels/sm90/attention_bwd.py): the per-query-tile
loop (S^T, P^T, Pq^T, dP^T, dS^T and its square quantization, dV, dK, dQ wgmmas) and the dK / dV epilogue.

Supported features: those of attention_bwd.py (head_dim 64 / 128, causal or not, GQA, per-batch lengths,
p_scale "const" and "block"), and its schedule fields: overlap 0 / 1 / 2, smem_stats, stats_early, amax_reduce, dq_keys
"cta" / "own", dq_first, next_early 0 / 1 / 2, dk_ss, p_scaled, sdp_fp8, dv_f16, factors_ahead. A mixin of
AttentionBackwardSm90: it reads the kernel's config-derived attributes (self.h, self.overlap, ...) and calls the
dQ store of AttentionBwdDqReduce (kernels/sm90/attention_bwd_dq_reduce.py).
Consumer warpgroup c (0, 1) owns keys 64 c .. 64 c + 63 of the CTA's 128-key tile (wgmma M = 64).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from jax_mxfp8.kernels.sm90 import warp_specialization as ws
from jax_mxfp8.kernels.sm90 import wgmma
from jax_mxfp8.kernels.sm90.attention_bwd_blocks import (
    AMAX_BARRIER0,
    BF16,
    CTA_N,
    DQ_EMPTY_BARRIER,
    DS_BARRIER,
    FP8,
    LOG2E,
    NUM_CONSUMERS,
    P_CONST,
    TILE_M,
    WG_N,
    bulk_wait,
    bulk_wait_read,
    quantize_ds_square,
    quantize_p_blocks,
)
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords


class AttentionBwdConsumer:
    """The consumers' device code (mixin of AttentionBackwardSm90)."""

    @cute.jit
    def _consume(
        self, dkv_mma, sdp_mma, dq_mma, sQ, sdO, sK, sV, sdS, sAmax, q_pipe, kv_pipe,
        mLse, mDelta, mdQ, mdK, mdV, scale, n, bk, bn0, m_start, n_m, n_iter, q_len, kv_len,
        q_smem, k_smem, ds_smem, sdq_base, c, tid, sStats,
    ):  # fmt: skip
        """Consumer warpgroup c (0 or 1; tid in [0, 256) over both): keys 64 c .. 64 c + 63 of the tile."""
        h = self.h
        thr_sdp = sdp_mma.get_slice(tid)
        thr_dkv = dkv_mma.get_slice(tid)
        thr_dq = dq_mma.get_slice(tid if self.dq_split else tid % 128)
        # transposed (MN-major) views of the K-major tiles, and dS^T for the register -> smem store
        sQt = cute.make_tensor(sQ.iterator, cute.select(q_smem.outer, mode=[1, 0, 2]))
        sdOt = cute.make_tensor(sdO.iterator, cute.select(q_smem.outer, mode=[1, 0, 2]))
        sKt = cute.make_tensor(sK.iterator, cute.select(k_smem.outer, mode=[1, 0, 2]))
        sdSt = cute.make_tensor(sdS.iterator, cute.select(ds_smem.outer, mode=[1, 0, 2]))

        sQa, sdOa, sKa, sVa = sQ, sdO, sK, sV  # S^T's and dP^T's operands
        if cutlass.const_expr(self.sdp_fp8):
            sQa, sdOa, sKa, sVa = self.fp8_tma[8]  # the FP8 copies
        tSrK = sdp_mma.make_fragment_A(thr_sdp.partition_A(sKa))
        tSrQ = sdp_mma.make_fragment_B(thr_sdp.partition_B(sQa))
        tPrV = sdp_mma.make_fragment_A(thr_sdp.partition_A(sVa))
        tPrdO = sdp_mma.make_fragment_B(thr_sdp.partition_B(sdOa))
        dv_mma = self._dv_mma()  # dkv_mma's, or its float16 twin (dv_f16)
        thr_dv = dv_mma.get_slice(tid)
        tVrdOt = dv_mma.make_fragment_B(thr_dv.partition_B(sdOt))
        tKrQt = dkv_mma.make_fragment_B(thr_dkv.partition_B(sQt))
        tQrdS = dq_mma.make_fragment_A(thr_dq.partition_A(sdS))
        tQrKt = dq_mma.make_fragment_B(thr_dq.partition_B(sKt))
        tCsdS = thr_sdp.partition_C(sdSt)
        tKrdS, tKrQt_ss = None, None
        if cutlass.const_expr(self.dk_ss):
            # dK's A = dSq^T (keys, queries) from the dS tile: K-major as the transposed view of sdS
            dk_mma = self._dk_mma()
            thr_dk = dk_mma.get_slice(tid)
            tKrdS = dk_mma.make_fragment_A(thr_dk.partition_A(sdSt))
            tKrQt_ss = dk_mma.make_fragment_B(thr_dk.partition_B(sQt))

        acc_s = cute.make_rmem_tensor(thr_sdp.partition_shape_C((CTA_N, TILE_M)), Float32)
        acc_dp = cute.make_rmem_tensor(thr_sdp.partition_shape_C((CTA_N, TILE_M)), Float32)
        acc_dv = cute.make_rmem_tensor(thr_dkv.partition_shape_C((CTA_N, h)), Float32)
        acc_dk = cute.make_rmem_tensor(thr_dkv.partition_shape_C((CTA_N, h)), Float32)
        acc_dq = cute.make_rmem_tensor(thr_dq.partition_shape_C((TILE_M, h)), Float32)
        a_f32 = cute.make_rmem_tensor(thr_dkv.partition_shape_A((CTA_N, TILE_M)), Float32)
        a_fp8 = cute.make_rmem_tensor(thr_dkv.partition_shape_A((CTA_N, TILE_M)), FP8)
        p_a = cute.make_rmem_tensor(thr_dv.partition_shape_A((CTA_N, TILE_M)), self.do_dtype)
        ds_a = cute.make_rmem_tensor(thr_dkv.partition_shape_A((CTA_N, TILE_M)), BF16)
        ds_c = cute.make_rmem_tensor(thr_sdp.partition_shape_C((CTA_N, TILE_M)), BF16)
        lse2 = cute.make_rmem_tensor((16,), Float32)
        dlt = cute.make_rmem_tensor((16,), Float32)
        # outputs, partitioned before the main loop (the ACCUMULATE field set inside rebinds the MMA)
        tDKgDK = thr_dkv.partition_C(cute.local_tile(mdK, (CTA_N, h), (n, 0, bk)))
        tDVgDV = thr_dkv.partition_C(cute.local_tile(mdV, (CTA_N, h), (n, 0, bk)))
        assert cute.size(acc_s) == 32 and cute.size(a_f32) == 32 and cute.size(acc_dv) == h // 2

        lane = tid % 32
        warp_wg = (tid % 128) // 32
        row_in = 16 * warp_wg + lane // 4  # this thread's accumulator rows: row_in, row_in + 8
        key0 = n * CTA_N + c * WG_N + row_in  # its keys (S^T rows)
        col_in = 2 * (lane % 4)  # its query columns col_in + v0 + 8 nb of S^T / head-dim columns of dQ
        scale_log2 = scale * Float32(LOG2E)
        # p_scaled: P is computed as 2^8 P (Pq's FP8 scale folded into the exponent), so dS comes out as
        # 2^8 dS and its square blocks as 2^8 dSq (the block scales absorb it): dQ's and dK's tau takes the
        # 2^-8 (exact), dV's accumulator holds 2^8 dV until the epilogue
        dq_tau = scale
        dv_unit = Float32(1.0)
        if cutlass.const_expr(self.p_scaled):
            dq_tau = scale * Float32(1.0 / P_CONST)
            dv_unit = Float32(1.0 / P_CONST)
        # sdp_fp8: the accumulators of S^T, dP^T are in units of the FP8 copies' row factors: this thread's
        # keys (one 32-key group) times each of its two 32-query blocks (f_s: tau log2(e) included via qs)
        f_s = cute.make_rmem_tensor((2,), Float32)
        f_dp = cute.make_rmem_tensor((2,), Float32)
        k_f, v_f = Float32(1.0), Float32(1.0)
        # factors_ahead: the next tile's raw query-block factors (qs, dos), loaded one step before their use
        q_raw = cute.make_rmem_tensor((4,), Float32)
        if cutlass.const_expr(self.sdp_fp8):
            mQs, mKs, mVs, mdOs = self.fp8_factors
            key_group = (n * CTA_N + c * WG_N + 16 * warp_wg) // 32
            k_f, v_f = mKs[bk, key_group], mVs[bk, key_group]
            if cutlass.const_expr(self.config.factors_ahead):
                if n_iter > 0:
                    m1, bn1, _ = self._tile(Int32(0), n_m, m_start, bn0)
                    self._load_raw_factors(mQs, mdOs, bn1, m1, q_raw)
        dq_col0 = Int32(0)
        if cutlass.const_expr(self.dq_split):
            dq_col0 = c * (h // NUM_CONSUMERS)
        dq_base = mdQ.iterator.toint()
        tp = mdQ.shape[0]
        if cutlass.const_expr(self.config.broadcast_q):
            # dq is (N, Tp * H), the one query's: every batch row b adds into it. Query head bn = b N + j of
            # this CTA maps to dq head j = bn - b N, so rebase once: dq_base - b N Tp H floats (bn0 = b N + kv G).
            dq_base = dq_base - Int64(bn0 - bn0 % mdQ.shape[2]) * Int64(tp) * Int64(h * 4)
        pair_barrier = AMAX_BARRIER0 + c * 2 + warp_wg // 2
        if cutlass.const_expr(self.tma_dq):
            self._partition_dq_tma()

        acc_dv.fill(0.0)
        acc_dk.fill(0.0)
        if n_iter > 0:
            kv_pipe.consumer_wait(ws.ring_state(1, Int32(0)))
        for it in cutlass.range(n_iter, unroll=1):
            m, bn, q0 = self._tile(it, n_m, m_start, bn0)
            stage = it % self.q_stage
            buf = it % 2
            state = ws.ring_state(self.q_stage, it)
            if cutlass.const_expr(not self.smem_stats):
                self._load_stats(mLse, mDelta, bn, q0 + col_in, lse2, dlt)
            q_pipe.consumer_wait(state)
            self._issue_sdp(acc_s, acc_dp, tSrK, tSrQ, tPrV, tPrdO, stage, 0)
            if cutlass.const_expr(self.sdp_fp8 and self.config.factors_ahead):
                # the factors loaded a step ago (no global-load latency here); the next tile's loads now
                self._key_factors(q_raw, k_f, v_f, f_s, f_dp)
                if it + 1 < n_iter:
                    m1, bn1, _ = self._tile(it + 1, n_m, m_start, bn0)
                    self._load_raw_factors(mQs, mdOs, bn1, m1, q_raw)
            elif cutlass.const_expr(self.sdp_fp8):
                # the tile's query-block factors (uniform loads, under the S^T / dP^T wgmmas)
                self._load_factors(mQs, mdOs, bn, m, k_f, v_f, f_s, f_dp)
            # stats_early: the LSE loads (LDS) are issued under the S^T wgmma instead of after its wait (not
            # delta under dP^T: its 16 registers live across the P phase raise the H128 spills 5 -> 18)
            if cutlass.const_expr(self.smem_stats and self.stats_early):
                self._read_stats(sStats, stage, col_in, lse2, True)
            cute.nvgpu.warpgroup.wait_group(1)
            if cutlass.const_expr(self.smem_stats and not self.stats_early):
                self._read_stats(sStats, stage, col_in, lse2, True)
            self._probabilities(acc_s, lse2, scale_log2, key0, q0 + col_in, q_len, kv_len, n, m, f_s)
            # Pq = E4M3_satfinite(P 2^8) 2^-8, as dV's A operand (the A fragment's order is the accumulator's);
            # p_scale "block": per 32 queries of each key, on P's own scale (quantize_p_blocks);
            # p_scaled: acc_s already holds 2^8 P, and Pq stays in 2^8 units (no multiplies)
            # dv_f16 (needs p_scaled): E4M3 -> float16 is exact (cvt.f16x2.e4m3x2 per pair), no float32 round trip
            if cutlass.const_expr(self.p_scaled):
                a_fp8.store(acc_s.load().to(FP8))
                if cutlass.const_expr(self.config.dv_f16):
                    p_a.store(a_fp8.load().to(self.do_dtype))
                else:
                    a_f32.store(a_fp8.load().to(Float32))
            elif cutlass.const_expr(self.config.p_scale == "block"):
                quantize_p_blocks(acc_s, a_f32, self.config.p_rounding)  # P's own scales (acc_s holds P)
            else:
                for i in cutlass.range_constexpr(32):
                    a_f32[i] = acc_s[i] * Float32(P_CONST)
                a_fp8.store(a_f32.load().to(FP8))
                a_f32.store(a_fp8.load().to(Float32))
                for i in cutlass.range_constexpr(32):
                    a_f32[i] = a_f32[i] * Float32(1.0 / P_CONST)
            if cutlass.const_expr(not self.config.dv_f16):
                p_a.store(a_f32.load().to(BF16))
            cute.nvgpu.warpgroup.fence()
            self._gemm_acc(self._dv_mma, acc_dv, p_a, tVrdOt[None, None, None, stage], it)
            cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(1)
            if cutlass.const_expr(self.smem_stats):
                self._read_stats(sStats, stage, col_in, dlt, False)
            for i in cutlass.range_constexpr(32):
                v0, _, nbk = acc_coords(i)
                dp = acc_dp[i]
                if cutlass.const_expr(self.sdp_fp8):
                    dp = dp * f_dp[nbk // 4]
                acc_dp[i] = acc_s[i] * (dp - dlt[v0 + 2 * nbk])
            quantize_ds_square(acc_dp, sAmax, buf, c, warp_wg, lane, pair_barrier, self.redux)
            if cutlass.const_expr(not self.dk_ss):  # dK's A fragment (dk_ss: read from the dS tile instead)
                for i in cutlass.range_constexpr(32):
                    a_f32[i] = acc_dp[i]
                ds_a.store(a_f32.load().to(BF16))
            ds_c.store(acc_dp.load().to(BF16))
            cute.autovec_copy(ds_c, tCsdS[None, None, None, buf])
            cute.arch.fence_view_async_shared()
            if cutlass.const_expr(True):
                if cutlass.const_expr(self.dq_writer):
                    # the writer warp has read the previous tile's staging tile out (its stagers only)
                    if cutlass.const_expr(self.dq_split):
                        cute.arch.barrier(barrier_id=DQ_EMPTY_BARRIER, number_of_threads=self._dq_writer_threads())
                    elif c == 0:
                        cute.arch.barrier(barrier_id=DQ_EMPTY_BARRIER, number_of_threads=self._dq_writer_threads())
                elif cutlass.const_expr(self.tma_dq):
                    # the previous tile's TMA reduce has read the staging tile: after the dS barrier every
                    # thread may overwrite it (no barrier of its own before the staging stores)
                    bulk_wait_read()  # "tma_warp": every warp issued its own
                cute.arch.barrier(barrier_id=DS_BARRIER, number_of_threads=NUM_CONSUMERS * ws.WARPGROUP_THREADS)
                cute.nvgpu.warpgroup.fence()
                if cutlass.const_expr(self.config.dq_first):
                    # dQ first, then dK; dQ's store while dK's wgmma runs (wait_group(1): dQ's group is done;
                    # the H64 consumer 1 has only dK's group, waited by the step's wait_group(0) below)
                    self._issue_dq(acc_dq, tQrdS, tQrKt, buf, c)
                    self._issue_dk(acc_dk, ds_a, tKrQt, tKrdS, tKrQt_ss, stage, buf, it)
                    cute.nvgpu.warpgroup.commit_group()
                    cute.nvgpu.warpgroup.wait_group(1)
                    if cutlass.const_expr(self.dq_split):
                        self._store_dq(
                            acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, dq_col0, col_in, q_len, dq_tau, c, warp_wg,
                            lane,
                        )  # fmt: skip
                    else:
                        if c == 0:
                            self._store_dq(
                                acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, dq_col0, col_in, q_len, dq_tau, c,
                                warp_wg, lane,
                            )  # fmt: skip
                else:
                    self._issue_dk(acc_dk, ds_a, tKrQt, tKrdS, tKrQt_ss, stage, buf, it)
                    cute.nvgpu.warpgroup.commit_group()
                    self._issue_dq(acc_dq, tQrdS, tQrKt, buf, c)
            cute.nvgpu.warpgroup.wait_group(0)
            q_pipe.consumer_release(state)
            if cutlass.const_expr(self.config.dq_first):
                pass  # stored under the dK wgmma above
            elif cutlass.const_expr(self.dq_split):
                self._store_dq(
                    acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, dq_col0, col_in, q_len, dq_tau, c, warp_wg, lane
                )
            else:
                if c == 0:
                    self._store_dq(
                        acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, dq_col0, col_in, q_len, dq_tau, c, warp_wg, lane
                    )
        if cutlass.const_expr(self.dq_writer):
            pass  # the writer warp waits for the last reductions
        elif cutlass.const_expr(self.tma_dq):
            bulk_wait()  # "tma_warp": every warp's last reductions, before the CTA's shared memory goes away

        # epilogue: dK = tau * acc, rows >= kv_len 0
        for i in cutlass.range_constexpr(cute.size(acc_dk)):
            _, v1, _ = acc_coords(i)
            live = key0 + 8 * v1 < kv_len
            acc_dk[i] = cutlass.select_(live, acc_dk[i] * dq_tau, Float32(0.0))
            acc_dv[i] = cutlass.select_(live, acc_dv[i] * dv_unit, Float32(0.0))
        cute.autovec_copy(acc_dk, tDKgDK)
        cute.autovec_copy(acc_dv, tDVgDV)

    @cute.jit
    def _issue_dq(self, acc_dq, tQrdS, tQrKt, buf, c):
        """dq_keys "cta": dQ = dSq K of dS buffer buf, one commit group (H128: this consumer's head-dim half;
        H64: consumer 0 only)."""
        if cutlass.const_expr(self.dq_split):
            self._gemm(self._dq_mma, acc_dq, tQrdS[None, None, None, buf], tQrKt[None, None, None, 0], False)
            cute.nvgpu.warpgroup.commit_group()
        else:
            if c == 0:
                self._gemm(self._dq_mma, acc_dq, tQrdS[None, None, None, buf], tQrKt[None, None, None, 0], False)
                cute.nvgpu.warpgroup.commit_group()

    def _p_log2(self) -> float:
        """log2 of the unit P is computed in: 8 with p_scaled (2^8 P, folded into LSE log2(e) as -8), else 0."""
        return 8.0 if self.p_scaled else 0.0

    @cute.jit
    def _issue_dk(self, acc_dk, ds_a, tKrQt, tKrdS, tKrQt_ss, stage, buf, it):
        """dK += dSq^T Q of this tile (no commit): A from the registers (ds_a) or, dk_ss, from dS buffer buf in
        shared memory (after the barrier that follows its stores)."""
        if cutlass.const_expr(self.dk_ss):
            self._gemm_acc(self._dk_mma, acc_dk, tKrdS[None, None, None, buf], tKrQt_ss[None, None, None, stage], it)
        else:
            self._gemm_acc(self._dkv_mma, acc_dk, ds_a, tKrQt[None, None, None, stage], it)

    @cute.jit
    def _load_raw_factors(self, mQs, mdOs, bn, m, q_raw):
        """factors_ahead: query tile m's two 32-query-block factors of Q and dO as loaded (q_raw: qs, qs, dos,
        dos), multiplied by the key factors when used, a step later."""
        for qb in cutlass.range_constexpr(2):
            q_raw[qb] = mQs[bn, 2 * m + qb]
            q_raw[2 + qb] = mdOs[bn, 2 * m + qb]

    @cute.jit
    def _key_factors(self, q_raw, k_f, v_f, f_s, f_dp):
        """f_s = (qs) ks, f_dp = (dos) vs for the two query blocks of q_raw (_load_raw_factors' layout)."""
        for qb in cutlass.range_constexpr(2):
            f_s[qb] = q_raw[qb] * k_f
            f_dp[qb] = q_raw[2 + qb] * v_f

    @cute.jit
    def _load_factors(self, mQs, mdOs, bn, m, k_f, v_f, f_s, f_dp):
        """sdp_fp8: query tile m's two 32-query-block factors of S^T (f_s: qs ks, tau log2(e) included) and
        dP^T (f_dp: dos vs), for this thread's key factors k_f, v_f (uniform loads)."""
        q_raw = cute.make_rmem_tensor((4,), Float32)
        self._load_raw_factors(mQs, mdOs, bn, m, q_raw)
        self._key_factors(q_raw, k_f, v_f, f_s, f_dp)

    @cute.jit
    def _tile(self, it, n_m, m_start, bn0):
        """(query tile m, query head bn, first row q0) of loop step it (head g = it // n_m of the group)."""
        g = it // n_m
        m = m_start + it - g * n_m
        return m, bn0 + g, m * TILE_M

    @cute.jit
    def _load_stats(self, mLse, mDelta, bn, qcol0, lse2, dlt):
        """This thread's 16 query columns qcol0 + v0 + 8 nb: LSE * log2(e) (+inf for LSE = -inf: P = 0) and
        delta."""
        for j in cutlass.range_constexpr(16):
            col = qcol0 + (j % 2) + 8 * (j // 2)
            lv = mLse[bn, col]
            lse2[j] = cutlass.select_(lv == -Float32.inf, Float32.inf, lv * Float32(LOG2E) - Float32(self._p_log2()))
            dlt[j] = mDelta[bn, col]

    @cute.jit
    def _read_stats(self, sStats, stage, col_in, out, is_lse: bool):
        """smem_stats: this thread's 16 query columns col_in + v0 + 8 nb of stage `stage`'s LSE (is_lse:
        as _load_stats makes lse2) or delta, from sStats (query column, LSE / delta, stage) float32 (plain
        shared-memory loads, ordered after the stage's mbarrier wait)."""
        for j in cutlass.range_constexpr(16):
            col = col_in + (j % 2) + 8 * (j // 2)
            if cutlass.const_expr(is_lse):
                x = sStats[col, 0, stage]
                out[j] = cutlass.select_(x == -Float32.inf, Float32.inf, x * Float32(LOG2E) - Float32(self._p_log2()))
            else:
                out[j] = sStats[col, 1, stage]

    @cute.jit
    def _issue_sdp(self, acc_s, acc_dp, tSrK, tSrQ, tPrV, tPrdO, stage, which: int):
        """Issues S^T = K Q^T and dP^T = V dO^T of Q/dO stage `stage`, one commit group each (trace-time
        `which`: 0 or 2 both, 1 S^T only, -1 dP^T only)."""
        cute.nvgpu.warpgroup.fence()
        if cutlass.const_expr(which != -1):
            self._gemm(self._sdp_mma, acc_s, tSrK[None, None, None, 0], tSrQ[None, None, None, stage], False)
            cute.nvgpu.warpgroup.commit_group()
        if cutlass.const_expr(which != 1):
            self._gemm(self._sdp_mma, acc_dp, tPrV[None, None, None, 0], tPrdO[None, None, None, stage], False)
            cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def _probabilities(self, acc_s, lse2, scale_log2, key0, qcol0, q_len, kv_len, n, m, f_s):
        """acc_s (S^T, keys x queries) -> P^T = exp2(min(S tau log2e - LSE log2e, 0)) (NaN kept), 0 where
        the key is >= kv_len, the query >= q_len, or (causal) the key after the query. LSE = -inf rows
        come in as lse2 = +inf (P = 0). sdp_fp8: acc_s is in the FP8 copies' units, f_s[query block] =
        tau log2(e) 2^(eQ + eK) replaces scale_log2."""
        p_log2 = self._p_log2()  # lse2 carries -p_log2: P 2^p_log2 <= 2^p_log2
        for i in cutlass.range_constexpr(32):
            v0, _, nbk = acc_coords(i)
            mult = scale_log2
            if cutlass.const_expr(self.sdp_fp8):
                mult = f_s[nbk // 4]
            x = acc_s[i] * mult - lse2[v0 + 2 * nbk]
            acc_s[i] = cute.math.exp2(cute.arch.fmin(x, Float32(p_log2), nan=True), fastmath=True)
        need = ((n + 1) * CTA_N > kv_len) | ((m + 1) * TILE_M > q_len)
        if cutlass.const_expr(self.config.causal):
            if cutlass.const_expr(self.config.packed):  # global rows: key <= query + causal_shift
                need = need | (m * TILE_M + self.causal_shift < (n + 1) * CTA_N)
            else:
                need = need | (m * TILE_M < (n + 1) * CTA_N)
        if need:
            for i in cutlass.range_constexpr(32):
                v0, v1, nbk = acc_coords(i)
                key = key0 + 8 * v1
                query = qcol0 + v0 + 8 * nbk
                bad = (key >= kv_len) | (query >= q_len)
                if cutlass.const_expr(self.config.causal):
                    if cutlass.const_expr(self.config.packed):
                        query = query + self.causal_shift
                    bad = bad | (key > query)
                acc_s[i] = cutlass.select_(bad, Float32(0.0), acc_s[i])

    def _gemm_acc(self, make_mma, acc, a, b, it):
        """dV / dK: acc += a b."""
        wgmma.gemm(make_mma, acc, a, b, True)

    def _gemm(self, make_mma, acc, a, b, accumulate_first: bool):
        """acc (+)= a b over the K blocks (16 per BF16 wgmma) on a fresh tiled MMA; fence/commit/wait are the
        caller's."""
        wgmma.gemm(make_mma, acc, a, b, accumulate_first)
