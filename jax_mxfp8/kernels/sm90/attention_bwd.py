"""MXFP8 attention backward for Hopper (sm_90a), CuTe DSL, compiled ahead of time (S^T, dP^T on FP8 wgmma with
config.sdp_fp8, dV on float16 wgmma with config.dv_f16, both production; dK, dQ on BF16 wgmma).

Supported (kernels/registry/attention_bwd.py, AttentionBwdConfig): head_dim 64 and 128; non-causal or causal
(top-left); GQA/MQA (query head n reads KV head n // G); per-batch query and KV lengths (dense padded batch);
p_scale "const", and "block" (one E8M0 scale per 32 queries of each key for dV's P: quantize_p_blocks;
registry BLOCK_P, dq_accum "fp32"); dq_accum "fp32" and "fp16" (dQ * 2^e in float16), deterministic or not
(the dQ modes: kernels/sm90/attention_bwd_dq.py); one query sequence for every batch row (config.broadcast_q, dq_accum
"fp32", not deterministic: q and dq of batch 1, Q loaded by the producer at batch 0, every batch row's dQ
added into batch 0's dq; dO, LSE, delta per row); packed jagged sequences (config.packed: one batch row of the
aligned packed layout, lens a (4, Sp / 128) table per key tile, rows and tiles global, causal per sequence by
the table's row offsets; registry PACKED). Not here (the XLA reference takes them): bias / boolean masks.

Operands (the FFI call jax_mxfp8_attention_bwd, or jax_mxfp8_attention_bwd_fp8 for sdp_fp8 (below);
/work/coord/ATTN_BWD_INTERFACE.md; the handler passes
each (B, heads, L, H) buffer as a 2-D (B * heads, L * H) row-major view, so the kernel reads N, K, Tp, Sp
from the shapes):
  q     (B*N, Tp*H)  bfloat16  Q^ head-major (b, n, t); Tp = T rounded up to 128; rows >= q_len are 0
  k     (B*K, Sp*H)  bfloat16  K^ head-major (b, kv, s); Sp = S rounded up to 128; rows >= kv_len are 0
  v     (B*K, Sp*H)  bfloat16  V^
  do    (B*N, Tp*H)  bfloat16  dO^ (square-quantized, dequantized; rows >= q_len 0)
                               (config.dv_f16: float16 dO^ 2^-shift[b, kv], read by dV alone; dv then
                               holds dV 2^-shift, scaled back by the caller)
  lse   (B*N, Tp)    float32   natural-log LSE of the forward; -inf on rows >= q_len
  delta (B*N, Tp)    float32   rowsum(dO * O) - dLSE; 0 on padding rows
  lens  (2, B)       int32     query lengths, KV lengths (packed: (4, Sp / 128), per key tile its sequence's
                               first query row, query end row, KV end row, first KV row)
  scale              float32   tau (kernel argument)
  config.sdp_fp8 (launch_fp8, FFI call jax_mxfp8_attention_bwd_fp8): no v; after dv
  q8, k8, v8, do8    float8_e4m3fn  as q, k, v, do, re-encoded to one exponent per 32 rows (attention_operands
                     .aligned_rows)
  qs, dos (B*N, Tp/32), ks, vs (B*K, Sp/32)  float32  their row factors (qs: tau log2(e) 2^eQ; the others 2^e)
Outputs:
  dq    (B*N, Tp*H)  float32   accumulated by float32 reductions: the caller (the FFI handler) zero-fills it
                     (float16 dQ * 2^e for dq_accum "fp16"; broadcast_q: (N, Tp*H), the sum over the B rows)
  dq_sem (B*N, Tp/32) int32    dQ modes only: the deterministic mode's counters (zero-filled by the caller)
  dq_scale           float32   dQ modes only: tau 2^e (kernel argument)
  dk    (B*K, Sp*H)  float32   written once per CTA, rows >= kv_len 0
  dv    (B*K, Sp*H)  float32

Numerics (the contract, reference/attention_bwd.py): every operand is an MX value (E4M3 x 2^e), exact in
bfloat16, so BF16 wgmma with float32 accumulation forms exact products; without config.sdp_fp8 the five GEMMs
all run on BF16 wgmma (no FP8 transposes); with it (production) S^T and dP^T run on FP8 wgmma from the FP8
copies (launch_fp8: q8, k8, v8, do8 K-major in shared memory, accumulators times the row factors):
  S^T  = K Q^T                                   (SS, both K-major)
  P^T  = exp2(min(S^T tau log2(e) - LSE log2(e), 0)); 0 where masked or LSE = -inf (NaN propagates)
  Pq^T = E4M3_satfinite(P^T 2^8) 2^-8            (p_scale "const")
         (p_scale "block": E4M3_satfinite(P^T / 2^b) 2^b, b per 32 queries of a key from their amax)
  dP^T = V dO^T                                  (SS, both K-major)
  dS^T = P^T (dP^T - delta)
  dSq  = 32x32 square blocks over (key, query), scale rule "up", E4M3 satfinite (bit-exact formula of
         formats/quantize.py; kernels/common/ptx.py scale_and_factor / quantize4_f32)
  dV  += Pq^T dO                                 (RS: Pq^T from registers, dO^T an MN-major view of sdO;
                                                  dv_f16: both float16, dO 2^-shift, dv 2^-shift out)
  dK  += dSq^T Q                                 (RS: dSq^T from registers, Q^T an MN-major view of sQ)
  dQ   = dSq K  (per query tile), times tau, added into dq (config.dq_store: "bulk", production at H128, stages the
         tile in shared memory and issues one 256-byte cp.reduce.async.bulk .add.f32 per row; "red" issues
         red.global.add.f32 per element; "tma" / "tma_warp", tunes 15 / 16: staged in a 128-byte-swizzled
         tile, one TMA tensor reduce-add per consumer / per warp and tile)
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
Modules: this file (host side, shared memory, the kernel entry, the producer warp); attention_bwd_consumer.py
(the consumer warpgroups' loop, the dK / dV epilogue); attention_bwd_dq_reduce.py (the float32 dQ stores
"red" / "bulk" / "tma"; the TMA staging offsets: attention_bwd_dq_layout.py); attention_bwd_dq.py (the dQ
modes); attention_bwd_blocks.py (tile geometry, named barriers, dS square quantization, the PTX wrappers);
warp_specialization, wgmma, wgmma_fragment (acc_coords).

Measured on the H200 (docs/perf-notes.md "Attention backward (sm90)", tests/test_attention_bwd_kernel_gpu.py):
BF16-wgmma tunes: dq, dk, dv 68-156 dB SQNR against the XLA reference; production (sdp_fp8, session 8) 44-51
dB (the FP8 wgmma's accumulation and the re-encoding move some P / dS roundings); both with their float64
SQNR equal to the reference's within 0.01 dB. Production 427-433 TFLOP/s at B4 T4k N16 H128 non-causal, 385-391
causal, 330-333 at H64 (0.78-0.88x cuDNN BF16's backward; registry PRODUCTION for the history). Latency-bound
(ncu, session 8: 0.5 eligible warps per scheduler, 5.8 cycles per issued instruction; the largest waits are
the end-of-step dK wgmma, the 256-thread dS barrier before dQ, and the first S^T of a step).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.nvgpu.warpgroup import OperandMajorMode, OperandSource

from jax_mxfp8.kernels.registry import AttentionBwdConfig
from jax_mxfp8.kernels.sm90 import warp_specialization as ws
from jax_mxfp8.kernels.sm90 import wgmma
from jax_mxfp8.kernels.sm90.attention_bwd_blocks import (
    BF16,
    CTA_N,
    FP8,
    NUM_CONSUMERS,
    SDP_FP8_OPERANDS,
    TILE_M,
    WG_N,
    bulk_load,
    tma_tile_partition,
)
from jax_mxfp8.kernels.sm90.attention_bwd_consumer import AttentionBwdConsumer
from jax_mxfp8.kernels.sm90.attention_bwd_dq_reduce import AttentionBwdDqReduce


class AttentionBackwardSm90(AttentionBwdConsumer, AttentionBwdDqReduce):
    """Host entry: (q, k, v, do, lse, delta, lens, dq, dk, dv, scale, stream); module docstring for shapes.

    The consumer warpgroups' loop is AttentionBwdConsumer's (kernels/sm90/attention_bwd_consumer.py), the dQ
    reductions into dq AttentionBwdDqReduce's (kernels/sm90/attention_bwd_dq_reduce.py)."""

    def __init__(self, config: AttentionBwdConfig):
        self.config = config
        self.h = config.head_dim
        self.q_stage = config.q_stage
        # dQ's head-dim halves on the two consumers at H128; H64: consumer 0 only
        self.dq_split = self.h == 128
        self.redux = config.amax_reduce == "redux"
        self.stats_early = config.stats_early
        # "tma_warp" / "tma_writer": the dQ tile staged in a 128-byte-swizzled (16, 64, H / 64 * 4) float32 tile,
        # one TMA tensor reduce-add per 16-row box (kernels/sm90/attention_bwd_dq_reduce.py)
        self.tma_dq = config.dq_store in ("tma_warp", "tma_writer")
        # "tma_writer": the consumers stage dQ and signal; warp 1 of the producer warpgroup issues the reductions
        self.dq_writer = config.dq_store == "tma_writer"
        self.dq_box_rows = 16  # a warp's rows per TMA box
        self.dq_stage_blocks = self.h // 64  # 64-column blocks (16 KB each) of the CTA's dQ tile
        self.dq_mode = config.dq_mode  # float16 dq and / or ordered adds (kernels/sm90/attention_bwd_dq.py)
        self.dk_ss = config.dk_ss  # dK's A operand from the dS tile in shared memory, not the registers
        self.p_scaled = config.p_scaled  # P computed as 2^8 P (the FP8 rounding's scale in the exponent)
        self.smem_stats = config.smem_stats
        # sdp_fp8: S^T and dP^T on FP8 wgmma from the realigned FP8 copies q8, k8, v8, do8 (one exponent per 32
        # rows, scaled by their row factors qs, ks, vs, dos); the bfloat16 v is then not read
        self.sdp_fp8 = config.sdp_fp8
        # dv_f16: dO in float16 (times 2^-shift per batch and KV head), dV on float16 wgmma (Pq's E4M3 values
        # to the A fragment by one cvt per pair)
        self.do_dtype = cutlass.Float16 if config.dv_f16 else BF16
        # smem_stats: per Q / dO stage, the tile's 64 LSE then 64 delta values (float32), by cp.async.bulk
        self.stats_bytes = 2 * TILE_M * 4
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
        fp8 = ()
        v = (t(BF16, s(), s(divisibility=rows_h)),)  # v (B*K, Sp*H)
        if self.sdp_fp8:  # q8 (B*N, Tp*H), k8, v8 (B*K, Sp*H), do8; qs (B*N, Tp/32), ks, vs (B*K, Sp/32), dos
            fp8 = tuple(t(FP8, s(), s(divisibility=rows_h)) for _ in range(4))
            fp8 += tuple(t(Float32, s(), s(divisibility=4)) for _ in range(4))
            v = ()  # V is read only by dP^T: as v8
        return (
            t(BF16, s(), s(divisibility=rows_h)),  # q (B*N, Tp*H)
            t(BF16, s(), s(divisibility=rows_h)),  # k (B*K, Sp*H)
            *v,
            t(self.do_dtype, s(), s(divisibility=rows_h)),  # do (dv_f16: float16)
            t(Float32, s(), s(divisibility=128)),  # lse (B*N, Tp)
            t(Float32, s(), s(divisibility=128)),  # delta
            t(Int32, s(), s()),  # lens (2, B)
            t(dq_t, s(), s(divisibility=rows_h)),  # dq (B*N, Tp*H)
            t(Float32, s(), s(divisibility=rows_h)),  # dk (B*K, Sp*H)
            t(Float32, s(), s(divisibility=rows_h)),  # dv
            *sem,
            *fp8,
            Float32(1.0),  # scale (tau)
            *dq_scale,
            make_fake_stream(),
        )

    def tensor_names(self) -> tuple[str, ...]:
        names = ("q", "k", "v", "do", "lse", "delta", "lens", "dq", "dk", "dv")
        if self.sdp_fp8:
            return tuple(x for x in names if x != "v") + SDP_FP8_OPERANDS
        return names + ("dq_sem",) if self.dq_mode else names

    def entry(self):
        if self.sdp_fp8:
            return self.launch_fp8
        return self.launch_dq if self.dq_mode else self.launch

    # ------------------------------------------------------------------------------------------------
    # Host side
    # ------------------------------------------------------------------------------------------------

    def _sdp_mma(self) -> cute.TiledMma:
        """S^T = K Q^T and dP^T = V dO^T: A (keys, H) and B (queries, H) both K-major in shared memory; the
        two consumers take 64-key halves (thread t in [0, 256) covers keys 64 (t // 128) ..)."""
        if self.sdp_fp8:  # from the FP8 copies (sdp_fp8): 32 K per wgmma
            return wgmma.make_fp8_ss_mma((WG_N, TILE_M), atom_layout=(NUM_CONSUMERS, 1, 1))
        k = OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(BF16, BF16, k, k, Float32, (NUM_CONSUMERS, 1, 1), (WG_N, TILE_M))

    def _dkv_mma(self, dtype=BF16) -> cute.TiledMma:
        """dV += Pq^T dO, dK += dSq^T Q: A (keys, queries) in registers, B (H, queries) an MN-major view of
        sdO / sQ; 64-key halves as _sdp_mma."""
        return sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32, (NUM_CONSUMERS, 1, 1), (WG_N, self.h),
            OperandSource.RMEM,
        )  # fmt: skip

    def _dv_mma(self) -> cute.TiledMma:
        """dV += Pq^T dO: _dkv_mma in dO's dtype (float16 with dv_f16)."""
        return self._dkv_mma(self.do_dtype)

    def _dk_mma(self) -> cute.TiledMma:
        """dk_ss: dK += dSq^T Q with A (keys, queries) K-major in shared memory (the transposed view of the dS
        tile, which is query-contiguous), B as _dkv_mma's; 64-key halves as _sdp_mma."""
        k, mn = OperandMajorMode.K, OperandMajorMode.MN
        return sm90_utils.make_trivial_tiled_mma(BF16, BF16, k, mn, Float32, (NUM_CONSUMERS, 1, 1), (WG_N, self.h))

    def _dq_mma(self) -> cute.TiledMma:
        """dQ = dSq K: A (queries, keys) MN-major in shared memory (sdS), B (H, keys) an MN-major view of sK.
        H128: the consumers take head-dim halves (thread t covers columns 64 (t // 128) ..); H64: one."""
        mn = OperandMajorMode.MN
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

    def _fp8_smem_layouts(self):
        """sdp_fp8: the FP8 Q / dO stages (64, H, q_stage) and K / V (128, H, 1), K-major."""
        kmajor = utils.LayoutEnum.ROW_MAJOR
        q8_smem = sm90_utils.make_smem_layout_b(kmajor, self.sdp_tiler, FP8, self.q_stage)
        k8_smem = sm90_utils.make_smem_layout_a(kmajor, self.sdp_tiler, FP8, 1)
        return q8_smem, k8_smem

    def _dq_smem_layout(self):
        """The TMA dQ stores' staging tile as (16 box rows, 64 head-dim columns, stages) float32, row-major with
        the 128-byte swizzle (conflict-free 8-byte stores of the accumulator fragment: a warp's 8 rows x 32
        bytes land on 8 distinct 16-byte chunk pairs), a stage per (64-column block, warp), block-major. The
        TMA box is (16 rows, 32 columns)."""
        stages = self.dq_stage_blocks * (TILE_M // self.dq_box_rows)
        return sm90_utils.make_smem_layout_epi(Float32, utils.LayoutEnum.ROW_MAJOR, (self.dq_box_rows, 64), stages)

    def _shared_storage(self, q_smem, k_smem, ds_smem):
        """The kernel's shared-memory struct (plain Python: the smem_stats and sdp_fp8 members exist only when
        used; sdp_fp8 has no bfloat16 sV)."""
        fields = dict(
            q_mbar=cute.struct.MemRange[cutlass.Int64, self.q_stage * 2],
            kv_mbar=cute.struct.MemRange[cutlass.Int64, 2],
            amax=cute.struct.Align[cute.struct.MemRange[Uint32, 2 * 8 * 2], 16],  # (parity, warp, q block)
            sK=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(k_smem)], 1024],
            sV=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(k_smem)], 1024],
            sQ=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(q_smem)], 1024],
            sdO=cute.struct.Align[cute.struct.MemRange[self.do_dtype, cute.cosize(q_smem)], 1024],
            sdS=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(ds_smem)], 1024],
            sdQ=cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, 16], 128],
        )
        if self.tma_dq:  # the swizzled staging tile (same member: the other variants' struct unchanged)
            fields["sdQ"] = cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(self._dq_smem_layout())], 1024]
        if self.smem_stats:  # (LSE, delta) x q_stage, float32
            words = self.q_stage * self.stats_bytes // 4
            fields["stats"] = cute.struct.Align[cute.struct.MemRange[Float32, words], 128]
        if self.sdp_fp8:
            del fields["sV"]
            q8_smem, k8_smem = self._fp8_smem_layouts()
            for name, layout in (("sK8", k8_smem), ("sV8", k8_smem), ("sQ8", q8_smem), ("sdO8", q8_smem)):
                fields[name] = cute.struct.Align[cute.struct.MemRange[FP8, cute.cosize(layout)], 1024]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

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
    def launch_fp8(
        self,
        q2: cute.Tensor,
        k2: cute.Tensor,
        do2: cute.Tensor,
        lse: cute.Tensor,
        delta: cute.Tensor,
        lens: cute.Tensor,
        dq2: cute.Tensor,
        dk2: cute.Tensor,
        dv2: cute.Tensor,
        q8: cute.Tensor,
        k8: cute.Tensor,
        v8: cute.Tensor,
        do8: cute.Tensor,
        qs: cute.Tensor,
        ks: cute.Tensor,
        vs: cute.Tensor,
        dos: cute.Tensor,
        scale: Float32,
        stream: cuda.CUstream,
    ):
        """The sdp_fp8 entry: launch's operands without v (V is read only by dP^T, as v8), plus the FP8 copies
        and their row factors."""
        fp8 = (q8, k8, v8, do8, qs, ks, vs, dos)
        self._launch(q2, k2, None, do2, lse, delta, lens, dq2, dk2, dv2, None, scale, None, stream, fp8)

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

    def _launch(self, q2, k2, v2, do2, lse, delta, lens, dq2, dk2, dv2, sem, scale, dq_scale, stream, fp8=None):
        """launch's body (traced inside launch / launch_dq / launch_fp8); sem, dq_scale None outside the dQ
        modes, fp8 (q8, k8, v8, do8, qs, ks, vs, dos) None outside sdp_fp8."""
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
        k, dk, dv = rows(k2, sp, bk), rows(dk2, sp, bk), rows(dv2, sp, bk)
        v = k if cutlass.const_expr(self.sdp_fp8) else rows(v2, sp, bk)  # (sdp_fp8: no bfloat16 v; tma_v unused)

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
        self.q8_bytes, self.k8_bytes = 0, 0
        f8 = (None,) * 12  # sdp_fp8: TMA atoms and tensors of q8, do8, k8, v8, then qs, ks, vs, dos
        q8_smem, k8_smem = None, None
        if cutlass.const_expr(self.sdp_fp8):
            q8_smem, k8_smem = self._fp8_smem_layouts()
            q8_one = cute.slice_(q8_smem, (None, None, 0))
            k8_one = cute.slice_(k8_smem, (None, None, 0))
            q8, do8 = rows(fp8[0], tp, q_heads), rows(fp8[3], tp, bn)
            k8, v8 = rows(fp8[1], sp, bk), rows(fp8[2], sp, bk)
            atoms = [
                cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, x, one, tile)
                for x, one, tile in ((q8, q8_one, (TILE_M, h)), (do8, q8_one, (TILE_M, h)),
                                     (k8, k8_one, (CTA_N, h)), (v8, k8_one, (CTA_N, h)))
            ]  # fmt: skip
            f8 = tuple(x for pair in atoms for x in pair) + tuple(fp8[4:])
            self.q8_bytes = cute.size_in_bytes(FP8, q8_one)
            self.k8_bytes = cute.size_in_bytes(FP8, k8_one)

        tma_dq, tdq, dq_smem = None, None, None
        if cutlass.const_expr(self.tma_dq):
            dq_smem = self._dq_smem_layout()
            red = cute.nvgpu.cpasync.CopyReduceBulkTensorTileS2GOp()  # .add
            tma_dq, tdq = cute.nvgpu.cpasync.make_tiled_tma_atom(
                red, dq, cute.slice_(dq_smem, (None, None, 0)), (self.dq_box_rows, 64)
            )

        self.shared_storage = self._shared_storage(q_smem, k_smem, ds_smem)
        self.kernel(
            sdp_mma, dkv_mma, dq_mma, tma_q, tq, tma_do, tdo, tma_k, tk, tma_v, tv,
            lse, delta, lens, dq, dk, dv, scale, q_smem, k_smem, ds_smem, sem, dq_scale, tma_dq, tdq, dq_smem,
            *f8, q8_smem, k8_smem,
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
        tma_dq,
        mdQt,
        dq_smem,
        tma_q8,
        mQ8,
        tma_do8,
        mdO8,
        tma_k8,
        mK8,
        tma_v8,
        mV8,
        mQs,
        mKs,
        mVs,
        mdOs,
        q8_smem,
        k8_smem,
    ):
        """One CTA: key tile n (128 keys) of KV head bk = b * K + kv; loops over the G query heads of the
        group and the 64-row query tiles that can see this key tile."""
        tidx, _, _ = cute.arch.thread_idx()
        n, bk, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.config.packed):
            # one batch row of aligned packed sequences; mLen (4, Sp / 128) per key tile n: its sequence's first
            # query row, query end row, KV end row and first KV row. Rows and tiles stay global (every address
            # as in the dense kernel); q_len / kv_len are the end rows, and causal compares key - kv_row0 with
            # query - q_row0: key <= query + causal_shift
            g_size = mLse.shape[0] // mdK.shape[2]  # query heads per KV head
            q_row0 = mLen[0, n]
            q_len = mLen[1, n]
            kv_len = mLen[2, n]
            self.causal_shift = mLen[3, n] - q_row0
            m_start = q_row0 // TILE_M
            if cutlass.const_expr(self.config.causal):
                m_start = (n * CTA_N - self.causal_shift) // TILE_M  # the first query row >= the first key
        else:
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
        q_tx = 2 * self.q_bytes + 2 * self.q8_bytes + (self.stats_bytes if self.smem_stats else 0)
        q_pipe = ws.make_tma_pipeline(storage.q_mbar.data_ptr(), self.q_stage, consumer_warps, q_tx)
        # sdp_fp8: K, K8 and V8 (no bfloat16 V)
        kv_tx = self.k_bytes + 2 * self.k8_bytes if self.sdp_fp8 else 2 * self.k_bytes
        kv_pipe = ws.make_tma_pipeline(storage.kv_mbar.data_ptr(), 1, consumer_warps, kv_tx)

        sQ = storage.sQ.get_tensor(q_smem.outer, swizzle=q_smem.inner)
        sdO = storage.sdO.get_tensor(q_smem.outer, swizzle=q_smem.inner)
        sK = storage.sK.get_tensor(k_smem.outer, swizzle=k_smem.inner)
        sV = sK  # (sdp_fp8: not read; V comes in as V8)
        fp8_smem = None
        if cutlass.const_expr(self.sdp_fp8):
            fp8_smem = (
                storage.sQ8.get_tensor(q8_smem.outer, swizzle=q8_smem.inner),
                storage.sdO8.get_tensor(q8_smem.outer, swizzle=q8_smem.inner),
                storage.sK8.get_tensor(k8_smem.outer, swizzle=k8_smem.inner),
                storage.sV8.get_tensor(k8_smem.outer, swizzle=k8_smem.inner),
            )
            # _produce's / _consume's FP8 operands, kept off their argument lists (None otherwise)
            self.fp8_tma = (tma_q8, mQ8, tma_do8, mdO8, tma_k8, mK8, tma_v8, mV8, fp8_smem)
            self.fp8_factors = (mQs, mKs, mVs, mdOs)
        else:
            sV = storage.sV.get_tensor(k_smem.outer, swizzle=k_smem.inner)
        sdS = storage.sdS.get_tensor(ds_smem.outer, swizzle=ds_smem.inner)
        sAmax = storage.amax.get_tensor(cute.make_layout(2 * 8 * 2))
        sdq_base = storage.sdQ.data_ptr().toint()
        stats_base = Int32(0)
        sStats = sAmax  # (unused unless smem_stats)
        if cutlass.const_expr(self.tma_dq):
            # _store_dq's TMA reduce operands, kept off _consume's argument list (None otherwise)
            sDQ = storage.sdQ.get_tensor(dq_smem.outer, swizzle=dq_smem.inner)
            self.dq_tma = (tma_dq, mdQt, sDQ)
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
            if cutlass.const_expr(self.dq_writer):
                if warp == 1:
                    self._write_dq(n_iter, n_m, m_start, bn0)
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

        part = tma_tile_partition
        tQsQ, tQgQ = part(tma_q, mQ, sQ, (TILE_M, h))
        tOsO, tOgO = part(tma_do, mdO, sdO, (TILE_M, h))
        tKsK, tKgK = part(tma_k, mK, sK, (CTA_N, h))
        tVsV, tVgV = part(tma_v, mV, sV, (CTA_N, h))
        if cutlass.const_expr(self.sdp_fp8):
            tma_q8, mQ8, tma_do8, mdO8, tma_k8, mK8, tma_v8, mV8, (sQ8, sdO8, sK8, sV8) = self.fp8_tma
            tQsQ8, tQgQ8 = part(tma_q8, mQ8, sQ8, (TILE_M, h))
            tOsO8, tOgO8 = part(tma_do8, mdO8, sdO8, (TILE_M, h))
            tKsK8, tKgK8 = part(tma_k8, mK8, sK8, (CTA_N, h))
            tVsV8, tVgV8 = part(tma_v8, mV8, sV8, (CTA_N, h))
        if n_iter > 0:
            kv_prod = kv_pipe.make_producer()
            handle = kv_prod.acquire_and_advance()
            cute.copy(tma_k, tKgK[(None, n, 0, bk)], tKsK[(None, 0)], tma_bar_ptr=handle.barrier)
            if cutlass.const_expr(self.sdp_fp8):
                cute.copy(tma_k8, tKgK8[(None, n, 0, bk)], tKsK8[(None, 0)], tma_bar_ptr=handle.barrier)
                cute.copy(tma_v8, tVgV8[(None, n, 0, bk)], tVsV8[(None, 0)], tma_bar_ptr=handle.barrier)
            else:
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
                if cutlass.const_expr(self.sdp_fp8):
                    bar = handle.barrier
                    cute.copy(tma_q8, tQgQ8[(None, m, 0, q_head)], tQsQ8[(None, handle.index)], tma_bar_ptr=bar)
                    cute.copy(tma_do8, tOgO8[(None, m, 0, bn0 + g)], tOsO8[(None, handle.index)], tma_bar_ptr=bar)
                if cutlass.const_expr(self.smem_stats):
                    if cute.arch.lane_idx() == 0:
                        offset = (Int64(bn0 + g) * Int64(mLse.shape[1]) + Int64(m * TILE_M)) * 4
                        dst = stats_base + handle.index * self.stats_bytes
                        mbar = handle.barrier.toint()
                        half = self.stats_bytes // 2
                        bulk_load(dst, mLse.iterator.toint() + offset, half, mbar)
                        bulk_load(dst + half, mDelta.iterator.toint() + offset, half, mbar)


def make_kernel(config: AttentionBwdConfig) -> AttentionBackwardSm90:
    return AttentionBackwardSm90(config)
