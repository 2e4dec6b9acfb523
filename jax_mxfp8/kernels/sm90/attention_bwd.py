"""MXFP8 attention backward for Hopper (sm_90a), CuTe DSL, compiled ahead of time (v1: BF16 wgmma).

Supported (kernels/registry/attention_bwd.py, AttentionBwdConfig): head_dim 64 and 128; non-causal or causal
(top-left); GQA/MQA (query head n reads KV head n // G); per-batch query and KV lengths (dense padded batch);
p_scale "const"; dq_accum "fp32" and "fp16" (dQ * 2^e in float16), deterministic or not (the dQ modes:
kernels/sm90/attention_bwd_dq.py); one query sequence for every batch row (config.broadcast_q, dq_accum
"fp32", not deterministic: q and dq of batch 1, Q loaded by the producer at batch 0, every batch row's dQ
added into batch 0's dq; dO, LSE, delta per row). Not here (the XLA reference takes them):
p_scale "block", packed sequences, bias / boolean masks.

Operands (the FFI call jax_mxfp8_attention_bwd, /work/coord/ATTN_BWD_INTERFACE.md; the handler passes
each (B, heads, L, H) buffer as a 2-D (B * heads, L * H) row-major view, so the kernel reads N, K, Tp, Sp
from the shapes):
  q     (B*N, Tp*H)  bfloat16  Q^ head-major (b, n, t); Tp = T rounded up to 128; rows >= q_len are 0
  k     (B*K, Sp*H)  bfloat16  K^ head-major (b, kv, s); Sp = S rounded up to 128; rows >= kv_len are 0
  v     (B*K, Sp*H)  bfloat16  V^
  do    (B*N, Tp*H)  bfloat16  dO^ (square-quantized, dequantized; rows >= q_len 0)
  lse   (B*N, Tp)    float32   natural-log LSE of the forward; -inf on rows >= q_len
  delta (B*N, Tp)    float32   rowsum(dO * O) - dLSE; 0 on padding rows
  lens  (2, B)       int32     query lengths, KV lengths
  scale              float32   tau (kernel argument)
Outputs:
  dq    (B*N, Tp*H)  float32   accumulated by float32 reductions: the caller (the FFI handler) zero-fills it
                     (float16 dQ * 2^e for dq_accum "fp16"; broadcast_q: (N, Tp*H), the sum over the B rows)
  dq_sem (B*N, Tp/32) int32    dQ modes only: the deterministic mode's counters (zero-filled by the caller)
  dq_scale           float32   dQ modes only: tau 2^e (kernel argument)
  dk    (B*K, Sp*H)  float32   written once per CTA, rows >= kv_len 0
  dv    (B*K, Sp*H)  float32

Numerics (the contract, reference/attention_bwd.py): every operand is an MX value (E4M3 x 2^e), exact in
bfloat16, so BF16 wgmma with float32 accumulation forms exact products; the five GEMMs all run on BF16
wgmma (no FP8 transposes):
  S^T  = K Q^T                                   (SS, both K-major)
  P^T  = exp2(min(S^T tau log2(e) - LSE log2(e), 0)); 0 where masked or LSE = -inf (NaN propagates)
  Pq^T = E4M3_satfinite(P^T 2^8) 2^-8            (p_scale "const")
  dP^T = V dO^T                                  (SS, both K-major)
  dS^T = P^T (dP^T - delta)
  dSq  = 32x32 square blocks over (key, query), scale rule "up", E4M3 satfinite (bit-exact formula of
         formats/quantize.py; kernels/common/ptx.py scale_and_factor / quantize4_f32)
  dV  += Pq^T dO                                 (RS: Pq^T from registers, dO^T an MN-major view of sdO)
  dK  += dSq^T Q                                 (RS: dSq^T from registers, Q^T an MN-major view of sQ)
  dQ   = dSq K  (per query tile), times tau, added into dq (config.dq_store: "bulk", production at H128, stages the
         tile in shared memory and issues one 256-byte cp.reduce.async.bulk .add.f32 per row; "red" issues
         red.global.add.f32 per element)
  dK *= tau at the end.
A 32-key block of dS spans two warps of a consumer warpgroup (16 keys each): the two warps exchange their
block amax through shared memory (a 64-thread named barrier per warp pair).

Structure (FA2/FA3-style, KV-stationary; grid (Sp / 128, B * K), one CTA per (128-key tile, batch and KV
head), 3 warpgroups):
  WG0   producer: one warp issues TMA for the K and V tiles (once), then Q and dO of every (query head g of
        the group, 64-row query tile m) into a ring of config.q_stage stages, 24 registers.
  WG1/2 consumers (240 registers), 64 keys each (wgmma M = 64): S^T, dP^T, dV, dK per query tile; dS^T
        goes to shared memory (double-buffered), then dQ (64 x H) = dS K is split over the two
        consumers by head-dim halves (H128; at H64 the first consumer computes all of it).
  Causal: query tiles entirely above this KV tile's diagonal are skipped; tiles past q_len are skipped.
  Tunings (registry TUNINGS, non-production): config.overlap issues the next tile's S^T (1; 2: and dP^T)
  between this tile's dQ staging and its bulk reductions, waited at the end of the same step: no wgmma
  group may stay in flight across the loop's back edge, nor may the accumulators' initial values be
  materialized inside an open wgmma stage, or ptxas serializes EVERY wgmma of the kernel (C7514/C7515;
  check the SASS: one WARPGROUP.DEPBAR per wait, not per HGMMA). config.smem_stats: the producer copies
  the tile's LSE and delta into the Q / dO stage (cp.async.bulk), read from shared memory where used
  (production at H128). config.amax_reduce "redux": the dS block amax's warp reduction as one redux.sync
  after a tree max; config.stats_early: the LSE loads issued under the S^T wgmma. config.dq_keys "own":
  each consumer's dQ over its own 64 keys and all H columns (H128: two 64-column wgmmas in sequence, one
  accumulator), behind its own 128-thread barrier instead of the 256-thread dS barrier: the consumers run
  independently, at twice the dQ reductions. config.dq_red_width 2: red.global.add.v2.f32.
Building blocks: kernels/sm90/attention_bwd_blocks.py (dS square quantization, dQ store PTX), warp_specialization,
wgmma, wgmma_fragment (acc_coords).

Measured on the H200 (docs/perf-notes.md "Attention backward (sm90)", tests/test_attention_bwd_kernel_gpu.py):
dq, dk, dv 68-156 dB SQNR against the XLA reference, their float64 SQNR equal to the reference's to 0.01 dB;
production (registry PRODUCTION: at H128 smem_stats + redux + stats_early + dq_store "red" with
dq_red_width 2; at H64 dq_store "red") 349.6 TFLOP/s at B4 T4k N16 H128 non-causal (307.5 causal), 0.67x /
0.72x cuDNN BF16's backward; H64 208.5 (run 12). Latency-bound (ncu of smem_stats alone: 0.28 IPC per
scheduler; its largest wait was the dQ bulk reductions' one-lane-at-a-time issue loop on warp 0, which the
8-byte atomics remove).
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.nvgpu.warpgroup import OperandMajorMode, OperandSource

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.registry import AttentionBwdConfig
from jax_mxfp8.kernels.sm90 import warp_specialization as ws
from jax_mxfp8.kernels.sm90 import wgmma
from jax_mxfp8.kernels.sm90.attention_bwd_blocks import (
    bulk_commit,
    bulk_load,
    bulk_reduce_add_f32,
    bulk_wait,
    bulk_wait_read,
    quantize_ds_square,
    red_add_f32,
    red_add_v2_f32,
    red_add_v4_f32,
    st_shared_v2_f32,
)
from jax_mxfp8.kernels.sm90.attention_bwd_dq import store_dq_mode
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords

BF16 = cutlass.BFloat16
FP8 = cutlass.Float8E4M3FN
TILE_M = 64  # query rows per step
NUM_CONSUMERS = 2
WG_N = 64  # keys per consumer warpgroup
CTA_N = WG_N * NUM_CONSUMERS  # keys per CTA (the reference's kv_tile)
LOG2E = math.log2(math.e)
P_CONST = 256.0  # p_scale "const": P stored as E4M3(P * 2^8)
DS_BARRIER = 1  # named barrier: dS tile written by both consumers (256 threads)
AMAX_BARRIER0 = 2  # named barriers 2..5: one per warp pair (64 threads), the dS block amax exchange
DQ_BARRIER0 = 6  # named barriers 6, 7: one per consumer (128 threads), its dQ staging tile (dq_store "bulk")
DS_OWN_BARRIER0 = 8  # dq_keys "own": named barriers 8, 9, one per consumer (128 threads), its own dS keys


class AttentionBackwardSm90:
    """Host entry: (q, k, v, do, lse, delta, lens, dq, dk, dv, scale, stream); module docstring for shapes."""

    def __init__(self, config: AttentionBwdConfig):
        self.config = config
        self.h = config.head_dim
        self.q_stage = config.q_stage
        # dq_keys "own": each consumer's dQ over its own 64 keys, all H columns (no 256-thread dS barrier)
        self.dq_own = config.dq_keys == "own"
        # "cta": dQ's head-dim halves on the two consumers; H64: consumer 0 only
        self.dq_split = self.h == 128 and not self.dq_own
        # "own": 64 head-dim columns per dQ wgmma (H128: two in sequence; a 64 x 128 float32 accumulator
        # next to dV and dK does not fit the registers: ptxas serializes every wgmma, C7512)
        self.dq_halves = self.h // 64 if self.dq_own else 1
        self.redux = config.amax_reduce == "redux"
        self.stats_early = config.stats_early
        self.bulk_dq = config.dq_store == "bulk"
        self.dq_mode = config.dq_mode  # float16 dq and / or ordered adds (kernels/sm90/attention_bwd_dq.py)
        self.overlap = config.overlap
        self.smem_stats = config.smem_stats
        # smem_stats: per Q / dO stage, the tile's 64 LSE then 64 delta values (float32), by cp.async.bulk
        self.stats_bytes = 2 * TILE_M * 4
        # dq_store "bulk": the dQ tile (64 rows x H float32) in shared memory, rows padded by 32 bytes so that
        # the accumulator's 8-byte stores (8 rows x 4 column pairs per warp) take 2 wavefronts
        self.dq_pitch = self.h * 4 + 32
        self.sdp_tiler = (CTA_N, TILE_M, self.h)  # S^T, dP^T: M = keys, N = queries, K = H
        self.dkv_tiler = (CTA_N, self.h, TILE_M)  # dV, dK: M = keys, N = H, K = queries
        self.dq_tiler = (TILE_M, self.h, CTA_N)  # dQ: M = queries, N = H, K = keys
        self.threads = ws.WARPGROUP_THREADS * (1 + NUM_CONSUMERS)
        ws.check_register_budget(NUM_CONSUMERS)

    # ------------------------------------------------------------------------------------------------
    # AOT interface (tools/build_kernels.py)
    # ------------------------------------------------------------------------------------------------

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        def t(dtype, rows, cols):
            return make_fake_compact_tensor(dtype, (rows, cols), stride_order=(1, 0), assumed_align=16)

        s = cute.sym_int32
        rows_h = 128 * self.h  # Tp * H and Sp * H are multiples of 128 H
        dq_t = cutlass.Float16 if self.config.dq_accum == "fp16" else Float32  # "fp16": dQ * 2^e
        # the dQ modes' extra operands: dq_sem (B*N, Tp/32) int32 after dv, dq_scale (tau 2^e) after scale
        sem = (t(Int32, s(), s(divisibility=4)),) if self.dq_mode else ()
        dq_scale = (Float32(1.0),) if self.dq_mode else ()
        return (
            t(BF16, s(), s(divisibility=rows_h)),  # q (B*N, Tp*H)
            t(BF16, s(), s(divisibility=rows_h)),  # k (B*K, Sp*H)
            t(BF16, s(), s(divisibility=rows_h)),  # v
            t(BF16, s(), s(divisibility=rows_h)),  # do
            t(Float32, s(), s(divisibility=128)),  # lse (B*N, Tp)
            t(Float32, s(), s(divisibility=128)),  # delta
            t(Int32, s(), s()),  # lens (2, B)
            t(dq_t, s(), s(divisibility=rows_h)),  # dq (B*N, Tp*H)
            t(Float32, s(), s(divisibility=rows_h)),  # dk (B*K, Sp*H)
            t(Float32, s(), s(divisibility=rows_h)),  # dv
            *sem,
            Float32(1.0),  # scale (tau)
            *dq_scale,
            make_fake_stream(),
        )

    def tensor_names(self) -> tuple[str, ...]:
        names = ("q", "k", "v", "do", "lse", "delta", "lens", "dq", "dk", "dv")
        return names + ("dq_sem",) if self.dq_mode else names

    def entry(self):
        return self.launch_dq if self.dq_mode else self.launch

    # ------------------------------------------------------------------------------------------------
    # Host side
    # ------------------------------------------------------------------------------------------------

    def _sdp_mma(self) -> cute.TiledMma:
        """S^T = K Q^T and dP^T = V dO^T: A (keys, H) and B (queries, H) both K-major in shared memory; the
        two consumers take 64-key halves (thread t in [0, 256) covers keys 64 (t // 128) ..)."""
        k = OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(BF16, BF16, k, k, Float32, (NUM_CONSUMERS, 1, 1), (WG_N, TILE_M))

    def _dkv_mma(self) -> cute.TiledMma:
        """dV += Pq^T dO, dK += dSq^T Q: A (keys, queries) in registers, B (H, queries) an MN-major view of
        sdO / sQ; 64-key halves as _sdp_mma."""
        return sm90_utils.make_trivial_tiled_mma(
            BF16, BF16, OperandMajorMode.K, OperandMajorMode.MN, Float32, (NUM_CONSUMERS, 1, 1), (WG_N, self.h),
            OperandSource.RMEM,
        )  # fmt: skip

    def _dq_mma(self) -> cute.TiledMma:
        """dQ = dSq K: A (queries, keys) MN-major in shared memory (sdS), B (H, keys) an MN-major view of sK.
        H128: the consumers take head-dim halves (thread t covers columns 64 (t // 128) ..); H64: one."""
        mn = OperandMajorMode.MN
        if self.dq_own:  # one consumer's (64 queries, 64 head-dim columns) per wgmma
            return sm90_utils.make_trivial_tiled_mma(BF16, BF16, mn, mn, Float32, (1, 1, 1), (TILE_M, 64))
        if self.dq_split:
            return sm90_utils.make_trivial_tiled_mma(
                BF16, BF16, mn, mn, Float32, (1, NUM_CONSUMERS, 1), (TILE_M, self.h // NUM_CONSUMERS)
            )
        return sm90_utils.make_trivial_tiled_mma(BF16, BF16, mn, mn, Float32, (1, 1, 1), (TILE_M, self.h))

    def _smem_layouts(self):
        """Q / dO stages (64, H, q_stage) and K / V (128, H, 1), K-major; dS (64 queries, 128 keys, 2)
        query-major (M-major A of dQ), double-buffered."""
        kmajor = utils.LayoutEnum.ROW_MAJOR
        q_smem = sm90_utils.make_smem_layout_b(kmajor, self.sdp_tiler, BF16, self.q_stage)
        k_smem = sm90_utils.make_smem_layout_a(kmajor, self.sdp_tiler, BF16, 1)
        ds_smem = sm90_utils.make_smem_layout_a(utils.LayoutEnum.COL_MAJOR, self.dq_tiler, BF16, 2)
        return q_smem, k_smem, ds_smem

    def _shared_storage(self, q_smem, k_smem, ds_smem):
        """The kernel's shared-memory struct (plain Python: the smem_stats member exists only when used)."""
        fields = dict(
            q_mbar=cute.struct.MemRange[cutlass.Int64, self.q_stage * 2],
            kv_mbar=cute.struct.MemRange[cutlass.Int64, 2],
            amax=cute.struct.Align[cute.struct.MemRange[Uint32, 2 * 8 * 2], 16],  # (parity, warp, q block)
            sK=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(k_smem)], 1024],
            sV=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(k_smem)], 1024],
            sQ=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(q_smem)], 1024],
            sdO=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(q_smem)], 1024],
            sdS=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(ds_smem)], 1024],
            sdQ=cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self._sdq_bytes() if self.bulk_dq else 16], 128],
        )
        if self.smem_stats:  # (LSE, delta) x q_stage, float32
            words = self.q_stage * self.stats_bytes // 4
            fields["stats"] = cute.struct.Align[cute.struct.MemRange[Float32, words], 128]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def _sdq_bytes(self) -> int:
        """dq_store "bulk": the dQ staging tile(s), one per consumer with dq_keys "own"."""
        return TILE_M * self.dq_pitch * (NUM_CONSUMERS if self.dq_own else 1)

    @cute.jit
    def launch(
        self,
        q2: cute.Tensor,
        k2: cute.Tensor,
        v2: cute.Tensor,
        do2: cute.Tensor,
        lse: cute.Tensor,
        delta: cute.Tensor,
        lens: cute.Tensor,
        dq2: cute.Tensor,
        dk2: cute.Tensor,
        dv2: cute.Tensor,
        scale: Float32,
        stream: cuda.CUstream,
    ):
        """Grid (Sp / 128, B * K): one CTA per (128-key tile, batch and KV head)."""
        self._launch(q2, k2, v2, do2, lse, delta, lens, dq2, dk2, dv2, None, scale, None, stream)

    @cute.jit
    def launch_dq(
        self,
        q2: cute.Tensor,
        k2: cute.Tensor,
        v2: cute.Tensor,
        do2: cute.Tensor,
        lse: cute.Tensor,
        delta: cute.Tensor,
        lens: cute.Tensor,
        dq2: cute.Tensor,
        dk2: cute.Tensor,
        dv2: cute.Tensor,
        sem: cute.Tensor,
        scale: Float32,
        dq_scale: Float32,
        stream: cuda.CUstream,
    ):
        """The dQ modes' entry (config.dq_mode): launch's operands plus dq_sem and dq_scale."""
        self._launch(q2, k2, v2, do2, lse, delta, lens, dq2, dk2, dv2, sem, scale, dq_scale, stream)

    def _launch(self, q2, k2, v2, do2, lse, delta, lens, dq2, dk2, dv2, sem, scale, dq_scale, stream):
        """launch's body (traced inside launch / launch_dq); sem, dq_scale None outside the dQ modes."""
        h = self.h
        bn = q2.shape[0]
        q_heads = bn
        if cutlass.const_expr(self.config.broadcast_q):
            bn = do2.shape[0]  # q holds one batch row (N heads); dO, dq, LSE and delta have B * N
        tp = q2.shape[1] // h
        bk = k2.shape[0]
        sp = k2.shape[1] // h

        def rows(x, length, heads):  # (rows, H, heads) view of a (heads, rows * H) buffer
            return cute.make_tensor(x.iterator, cute.make_layout((length, h, heads), stride=(h, 1, length * h)))

        q, do, dq = rows(q2, tp, q_heads), rows(do2, tp, bn), rows(dq2, tp, q_heads)  # broadcast_q: dq batch 1
        k, v, dk, dv = rows(k2, sp, bk), rows(v2, sp, bk), rows(dk2, sp, bk), rows(dv2, sp, bk)

        sdp_mma, dkv_mma, dq_mma = self._sdp_mma(), self._dkv_mma(), self._dq_mma()
        q_smem, k_smem, ds_smem = self._smem_layouts()
        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        q_one = cute.slice_(q_smem, (None, None, 0))
        k_one = cute.slice_(k_smem, (None, None, 0))
        tma_q, tq = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, q, q_one, (TILE_M, h))
        tma_do, tdo = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, do, q_one, (TILE_M, h))
        tma_k, tk = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, k, k_one, (CTA_N, h))
        tma_v, tv = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, v, k_one, (CTA_N, h))
        self.q_bytes = cute.size_in_bytes(BF16, q_one)
        self.k_bytes = cute.size_in_bytes(BF16, k_one)

        self.shared_storage = self._shared_storage(q_smem, k_smem, ds_smem)
        self.kernel(
            sdp_mma, dkv_mma, dq_mma, tma_q, tq, tma_do, tdo, tma_k, tk, tma_v, tv,
            lse, delta, lens, dq, dk, dv, scale, q_smem, k_smem, ds_smem, sem, dq_scale,
        ).launch(
            grid=[sp // CTA_N, bk, 1],
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        sdp_mma: cute.TiledMma,
        dkv_mma: cute.TiledMma,
        dq_mma: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_do: cute.CopyAtom,
        mdO: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        mLse: cute.Tensor,
        mDelta: cute.Tensor,
        mLen: cute.Tensor,
        mdQ: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        scale: Float32,
        q_smem: cute.ComposedLayout,
        k_smem: cute.ComposedLayout,
        ds_smem: cute.ComposedLayout,
        mSem,
        dq_scale,
    ):
        """One CTA: key tile n (128 keys) of KV head bk = b * K + kv; loops over the G query heads of the
        group and the 64-row query tiles that can see this key tile."""
        tidx, _, _ = cute.arch.thread_idx()
        n, bk, _ = cute.arch.block_idx()
        nb = mLen.shape[1]
        n_kv = mdK.shape[2] // nb  # KV heads per batch row
        g_size = mLse.shape[0] // mdK.shape[2]  # query heads per KV head (LSE: B * N rows, also broadcast_q)
        b = bk // n_kv
        q_len = mLen[0, b]
        kv_len = mLen[1, b]
        m_start = Int32(0)
        if cutlass.const_expr(self.config.causal):
            m_start = n * (CTA_N // TILE_M)  # the first query tile holding a row >= this tile's first key
        n_m = (q_len + (TILE_M - 1)) // TILE_M - m_start
        if n * CTA_N >= kv_len:
            n_m = Int32(0)
        if n_m < 0:
            n_m = Int32(0)
        n_iter = g_size * n_m
        bn0 = bk * g_size  # query head of (b, kv, g) is b * N + kv * G + g = bk * G + g
        if cutlass.const_expr(self.dq_mode):
            # _store_dq's extra operands, kept off _consume's argument list (None outside the dQ modes)
            self.dq_extra = (mSem.iterator.toint(), dq_scale)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        consumer_warps = ws.WARPGROUP_WARPS * NUM_CONSUMERS
        q_tx = 2 * self.q_bytes + (self.stats_bytes if self.smem_stats else 0)
        q_pipe = ws.make_tma_pipeline(storage.q_mbar.data_ptr(), self.q_stage, consumer_warps, q_tx)
        kv_pipe = ws.make_tma_pipeline(storage.kv_mbar.data_ptr(), 1, consumer_warps, 2 * self.k_bytes)

        sQ = storage.sQ.get_tensor(q_smem.outer, swizzle=q_smem.inner)
        sdO = storage.sdO.get_tensor(q_smem.outer, swizzle=q_smem.inner)
        sK = storage.sK.get_tensor(k_smem.outer, swizzle=k_smem.inner)
        sV = storage.sV.get_tensor(k_smem.outer, swizzle=k_smem.inner)
        sdS = storage.sdS.get_tensor(ds_smem.outer, swizzle=ds_smem.inner)
        sAmax = storage.amax.get_tensor(cute.make_layout(2 * 8 * 2))
        sdq_base = storage.sdQ.data_ptr().toint()
        stats_base = Int32(0)
        sStats = sAmax  # (unused unless smem_stats)
        if cutlass.const_expr(self.smem_stats):
            stats_base = storage.stats.data_ptr().toint()
            # (query column, LSE / delta, stage)
            sStats = storage.stats.get_tensor(cute.make_layout((TILE_M, 2, self.q_stage)))

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)

        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if wg == 0:
            cute.arch.setmaxregister_decrease(ws.PRODUCER_REGISTERS)
            if warp == 0:
                self._produce(
                    tma_q, mQ, sQ, tma_do, mdO, sdO, tma_k, mK, sK, tma_v, mV, sV, q_pipe, kv_pipe,
                    n, bk, bn0, m_start, n_m, n_iter, mLse, mDelta, stats_base,
                )  # fmt: skip
        else:
            cute.arch.setmaxregister_increase(ws.CONSUMER_REGISTERS)
            self._consume(
                dkv_mma, sdp_mma, dq_mma, sQ, sdO, sK, sV, sdS, sAmax, q_pipe, kv_pipe,
                mLse, mDelta, mdQ, mdK, mdV, scale, n, bk, bn0, m_start, n_m, n_iter, q_len, kv_len,
                q_smem, k_smem, ds_smem, sdq_base, wg - 1, tidx - 128, sStats,
            )  # fmt: skip

    @cute.jit
    def _produce(
        self, tma_q, mQ, sQ, tma_do, mdO, sdO, tma_k, mK, sK, tma_v, mV, sV, q_pipe, kv_pipe,
        n, bk, bn0, m_start, n_m, n_iter, mLse, mDelta, stats_base,
    ):  # fmt: skip
        """Producer warp: K and V of key tile n (once), then Q and dO of every (head g, query tile m)
        (smem_stats: and that tile's 64 LSE and 64 delta values, by lane 0, on the stage's mbarrier)."""
        h = self.h

        def part(atom, g_tensor, s_tensor, tile):
            return cute.nvgpu.cpasync.tma_partition(
                atom,
                0,
                cute.make_layout(1),
                cute.group_modes(s_tensor, 0, 2),
                cute.group_modes(cute.flat_divide(g_tensor, tile), 0, 2),
            )

        tQsQ, tQgQ = part(tma_q, mQ, sQ, (TILE_M, h))
        tOsO, tOgO = part(tma_do, mdO, sdO, (TILE_M, h))
        tKsK, tKgK = part(tma_k, mK, sK, (CTA_N, h))
        tVsV, tVgV = part(tma_v, mV, sV, (CTA_N, h))
        if n_iter > 0:
            kv_prod = kv_pipe.make_producer()
            handle = kv_prod.acquire_and_advance()
            cute.copy(tma_k, tKgK[(None, n, 0, bk)], tKsK[(None, 0)], tma_bar_ptr=handle.barrier)
            cute.copy(tma_v, tVgV[(None, n, 0, bk)], tVsV[(None, 0)], tma_bar_ptr=handle.barrier)
            q_prod = q_pipe.make_producer()
            for i in cutlass.range(n_iter, unroll=1):
                g = i // n_m
                m = m_start + i - g * n_m
                handle = q_prod.acquire_and_advance()
                q_head = bn0 + g
                if cutlass.const_expr(self.config.broadcast_q):
                    q_head = q_head % mQ.shape[2]  # batch 0's head n: the one query sequence
                cute.copy(tma_q, tQgQ[(None, m, 0, q_head)], tQsQ[(None, handle.index)], tma_bar_ptr=handle.barrier)
                cute.copy(tma_do, tOgO[(None, m, 0, bn0 + g)], tOsO[(None, handle.index)], tma_bar_ptr=handle.barrier)
                if cutlass.const_expr(self.smem_stats):
                    if cute.arch.lane_idx() == 0:
                        offset = (Int64(bn0 + g) * Int64(mLse.shape[1]) + Int64(m * TILE_M)) * 4
                        dst = stats_base + handle.index * self.stats_bytes
                        mbar = handle.barrier.toint()
                        half = self.stats_bytes // 2
                        bulk_load(dst, mLse.iterator.toint() + offset, half, mbar)
                        bulk_load(dst + half, mDelta.iterator.toint() + offset, half, mbar)

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

        tSrK = sdp_mma.make_fragment_A(thr_sdp.partition_A(sK))
        tSrQ = sdp_mma.make_fragment_B(thr_sdp.partition_B(sQ))
        tPrV = sdp_mma.make_fragment_A(thr_sdp.partition_A(sV))
        tPrdO = sdp_mma.make_fragment_B(thr_sdp.partition_B(sdO))
        tVrdOt = dkv_mma.make_fragment_B(thr_dkv.partition_B(sdOt))
        tKrQt = dkv_mma.make_fragment_B(thr_dkv.partition_B(sQt))
        if cutlass.const_expr(self.dq_own):
            # this consumer's 64 keys of dS (queries x keys, per buffer) and of K^T (H x keys)
            tQrdS = dq_mma.make_fragment_A(thr_dq.partition_A(cute.local_tile(sdS, (TILE_M, WG_N), (0, c, None))))
            tQrKt = [
                dq_mma.make_fragment_B(thr_dq.partition_B(cute.local_tile(sKt, (64, WG_N), (hh, c, None))))
                for hh in range(self.dq_halves)
            ]
        else:
            tQrdS = dq_mma.make_fragment_A(thr_dq.partition_A(sdS))
            tQrKt = dq_mma.make_fragment_B(thr_dq.partition_B(sKt))
        tCsdS = thr_sdp.partition_C(sdSt)

        acc_s = cute.make_rmem_tensor(thr_sdp.partition_shape_C((CTA_N, TILE_M)), Float32)
        acc_dp = cute.make_rmem_tensor(thr_sdp.partition_shape_C((CTA_N, TILE_M)), Float32)
        acc_dv = cute.make_rmem_tensor(thr_dkv.partition_shape_C((CTA_N, h)), Float32)
        acc_dk = cute.make_rmem_tensor(thr_dkv.partition_shape_C((CTA_N, h)), Float32)
        acc_dq = cute.make_rmem_tensor(thr_dq.partition_shape_C((TILE_M, 64 if self.dq_own else h)), Float32)
        a_f32 = cute.make_rmem_tensor(thr_dkv.partition_shape_A((CTA_N, TILE_M)), Float32)
        a_fp8 = cute.make_rmem_tensor(thr_dkv.partition_shape_A((CTA_N, TILE_M)), FP8)
        p_a = cute.make_rmem_tensor(thr_dkv.partition_shape_A((CTA_N, TILE_M)), BF16)
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
        if cutlass.const_expr(self.dq_own and self.bulk_dq):
            sdq_base = sdq_base + c * (TILE_M * self.dq_pitch)  # this consumer's staging tile

        if cutlass.const_expr(not self.overlap):
            acc_dv.fill(0.0)
            acc_dk.fill(0.0)
        # overlap: no zero fill (the first step's dV, dK wgmmas do not accumulate): the fill's register moves
        # would land inside the prologue's S^T / dP^T pipeline stage, and ptxas then serializes every wgmma
        # (C7514/C7515); a CTA without a step writes zeros (the epilogue's `live`)
        if n_iter > 0:
            kv_pipe.consumer_wait(ws.ring_state(1, Int32(0)))
        for it in cutlass.range(n_iter, unroll=1):
            if cutlass.const_expr(self.overlap):
                # the first tile's S^T (overlap 1; 2: and dP^T), in the loop: no wgmma before it, so the
                # accumulators' initial values are not materialized inside an open wgmma stage. Later tiles'
                # are issued during the previous step's dQ store.
                if it == 0:
                    m1, bn1, q1 = self._tile(Int32(0), n_m, m_start, bn0)
                    if cutlass.const_expr(not self.smem_stats):
                        self._load_stats(mLse, mDelta, bn1, q1 + col_in, lse2, dlt)
                    q_pipe.consumer_wait(ws.ring_state(self.q_stage, Int32(0)))
                    self._issue_sdp(acc_s, acc_dp, tSrK, tSrQ, tPrV, tPrdO, Int32(0), self.overlap)
            m, bn, q0 = self._tile(it, n_m, m_start, bn0)
            stage = it % self.q_stage
            buf = it % 2
            state = ws.ring_state(self.q_stage, it)
            if cutlass.const_expr(not self.overlap):
                if cutlass.const_expr(not self.smem_stats):
                    self._load_stats(mLse, mDelta, bn, q0 + col_in, lse2, dlt)
                q_pipe.consumer_wait(state)
                self._issue_sdp(acc_s, acc_dp, tSrK, tSrQ, tPrV, tPrdO, stage, 0)
            if cutlass.const_expr(self.overlap == 1):
                self._issue_sdp(acc_s, acc_dp, tSrK, tSrQ, tPrV, tPrdO, stage, -1)  # dP^T only (S^T is in flight)
            # stats_early: the LSE loads (LDS) are issued under the S^T wgmma instead of after its wait (not
            # delta under dP^T: its 16 registers live across the P phase raise the H128 spills 5 -> 18)
            if cutlass.const_expr(self.smem_stats and self.stats_early):
                self._read_stats(sStats, stage, col_in, lse2, True)
            cute.nvgpu.warpgroup.wait_group(1)
            if cutlass.const_expr(self.smem_stats and not self.stats_early):
                self._read_stats(sStats, stage, col_in, lse2, True)
            self._probabilities(acc_s, lse2, scale_log2, key0, q0 + col_in, q_len, kv_len, n, m)
            # Pq = E4M3_satfinite(P 2^8) 2^-8, as dV's A operand (the A fragment's order is the accumulator's)
            for i in cutlass.range_constexpr(32):
                a_f32[i] = acc_s[i] * Float32(P_CONST)
            a_fp8.store(a_f32.load().to(FP8))
            a_f32.store(a_fp8.load().to(Float32))
            for i in cutlass.range_constexpr(32):
                a_f32[i] = a_f32[i] * Float32(1.0 / P_CONST)
            p_a.store(a_f32.load().to(BF16))
            cute.nvgpu.warpgroup.fence()
            self._gemm_acc(self._dkv_mma, acc_dv, p_a, tVrdOt[None, None, None, stage], it)
            cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(1)
            if cutlass.const_expr(self.smem_stats):
                self._read_stats(sStats, stage, col_in, dlt, False)
            for i in cutlass.range_constexpr(32):
                v0, _, nbk = acc_coords(i)
                acc_dp[i] = acc_s[i] * (acc_dp[i] - dlt[v0 + 2 * nbk])
            quantize_ds_square(acc_dp, sAmax, buf, c, warp_wg, lane, pair_barrier, self.redux)
            for i in cutlass.range_constexpr(32):
                a_f32[i] = acc_dp[i]
            ds_a.store(a_f32.load().to(BF16))
            ds_c.store(acc_dp.load().to(BF16))
            cute.autovec_copy(ds_c, tCsdS[None, None, None, buf])
            cute.arch.fence_view_async_shared()
            if cutlass.const_expr(self.dq_own):
                # dQ over this consumer's own keys after its own 128-thread barrier: nothing waits for the
                # other consumer. H128: the second half's wgmma after the first half's store (one 32-register
                # accumulator), the first half's store while dK runs.
                cute.arch.barrier(barrier_id=DS_OWN_BARRIER0 + c, number_of_threads=ws.WARPGROUP_THREADS)
                cute.nvgpu.warpgroup.fence()
                self._gemm(self._dq_mma, acc_dq, tQrdS[None, None, None, buf], tQrKt[0][None, None, None, 0], False)
                cute.nvgpu.warpgroup.commit_group()
                self._gemm_acc(self._dkv_mma, acc_dk, ds_a, tKrQt[None, None, None, stage], it)
                cute.nvgpu.warpgroup.commit_group()
                for hh in cutlass.range_constexpr(1, self.dq_halves):
                    cute.nvgpu.warpgroup.wait_group(1)
                    self._store_dq(
                        acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, Int32(64 * (hh - 1)), col_in, q_len, scale,
                        c, warp_wg, lane,
                    )  # fmt: skip
                    cute.nvgpu.warpgroup.fence()
                    self._gemm(
                        self._dq_mma, acc_dq, tQrdS[None, None, None, buf], tQrKt[hh][None, None, None, 0], False
                    )
                    cute.nvgpu.warpgroup.commit_group()
            else:
                cute.arch.barrier(barrier_id=DS_BARRIER, number_of_threads=NUM_CONSUMERS * ws.WARPGROUP_THREADS)
                cute.nvgpu.warpgroup.fence()
                self._gemm_acc(self._dkv_mma, acc_dk, ds_a, tKrQt[None, None, None, stage], it)
                cute.nvgpu.warpgroup.commit_group()
                if cutlass.const_expr(self.dq_split):
                    self._gemm(self._dq_mma, acc_dq, tQrdS[None, None, None, buf], tQrKt[None, None, None, 0], False)
                    cute.nvgpu.warpgroup.commit_group()
                else:
                    if c == 0:
                        self._gemm(
                            self._dq_mma, acc_dq, tQrdS[None, None, None, buf], tQrKt[None, None, None, 0], False
                        )
                        cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(0)
            q_pipe.consumer_release(state)
            # overlap + "bulk": dQ goes to its staging tile before the next S^T, dP^T are issued (no
            # register of a finished wgmma is read while they are in flight), the bulk reductions after
            early = self.overlap and self.bulk_dq
            if cutlass.const_expr(early):
                if cutlass.const_expr(self.dq_split):
                    self._store_dq(
                        acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, dq_col0, col_in, q_len, scale, c, warp_wg,
                        lane, "stage",
                    )  # fmt: skip
                else:
                    if c == 0:
                        self._store_dq(
                            acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, dq_col0, col_in, q_len, scale, c, warp_wg,
                            lane, "stage",
                        )  # fmt: skip
            if cutlass.const_expr(self.overlap):
                # the next tile's S^T (and dP^T) run on the tensor cores during this dQ store and are waited
                # for at the end of this step: no wgmma stays in flight across the loop's back edge (ptxas
                # serializes every wgmma of the kernel otherwise, C7514). Issued on the last step too, on a
                # stale stage (no wait), its result unused: an issue on one path only is another such case.
                if it + 1 < n_iter:
                    m1, bn1, q1 = self._tile(it + 1, n_m, m_start, bn0)
                    if cutlass.const_expr(not self.smem_stats):
                        self._load_stats(mLse, mDelta, bn1, q1 + col_in, lse2, dlt)
                    q_pipe.consumer_wait(ws.ring_state(self.q_stage, it + 1))
                self._issue_sdp(acc_s, acc_dp, tSrK, tSrQ, tPrV, tPrdO, (it + 1) % self.q_stage, self.overlap)
            part = "issue" if early else "all"
            if cutlass.const_expr(self.dq_own):
                self._store_dq(
                    acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, Int32(64 * (self.dq_halves - 1)), col_in, q_len,
                    scale, c, warp_wg, lane, part,
                )  # fmt: skip
            elif cutlass.const_expr(self.dq_split):
                self._store_dq(
                    acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, dq_col0, col_in, q_len, scale, c, warp_wg, lane, part
                )
            else:
                if c == 0:
                    self._store_dq(
                        acc_dq, dq_base, sdq_base, bn, tp, q0, row_in, dq_col0, col_in, q_len, scale, c, warp_wg, lane,
                        part,
                    )  # fmt: skip
            if cutlass.const_expr(self.overlap):
                cute.nvgpu.warpgroup.wait_group(0)  # the next tile's S^T (and dP^T)
        if cutlass.const_expr(self.bulk_dq):
            if warp_wg == 0:
                bulk_wait()  # the last tile's reductions, before the CTA (and its shared memory) goes away

        # epilogue: dK = tau * acc, rows >= kv_len 0
        for i in cutlass.range_constexpr(cute.size(acc_dk)):
            _, v1, _ = acc_coords(i)
            live = key0 + 8 * v1 < kv_len
            if cutlass.const_expr(self.overlap):
                live = live & (n_iter > 0)
            acc_dk[i] = cutlass.select_(live, acc_dk[i] * scale, Float32(0.0))
            acc_dv[i] = cutlass.select_(live, acc_dv[i], Float32(0.0))
        cute.autovec_copy(acc_dk, tDKgDK)
        cute.autovec_copy(acc_dv, tDVgDV)

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
            lse2[j] = cutlass.select_(lv == -Float32.inf, Float32.inf, lv * Float32(LOG2E))
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
                out[j] = cutlass.select_(x == -Float32.inf, Float32.inf, x * Float32(LOG2E))
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
    def _probabilities(self, acc_s, lse2, scale_log2, key0, qcol0, q_len, kv_len, n, m):
        """acc_s (S^T, keys x queries) -> P^T = exp2(min(S tau log2e - LSE log2e, 0)) (NaN kept), 0 where
        the key is >= kv_len, the query >= q_len, or (causal) the key after the query. LSE = -inf rows
        come in as lse2 = +inf (P = 0)."""
        for i in cutlass.range_constexpr(32):
            v0, _, nbk = acc_coords(i)
            x = acc_s[i] * scale_log2 - lse2[v0 + 2 * nbk]
            acc_s[i] = cute.math.exp2(cute.arch.fmin(x, Float32(0.0), nan=True), fastmath=True)
        need = ((n + 1) * CTA_N > kv_len) | ((m + 1) * TILE_M > q_len)
        if cutlass.const_expr(self.config.causal):
            need = need | (m * TILE_M < (n + 1) * CTA_N)
        if need:
            for i in cutlass.range_constexpr(32):
                v0, v1, nbk = acc_coords(i)
                key = key0 + 8 * v1
                query = qcol0 + v0 + 8 * nbk
                bad = (key >= kv_len) | (query >= q_len)
                if cutlass.const_expr(self.config.causal):
                    bad = bad | (key > query)
                acc_s[i] = cutlass.select_(bad, Float32(0.0), acc_s[i])

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

    def _gemm_acc(self, make_mma, acc, a, b, it):
        """dV / dK: acc += a b; with overlap, the first step (it = 0) overwrites acc instead (no zero fill)."""
        if cutlass.const_expr(not self.overlap):
            wgmma.gemm(make_mma, acc, a, b, True)
        else:
            self._gemm_first(make_mma, acc, a, b, it > 0)

    @cute.jit
    def _gemm_first(self, make_mma, acc, a, b, accumulate):
        """acc = a b + (acc if the run-time Boolean `accumulate`) over the K blocks (fence/commit/wait are
        the caller's)."""
        tiled_mma = make_mma()
        for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
            if cutlass.const_expr(kb == 0):
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, accumulate)
            else:
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            cute.gemm(tiled_mma, acc, a[None, None, kb], b[None, None, kb], acc)

    def _gemm(self, make_mma, acc, a, b, accumulate_first: bool):
        """acc (+)= a b over the K blocks (16 per BF16 wgmma) on a fresh tiled MMA; fence/commit/wait are the
        caller's."""
        wgmma.gemm(make_mma, acc, a, b, accumulate_first)


def make_kernel(config: AttentionBwdConfig) -> AttentionBackwardSm90:
    return AttentionBackwardSm90(config)
