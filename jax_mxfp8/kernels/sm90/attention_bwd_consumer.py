"""The consumer warpgroups of the Hopper attention backward (kernels/sm90/attention_bwd.py): per query tile,
the phases S^T / dP^T -> P^T and Pq -> dV -> dS^T and its square quantization -> dK, dQ -> the dQ store;
then the dK / dV epilogue.

Consumer warpgroup c (0, 1) owns keys 64 c .. 64 c + 63 of the CTA's 128-key tile (wgmma M = 64); its
threads' accumulator rows are keys key0, key0 + 8 and its columns queries col_in + v0 + 8 nb (S^T, dP^T) or
head-dim columns (dQ). Each phase is a method with its inputs and outputs in the arguments: the per-CTA
fragments (ConsumerFragments), register tensors (ConsumerRegisters) and thread coordinates (ThreadCoords)
are built once before the loop; a step's (query tile, head, stage) is a QueryStep. A mixin of
AttentionBackwardSm90: it reads the config-derived attributes (self.h, self.sdp_fp8, ...) and the MMA
builders, and calls the dQ stores of AttentionBwdDqReduce (kernels/sm90/attention_bwd_dq_reduce.py).
"""

from __future__ import annotations

from typing import NamedTuple

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
from jax_mxfp8.kernels.sm90.attention_bwd_dq_reduce import DqTarget
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords


class ConsumerFragments(NamedTuple):
    """The wgmma operand fragments of one consumer thread (fixed per CTA; stage / buffer index last)."""

    thr_sdp: object  # the thread's slices of the S^T / dP^T, dK, dQ and dV MMAs
    thr_dkv: object
    thr_dq: object
    thr_dv: object
    s_k: cute.Tensor  # S^T's A: K (or K8) from shared memory
    s_q: cute.Tensor  # S^T's B: Q (or Q8) stages
    dp_v: cute.Tensor  # dP^T's A: V (or V8)
    dp_do: cute.Tensor  # dP^T's B: dO (or dO8) stages
    dv_do: cute.Tensor  # dV's B: dO^T, an MN-major view of the dO stages
    dk_q: cute.Tensor  # dK's B: Q^T, an MN-major view of the Q stages
    dq_ds: cute.Tensor  # dQ's A: the dS tile (queries x keys, double-buffered)
    dq_k: cute.Tensor  # dQ's B: K^T, an MN-major view of sK
    ds_store: cute.Tensor  # this thread's slots of the dS^T tile (the register -> smem store)
    dk_ds: cute.Tensor | None  # dk_ss: dK's A, dS^T from the dS tile
    dk_q_ss: cute.Tensor | None  # dk_ss: dK's B for the SS wgmma


class ConsumerRegisters(NamedTuple):
    """The consumer thread's register tensors: accumulators, operand fragments, per-tile statistics."""

    acc_s: cute.Tensor  # S^T, then P^T (64 keys x 64 queries, float32)
    acc_dp: cute.Tensor  # dP^T, then dS^T
    acc_dv: cute.Tensor  # dV (64 keys x H)
    acc_dk: cute.Tensor  # dK
    acc_dq: cute.Tensor  # dQ of the query tile (64 queries x this consumer's head-dim columns)
    a_f32: cute.Tensor  # float32 staging of an A fragment (Pq, dSq)
    a_fp8: cute.Tensor  # Pq's E4M3 values
    p_a: cute.Tensor  # dV's A fragment: Pq^T (bfloat16, float16 with dv_f16)
    ds_a: cute.Tensor  # dK's A fragment: dSq^T (bfloat16; unused with dk_ss)
    ds_c: cute.Tensor  # dSq^T in bfloat16, accumulator order (to the dS tile)
    lse2: cute.Tensor  # (16,) LSE log2(e) of this thread's query columns (+inf where LSE = -inf)
    dlt: cute.Tensor  # (16,) delta of those columns
    f_s: cute.Tensor  # sdp_fp8: S^T's factors per 32-query block (qs ks)
    f_dp: cute.Tensor  # sdp_fp8: dP^T's factors (dos vs)
    q_raw: cute.Tensor  # factors_ahead: the next tile's (qs, qs, dos, dos)


class ThreadCoords(NamedTuple):
    """Where a consumer thread sits in the key tile, and the per-CTA scalars of its phases."""

    c: Int32  # consumer warpgroup (0 or 1)
    lane: Int32
    warp_wg: Int32  # warp in the warpgroup
    row_in: Int32  # accumulator rows row_in, row_in + 8 (16 warp_wg + lane // 4)
    key0: Int32  # this thread's first key (global)
    col_in: Int32  # first column: 2 (lane % 4)
    scale_log2: Float32  # tau log2(e)
    dv_unit: Float32  # dV's epilogue factor (2^-8 with p_scaled)
    k_f: Float32  # sdp_fp8: this thread's key factors of K8 and V8
    v_f: Float32
    pair_barrier: int | Int32  # the named barrier of this thread's warp pair (dS block amax)


class QueryStep(NamedTuple):
    """One loop step: query tile m (64 rows from q0) of query head row bn, its Q / dO stage, dS buffer and
    pipeline state."""

    it: Int32
    m: Int32
    bn: Int32
    q0: Int32
    stage: Int32
    buf: Int32
    state: object


class AttentionBwdConsumer:
    """The consumers' device code (mixin of AttentionBackwardSm90)."""

    @cute.jit
    def consume(self, ops, sm, q_pipe, kv_pipe, tile, c, tid, dq_mode):
        """Consumer warpgroup c (0 or 1; tid in [0, 256) over both) of key tile `tile` (KeyTile): keys
        64 c .. 64 c + 63. ops: BwdOperands; sm: BwdSmem; dq_mode: (dq_sem address, tau 2^e) or None."""
        h = self.h
        frag = self._fragments(ops, sm, tid)
        regs = self._registers(frag)
        # outputs, partitioned before the main loop (the ACCUMULATE field set inside rebinds the MMA)
        tDKgDK = frag.thr_dkv.partition_C(cute.local_tile(ops.dk, (CTA_N, h), (tile.n, 0, tile.bk)))
        tDVgDV = frag.thr_dkv.partition_C(cute.local_tile(ops.dv, (CTA_N, h), (tile.n, 0, tile.bk)))
        assert cute.size(regs.acc_s) == 32 and cute.size(regs.a_f32) == 32 and cute.size(regs.acc_dv) == h // 2
        t = self._thread_coords(ops, tile, regs, c, tid)
        dq = self._dq_target(ops, sm, tile, c, t, dq_mode)

        regs.acc_dv.fill(0.0)
        regs.acc_dk.fill(0.0)
        steps = tile.steps  # (a local: the loop's bound and the factors_ahead test compare with it)
        if steps > 0:
            kv_pipe.consumer_wait(ws.ring_state(1, Int32(0)))
        for it in cutlass.range(steps, unroll=1):
            m, bn, q0 = tile.step(it, TILE_M)
            step = QueryStep(it, m, bn, q0, it % self.q_stage, it % 2, ws.ring_state(self.q_stage, it))
            self._issue_sdp_phase(ops, q_pipe, frag, regs, t, tile, step, steps)
            self._p_phase(sm, regs, t, tile, step)
            self._dv_phase(frag, regs, step)
            self._ds_phase(sm, frag, regs, t, step)
            self._dk_dq_phase(frag, regs, t, tile, step, dq)
            cute.nvgpu.warpgroup.wait_group(0)
            q_pipe.consumer_release(step.state)
            if cutlass.const_expr(not self.config.dq_first):  # (dq_first: stored under the dK wgmma)
                self._store_dq_tile(regs, t, tile, step, dq)
        if cutlass.const_expr(self.dq_writer):
            pass  # the writer warp waits for the last reductions
        elif cutlass.const_expr(self.tma_dq):
            bulk_wait()  # "tma_warp": every warp's last reductions, before the CTA's shared memory goes away
        self._epilogue(regs, t, tile, dq.scale, tDKgDK, tDVgDV)

    # ------------------------------------------------------------------------------------ set-up (per CTA)
    def _fragments(self, ops, sm, tid) -> ConsumerFragments:
        """The wgmma fragments of thread tid: S^T, dP^T (FP8 copies with sdp_fp8), dV, dK, dQ."""
        sdp_mma, dkv_mma, dq_mma = ops.mma
        thr_sdp = sdp_mma.get_slice(tid)
        thr_dkv = dkv_mma.get_slice(tid)
        thr_dq = dq_mma.get_slice(tid if self.dq_split else tid % 128)
        # transposed (MN-major) views of the K-major tiles, and dS^T for the register -> smem store
        transposed = lambda x, layout: cute.make_tensor(x.iterator, cute.select(layout.outer, mode=[1, 0, 2]))
        sQt, sdOt = transposed(sm.q, ops.smem.q), transposed(sm.do, ops.smem.q)
        sKt, sdSt = transposed(sm.k, ops.smem.k), transposed(sm.ds, ops.smem.ds)
        sQa, sdOa, sKa, sVa = sm.fp8 if self.sdp_fp8 else (sm.q, sm.do, sm.k, sm.v)  # S^T's and dP^T's
        s_k = sdp_mma.make_fragment_A(thr_sdp.partition_A(sKa))
        s_q = sdp_mma.make_fragment_B(thr_sdp.partition_B(sQa))
        dp_v = sdp_mma.make_fragment_A(thr_sdp.partition_A(sVa))
        dp_do = sdp_mma.make_fragment_B(thr_sdp.partition_B(sdOa))
        dv_mma = self._dv_mma()  # dkv_mma's, or its float16 twin (dv_f16)
        thr_dv = dv_mma.get_slice(tid)
        dv_do = dv_mma.make_fragment_B(thr_dv.partition_B(sdOt))
        dk_q = dkv_mma.make_fragment_B(thr_dkv.partition_B(sQt))
        dq_ds = dq_mma.make_fragment_A(thr_dq.partition_A(sm.ds))
        dq_k = dq_mma.make_fragment_B(thr_dq.partition_B(sKt))
        ds_store = thr_sdp.partition_C(sdSt)
        dk_ds, dk_q_ss = None, None
        if cutlass.const_expr(self.dk_ss):
            # dK's A = dSq^T (keys, queries) from the dS tile: K-major as the transposed view of sdS
            dk_mma = self._dk_mma()
            thr_dk = dk_mma.get_slice(tid)
            dk_ds = dk_mma.make_fragment_A(thr_dk.partition_A(sdSt))
            dk_q_ss = dk_mma.make_fragment_B(thr_dk.partition_B(sQt))
        return ConsumerFragments(
            thr_sdp, thr_dkv, thr_dq, thr_dv, s_k, s_q, dp_v, dp_do, dv_do, dk_q, dq_ds, dq_k, ds_store, dk_ds, dk_q_ss
        )

    def _registers(self, frag: ConsumerFragments) -> ConsumerRegisters:
        """The register tensors (accumulator shapes from the MMAs' thread slices)."""
        h = self.h
        thr_sdp, thr_dkv, thr_dq, thr_dv = frag.thr_sdp, frag.thr_dkv, frag.thr_dq, frag.thr_dv
        sdp_c, dkv_a = thr_sdp.partition_shape_C((CTA_N, TILE_M)), thr_dkv.partition_shape_A((CTA_N, TILE_M))
        rmem = cute.make_rmem_tensor
        acc_s, acc_dp = rmem(sdp_c, Float32), rmem(sdp_c, Float32)
        acc_dv = rmem(thr_dkv.partition_shape_C((CTA_N, h)), Float32)
        acc_dk = rmem(thr_dkv.partition_shape_C((CTA_N, h)), Float32)
        acc_dq = rmem(thr_dq.partition_shape_C((TILE_M, h)), Float32)
        a_f32, a_fp8 = rmem(dkv_a, Float32), rmem(dkv_a, FP8)
        p_a = rmem(thr_dv.partition_shape_A((CTA_N, TILE_M)), self.do_dtype)
        ds_a, ds_c = rmem(dkv_a, BF16), rmem(sdp_c, BF16)
        lse2, dlt = rmem((16,), Float32), rmem((16,), Float32)
        f_s, f_dp, q_raw = rmem((2,), Float32), rmem((2,), Float32), rmem((4,), Float32)
        return ConsumerRegisters(
            acc_s, acc_dp, acc_dv, acc_dk, acc_dq, a_f32, a_fp8, p_a, ds_a, ds_c, lse2, dlt, f_s, f_dp, q_raw
        )

    @cute.jit
    def _thread_coords(self, ops, tile, regs, c, tid) -> ThreadCoords:
        """The thread's rows and columns, tau's forms and (sdp_fp8) its key factors; with factors_ahead the
        first tile's query-block factors are loaded here."""
        lane = tid % 32
        warp_wg = (tid % 128) // 32
        row_in = 16 * warp_wg + lane // 4  # this thread's accumulator rows: row_in, row_in + 8
        key0 = tile.n * CTA_N + c * WG_N + row_in  # its keys (S^T rows)
        col_in = 2 * (lane % 4)  # its query columns col_in + v0 + 8 nb of S^T / head-dim columns of dQ
        scale_log2 = ops.scale * Float32(LOG2E)
        # p_scaled: P is computed as 2^8 P (Pq's FP8 scale folded into the exponent), so dS comes out as
        # 2^8 dS and its square blocks as 2^8 dSq (the block scales absorb it): dQ's and dK's tau takes the
        # 2^-8 (exact), dV's accumulator holds 2^8 dV until the epilogue (_dq_target's scale)
        dv_unit = Float32(1.0)
        if cutlass.const_expr(self.p_scaled):
            dv_unit = Float32(1.0 / P_CONST)
        # sdp_fp8: the accumulators of S^T, dP^T are in units of the FP8 copies' row factors: this thread's
        # keys (one 32-key group) times each of its two 32-query blocks (f_s: tau log2(e) included via qs)
        k_f, v_f = Float32(1.0), Float32(1.0)
        if cutlass.const_expr(self.sdp_fp8):
            key_group = (tile.n * CTA_N + c * WG_N + 16 * warp_wg) // 32
            k_f, v_f = ops.fp8.ks[tile.bk, key_group], ops.fp8.vs[tile.bk, key_group]
            if cutlass.const_expr(self.config.factors_ahead):
                if tile.steps > 0:
                    m1, bn1, _ = tile.step(Int32(0), TILE_M)
                    self._load_raw_factors(ops.fp8, bn1, m1, regs.q_raw)
        pair_barrier = AMAX_BARRIER0 + c * 2 + warp_wg // 2
        return ThreadCoords(c, lane, warp_wg, row_in, key0, col_in, scale_log2, dv_unit, k_f, v_f, pair_barrier)

    @cute.jit
    def _dq_target(self, ops, sm, tile, c, t, dq_mode) -> DqTarget:
        """Where this consumer's dQ tiles go (attention_bwd_dq_reduce.DqTarget)."""
        h = self.h
        scale = ops.scale
        if cutlass.const_expr(self.p_scaled):
            scale = ops.scale * Float32(1.0 / P_CONST)
        col0 = Int32(0)
        if cutlass.const_expr(self.dq_split):
            col0 = c * (h // NUM_CONSUMERS)
        base = ops.dq.iterator.toint()
        tp = ops.dq.shape[0]
        if cutlass.const_expr(self.config.broadcast_q):
            # dq is (N, Tp * H), the one query's: every batch row b adds into it. Query head bn = b N + j of
            # this CTA maps to dq head j = bn - b N, so rebase once: base - b N Tp H floats (bn0 = b N + kv G).
            base = base - Int64(tile.bn0 - tile.bn0 % ops.dq.shape[2]) * Int64(tp) * Int64(h * 4)
        tma = None
        if cutlass.const_expr(self.tma_dq):
            tma = self.partition_dq_tma(ops.dq_tma.atom, ops.dq_tma.tensor, sm.dq)
        return DqTarget(base, sm.dq_base, tp, col0, scale, tma, dq_mode)

    # ------------------------------------------------------------------------------- the phases of a step
    @cute.jit
    def _issue_sdp_phase(self, ops, q_pipe, frag, regs, t, tile, step, steps):
        """S^T = K Q^T and dP^T = V dO^T of the step's stage, one commit group each (after the stage's wait;
        without smem_stats the LSE / delta loads go first); sdp_fp8's query-block factors load under them."""
        if cutlass.const_expr(not self.smem_stats):
            self._load_stats(ops.lse, ops.delta, step.bn, step.q0 + t.col_in, regs.lse2, regs.dlt)
        q_pipe.consumer_wait(step.state)
        cute.nvgpu.warpgroup.fence()
        self._gemm(
            self._sdp_mma, regs.acc_s, frag.s_k[None, None, None, 0], frag.s_q[None, None, None, step.stage], False
        )
        cute.nvgpu.warpgroup.commit_group()
        self._gemm(
            self._sdp_mma, regs.acc_dp, frag.dp_v[None, None, None, 0], frag.dp_do[None, None, None, step.stage], False
        )
        cute.nvgpu.warpgroup.commit_group()
        if cutlass.const_expr(self.sdp_fp8 and self.config.factors_ahead):
            # the factors loaded a step ago (no global-load latency here); the next tile's loads now
            self._key_factors(regs.q_raw, t.k_f, t.v_f, regs.f_s, regs.f_dp)
            if step.it + 1 < steps:
                m1, bn1, _ = tile.step(step.it + 1, TILE_M)
                self._load_raw_factors(ops.fp8, bn1, m1, regs.q_raw)
        elif cutlass.const_expr(self.sdp_fp8):
            # the tile's query-block factors (uniform loads, under the S^T / dP^T wgmmas)
            q_raw = cute.make_rmem_tensor((4,), Float32)
            self._load_raw_factors(ops.fp8, step.bn, step.m, q_raw)
            self._key_factors(q_raw, t.k_f, t.v_f, regs.f_s, regs.f_dp)

    @cute.jit
    def _p_phase(self, sm, regs, t, tile, step):
        """After S^T's wait: P^T = exp2(min(S tau log2e - LSE log2e, 0)) (NaN kept; 0 where masked) in acc_s,
        and Pq^T (dV's A fragment) in p_a. stats_early: the LSE loads issued under the S^T wgmma instead of
        after its wait (not delta under dP^T: its 16 registers live across the P phase raise the H128 spills)."""
        if cutlass.const_expr(self.smem_stats and self.stats_early):
            self._read_stats(sm.stats, step.stage, t.col_in, regs.lse2, True)
        cute.nvgpu.warpgroup.wait_group(1)
        if cutlass.const_expr(self.smem_stats and not self.stats_early):
            self._read_stats(sm.stats, step.stage, t.col_in, regs.lse2, True)
        qcol0 = step.q0 + t.col_in  # this thread's first query column
        self._probabilities(regs.acc_s, regs.lse2, t.scale_log2, regs.f_s)
        self.mask.apply_transposed(regs.acc_s, tile.n, step.m, t.key0, qcol0, tile.q_len, tile.kv_len, tile.shift)
        self._quantize_p(regs)

    @cute.jit
    def _dv_phase(self, frag, regs, step):
        """dV += Pq^T dO (one commit group); then waits for dP^T (wait_group(1): dV stays in flight)."""
        cute.nvgpu.warpgroup.fence()
        wgmma.gemm(self._dv_mma, regs.acc_dv, regs.p_a, frag.dv_do[None, None, None, step.stage], True)
        cute.nvgpu.warpgroup.commit_group()
        cute.nvgpu.warpgroup.wait_group(1)

    @cute.jit
    def _ds_phase(self, sm, frag, regs, t, step):
        """dS^T = P^T (dP^T - delta) in acc_dp, quantized in 32x32 square blocks (the warp pair's amax through
        shared memory), to dK's A fragment (unless dk_ss) and to the dS tile in shared memory (buffer buf)."""
        if cutlass.const_expr(self.smem_stats):
            self._read_stats(sm.stats, step.stage, t.col_in, regs.dlt, False)
        for i in cutlass.range_constexpr(32):
            v0, _, nbk = acc_coords(i)
            dp = regs.acc_dp[i]
            if cutlass.const_expr(self.sdp_fp8):
                dp = dp * regs.f_dp[nbk // 4]
            regs.acc_dp[i] = regs.acc_s[i] * (dp - regs.dlt[v0 + 2 * nbk])
        quantize_ds_square(regs.acc_dp, sm.amax, step.buf, t.c, t.warp_wg, t.lane, t.pair_barrier, self.redux)
        if cutlass.const_expr(not self.dk_ss):  # dK's A fragment (dk_ss: read from the dS tile instead)
            for i in cutlass.range_constexpr(32):
                regs.a_f32[i] = regs.acc_dp[i]
            regs.ds_a.store(regs.a_f32.load().to(BF16))
        regs.ds_c.store(regs.acc_dp.load().to(BF16))
        cute.autovec_copy(regs.ds_c, frag.ds_store[None, None, None, step.buf])
        cute.arch.fence_view_async_shared()

    @cute.jit
    def _dk_dq_phase(self, frag, regs, t, tile, step, dq):
        """dK += dSq^T Q and dQ = dSq K once both consumers' dS is in shared memory (the 256-thread dS barrier;
        the TMA dQ stores first make sure the previous tile's staging has been read). dq_first: dQ's wgmma
        first and its store while dK's runs (wait_group(1)); otherwise dK first, dQ stored after the step."""
        if cutlass.const_expr(self.dq_writer):
            # the writer warp has read the previous tile's staging tile out (its stagers only)
            if cutlass.const_expr(self.dq_split):
                cute.arch.barrier(barrier_id=DQ_EMPTY_BARRIER, number_of_threads=self.dq_writer_threads())
            elif t.c == 0:
                cute.arch.barrier(barrier_id=DQ_EMPTY_BARRIER, number_of_threads=self.dq_writer_threads())
        elif cutlass.const_expr(self.tma_dq):
            # the previous tile's TMA reduce has read the staging tile: after the dS barrier every thread may
            # overwrite it (no barrier of its own before the staging stores); every warp issued its own
            bulk_wait_read()
        cute.arch.barrier(barrier_id=DS_BARRIER, number_of_threads=NUM_CONSUMERS * ws.WARPGROUP_THREADS)
        cute.nvgpu.warpgroup.fence()
        if cutlass.const_expr(self.config.dq_first):
            # the H64 consumer 1 has only dK's group, waited by the step's wait_group(0)
            self._issue_dq(frag, regs, t, step)
            self._issue_dk(frag, regs, step)
            cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(1)
            self._store_dq_tile(regs, t, tile, step, dq)
        else:
            self._issue_dk(frag, regs, step)
            cute.nvgpu.warpgroup.commit_group()
            self._issue_dq(frag, regs, t, step)

    @cute.jit
    def _store_dq_tile(self, regs, t, tile, step, dq):
        """The query tile's dQ (tau applied) into dq: each consumer its head-dim half at H128, consumer 0 at H64."""
        if cutlass.const_expr(self.dq_split):
            self.store_dq(regs.acc_dq, dq, step.bn, step.q0, t.row_in, t.col_in, tile.q_len, t.c, t.warp_wg, t.lane)
        else:
            if t.c == 0:
                self.store_dq(regs.acc_dq, dq, step.bn, step.q0, t.row_in, t.col_in, tile.q_len, t.c, t.warp_wg, t.lane)

    @cute.jit
    def _epilogue(self, regs, t, tile, dq_tau, tDKgDK, tDVgDV):
        """dK = tau acc_dk, dV = acc_dv (2^-8 with p_scaled), rows >= kv_len 0, stored once per CTA."""
        for i in cutlass.range_constexpr(cute.size(regs.acc_dk)):
            _, v1, _ = acc_coords(i)
            live = t.key0 + 8 * v1 < tile.kv_len
            regs.acc_dk[i] = cutlass.select_(live, regs.acc_dk[i] * dq_tau, Float32(0.0))
            regs.acc_dv[i] = cutlass.select_(live, regs.acc_dv[i] * t.dv_unit, Float32(0.0))
        cute.autovec_copy(regs.acc_dk, tDKgDK)
        cute.autovec_copy(regs.acc_dv, tDVgDV)

    # ------------------------------------------------------------------------------------ the pieces
    @cute.jit
    def _issue_dq(self, frag, regs, t, step):
        """dQ = dSq K of dS buffer buf over the CTA's 128 keys, one commit group (H128: this consumer's
        head-dim half; H64: consumer 0 only)."""
        if cutlass.const_expr(self.dq_split):
            self._gemm(
                self._dq_mma, regs.acc_dq, frag.dq_ds[None, None, None, step.buf], frag.dq_k[None, None, None, 0], False
            )
            cute.nvgpu.warpgroup.commit_group()
        else:
            if t.c == 0:
                self._gemm(
                    self._dq_mma,
                    regs.acc_dq,
                    frag.dq_ds[None, None, None, step.buf],
                    frag.dq_k[None, None, None, 0],
                    False,
                )
                cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def _issue_dk(self, frag, regs, step):
        """dK += dSq^T Q of this tile (no commit): A from the registers (ds_a) or, dk_ss, from dS buffer buf in
        shared memory (after the barrier that follows its stores)."""
        if cutlass.const_expr(self.dk_ss):
            wgmma.gemm(
                self._dk_mma,
                regs.acc_dk,
                frag.dk_ds[None, None, None, step.buf],
                frag.dk_q_ss[None, None, None, step.stage],
                True,
            )
        else:
            wgmma.gemm(self._dkv_mma, regs.acc_dk, regs.ds_a, frag.dk_q[None, None, None, step.stage], True)

    @cute.jit
    def _quantize_p(self, regs):
        """Pq = E4M3_satfinite(P 2^8) 2^-8 as dV's A operand (the A fragment's order is the accumulator's);
        p_scale "block": per 32 queries of each key, on P's own scale (quantize_p_blocks); p_scaled: acc_s
        already holds 2^8 P, and Pq stays in 2^8 units (no multiplies); dv_f16 (needs p_scaled): E4M3 ->
        float16 is exact (cvt.f16x2.e4m3x2 per pair), no float32 round trip."""
        acc_s, a_f32, a_fp8, p_a = regs.acc_s, regs.a_f32, regs.a_fp8, regs.p_a
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

    def _p_log2(self) -> float:
        """log2 of the unit P is computed in: 8 with p_scaled (2^8 P, folded into LSE log2(e) as -8), else 0."""
        return 8.0 if self.p_scaled else 0.0

    @cute.jit
    def _probabilities(self, acc_s, lse2, scale_log2, f_s):
        """acc_s (S^T, keys x queries) -> P^T = exp2(min(S tau log2e - LSE log2e, 0)) (NaN kept); LSE = -inf
        rows come in as lse2 = +inf (P = 0). sdp_fp8: acc_s is in the FP8 copies' units, f_s[query block] =
        tau log2(e) 2^(eQ + eK) replaces scale_log2. The masks are the caller's (AttentionMask)."""
        p_log2 = self._p_log2()  # lse2 carries -p_log2: P 2^p_log2 <= 2^p_log2
        for i in cutlass.range_constexpr(32):
            v0, _, nbk = acc_coords(i)
            mult = scale_log2
            if cutlass.const_expr(self.sdp_fp8):
                mult = f_s[nbk // 4]
            x = acc_s[i] * mult - lse2[v0 + 2 * nbk]
            acc_s[i] = cute.math.exp2(cute.arch.fmin(x, Float32(p_log2), nan=True), fastmath=True)

    @cute.jit
    def _load_raw_factors(self, fp8, bn, m, q_raw):
        """Query tile m's two 32-query-block factors of Q and dO as loaded (q_raw: qs, qs, dos, dos)."""
        for qb in cutlass.range_constexpr(2):
            q_raw[qb] = fp8.qs[bn, 2 * m + qb]
            q_raw[2 + qb] = fp8.dos[bn, 2 * m + qb]

    @cute.jit
    def _key_factors(self, q_raw, k_f, v_f, f_s, f_dp):
        """f_s = (qs) ks, f_dp = (dos) vs for the two query blocks of q_raw (_load_raw_factors' layout)."""
        for qb in cutlass.range_constexpr(2):
            f_s[qb] = q_raw[qb] * k_f
            f_dp[qb] = q_raw[2 + qb] * v_f

    @cute.jit
    def _load_stats(self, mLse, mDelta, bn, qcol0, lse2, dlt):
        """This thread's 16 query columns qcol0 + v0 + 8 nb: LSE * log2(e) (+inf for LSE = -inf: P = 0) and
        delta, from global memory."""
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

    def _gemm(self, make_mma, acc, a, b, accumulate_first: bool):
        """acc (+)= a b over the K blocks (16 per BF16 wgmma) on a fresh tiled MMA; fence/commit/wait are the
        caller's."""
        wgmma.gemm(make_mma, acc, a, b, accumulate_first)
