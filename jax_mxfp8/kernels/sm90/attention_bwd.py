"""MXFP8 attention backward for Hopper (sm_90a), CuTe DSL, compiled ahead of time.

Supported (kernels/registry/attention_bwd.py, AttentionBwdConfig): head_dim 64 and 128; non-causal or causal
(top-left); GQA/MQA (query head n reads KV head n // G); per-batch query and KV lengths (dense padded batch);
p_scale "const" and "block" (one E8M0 scale per 32 queries of each key for dV's P); dq_accum "fp32" and
"fp16" (dQ 2^e in float16), deterministic or not (the dQ modes, attention_bwd_dq.py); one query sequence for
every batch row (broadcast_q: q and dq of batch 1); packed jagged sequences (packed: one batch row of the
aligned packed layout). Not here (the XLA reference takes them): bias and boolean masks.

Production (registry PRODUCTION), per 64-row query tile of a 128-key tile:
  S^T  = K Q^T, dP^T = V dO^T    FP8 wgmma (sdp_fp8) from the FP8 copies re-encoded to one exponent per 32
                                 rows, accumulators times the row factors (qs includes tau log2(e))
  P^T  = exp2(min(S^T tau log2(e) - LSE log2(e), 0)), computed as 2^8 P (p_scaled); 0 where masked or LSE =
         -inf (NaN propagates); Pq^T = E4M3_satfinite(2^8 P^T), in units of 2^-8
         (p_scale "block": E4M3_satfinite(P^T / 2^b) 2^b, b per 32 queries of a key from their amax)
  dV  += Pq^T dO                 float16 wgmma (dv_f16: Pq's E4M3 values exact in float16; dO is float16
                                 dO^ 2^-shift per (batch, KV head), dv comes out times 2^-shift)
  dS^T = P^T (dP^T - delta); dSq = 32x32 square blocks over (key, query), scale rule "up", E4M3 satfinite
  dK  += dSq^T Q                 BF16 wgmma, dSq^T read from the dS tile in shared memory (dk_ss)
  dQ   = dSq K per query tile    BF16 wgmma, issued before dK's; times tau, added into dq by TMA tensor
                                 reduce-adds (dq_store "tma_writer" at H128: warp 1 of the producer warpgroup
                                 issues them; "tma_warp" at H64: each consumer warp its own 16 rows)
  dK *= tau (and dV *= 2^-8) at the end.
LSE and delta come with the Q / dO stage (smem_stats); at H128 the next tile's query-block factors are loaded
a step ahead (factors_ahead). The schedule fields and the comparison schedules are the registry's.
Every operand is an MX value (E4M3 x 2^e), exact in bfloat16, so every BF16 product is exact; the contract is
reference/attention_bwd.py (docs/numerics.md "Hopper attention backward").

Operands (docs/interfaces.md; the handler csrc/attention_bwd.cc passes each (B, heads, L, H) buffer as a 2-D
(B * heads, L * H) row-major view, so the kernel reads N, K, Tp, Sp from the shapes; Tp, Sp = T, S rounded up
to 128): q, do (B*N, Tp*H) and k, v (B*K, Sp*H) bfloat16 (do float16 with dv_f16; no v with sdp_fp8), lse,
delta (B*N, Tp) float32, lens (2, B) int32 (packed, B = 1: seqs (4, S) and work (2, Sp / 128) instead, the
forward's sequence table and a work list of the key tiles: tile_scheduler.KeyTileScheduler),
dq (B*N, Tp*H) float32 (float16 dQ 2^e for "fp16"), dk, dv (B*K, Sp*H) float32, the dQ modes' dq_sem
(B*N, Tp/32) int32, sdp_fp8's q8, k8, v8, do8 (float8_e4m3fn, shapes of q, k, v, do) and row factors qs, dos
(B*N, Tp/32), ks, vs (B*K, Sp/32) float32; scalars tau and (dQ modes) tau 2^e. dq, dq_sem are zero-filled by
the caller; dk, dv are written once per CTA (rows >= kv_len 0).

Structure (FA3-style, KV-stationary): grid (Sp / 128, B * K), one CTA per (128-key tile, KV head)
(tile_scheduler.KeyTileScheduler), looping over the 64-row query tiles of the group's G query heads that
can see the tile (attention_mask.AttentionMask.query_tile_range); 3 warpgroups:
  WG0   producer: warp 0 loads K and V (once) and Q, dO of every step into a ring of q_stage stages by TMA;
        warp 1 is the dQ writer of "tma_writer".
  WG1/2 consumers, 64 keys each (wgmma M = 64): the phases of attention_bwd_consumer.py; dQ (64 x H) is split
        over the two consumers by head-dim halves at H128 (consumer 0 alone at H64).
Modules: this file (the operand structs, host side, shared memory, the kernel entry, the producer warp);
attention_bwd_consumer.py (the consumers' phases and the dK / dV epilogue); attention_bwd_dq_reduce.py (the
float32 dQ stores; staging offsets: attention_bwd_dq_layout.py); attention_bwd_dq.py (the dQ modes);
attention_bwd_blocks.py (tile geometry, named barriers, the square-block and P-block quantizers, PTX
wrappers). Measurements: docs/perf/attention-backward.md and docs/perf/removed-variants.md.
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
from jax_mxfp8.kernels.sm90.attention_bwd_operands import (
    BwdOperands,
    BwdSmem,
    DqModeOperands,
    Fp8Operands,
    Mmas,
    SmemLayouts,
    TmaTile,
)
from jax_mxfp8.kernels.sm90.attention_mask import AttentionMask
from jax_mxfp8.kernels.sm90.tile_scheduler import KeyTile, KeyTileScheduler


class AttentionBackwardSm90(AttentionBwdConsumer, AttentionBwdDqReduce):
    """Host entry: (q, k, v, do, lse, delta, lens, dq, dk, dv, scale, stream) (the sdp_fp8 and dQ-mode entries
    below); module docstring for shapes. The consumers' phases are AttentionBwdConsumer's
    (attention_bwd_consumer.py), the dQ reductions AttentionBwdDqReduce's (attention_bwd_dq_reduce.py)."""

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
        # TMA transaction bytes of one Q / dO stage and of K / V (bfloat16; FP8 copies: one byte per element)
        self.q_bytes, self.k_bytes = TILE_M * self.h * 2, CTA_N * self.h * 2
        self.q8_bytes, self.k8_bytes = (TILE_M * self.h, CTA_N * self.h) if self.sdp_fp8 else (0, 0)
        self.sdp_tiler = (CTA_N, TILE_M, self.h)  # S^T, dP^T: M = keys, N = queries, K = H
        self.dkv_tiler = (CTA_N, self.h, TILE_M)  # dV, dK: M = keys, N = H, K = queries
        self.dq_tiler = (TILE_M, self.h, CTA_N)  # dQ: M = queries, N = H, K = keys
        self.threads = ws.WARPGROUP_THREADS * (1 + NUM_CONSUMERS)
        # masks of 64-row query tiles against the 128-key tile, and the key-tile schedule
        self.mask = AttentionMask(config.causal, TILE_M, CTA_N)
        self.scheduler = KeyTileScheduler(self.mask, config.packed, config.head_dim)
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
            t(Int32, s(), s()),  # lens (2, B); packed: seqs (4, S)
            *((t(Int32, s(), s()),) if self.config.packed else ()),  # packed: work (2, Sp / 128)
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
        if self.config.packed:
            names = ("q", "k", "v", "do", "lse", "delta", "seqs", "work", "dq", "dk", "dv")
        if self.sdp_fp8:
            return tuple(x for x in names if x != "v") + SDP_FP8_OPERANDS
        return names + ("dq_sem",) if self.dq_mode else names

    def entry(self):
        if self.config.packed:
            return self.launch_packed
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

    def _smem_layouts(self) -> SmemLayouts:
        """Q / dO stages (64, H, q_stage) and K / V (128, H, 1), K-major; dS (64 queries, 128 keys, 2)
        query-major (M-major A of dQ), double-buffered; the TMA dQ staging tile as (16 box rows, 64 head-dim
        columns, stages) float32, row-major with the 128-byte swizzle (conflict-free 8-byte stores of the
        accumulator fragment), a stage per (64-column block, warp), block-major; sdp_fp8's FP8 Q / dO stages
        and K / V, K-major."""
        kmajor = utils.LayoutEnum.ROW_MAJOR
        q_smem = sm90_utils.make_smem_layout_b(kmajor, self.sdp_tiler, BF16, self.q_stage)
        k_smem = sm90_utils.make_smem_layout_a(kmajor, self.sdp_tiler, BF16, 1)
        ds_smem = sm90_utils.make_smem_layout_a(utils.LayoutEnum.COL_MAJOR, self.dq_tiler, BF16, 2)
        dq_smem, q8_smem, k8_smem = None, None, None
        if self.sdp_fp8:
            q8_smem = sm90_utils.make_smem_layout_b(kmajor, self.sdp_tiler, FP8, self.q_stage)
            k8_smem = sm90_utils.make_smem_layout_a(kmajor, self.sdp_tiler, FP8, 1)
        if self.tma_dq:
            stages = self.dq_stage_blocks * (TILE_M // 16)
            dq_smem = sm90_utils.make_smem_layout_epi(Float32, utils.LayoutEnum.ROW_MAJOR, (16, 64), stages)
        return SmemLayouts(q_smem, k_smem, ds_smem, dq_smem, q8_smem, k8_smem)

    def _shared_storage(self, layouts: SmemLayouts):
        """The kernel's shared-memory struct (plain Python: the smem_stats, TMA dQ and sdp_fp8 members exist
        only when used; sdp_fp8 has no bfloat16 sV)."""
        fields = dict(
            q_mbar=cute.struct.MemRange[cutlass.Int64, self.q_stage * 2],
            kv_mbar=cute.struct.MemRange[cutlass.Int64, 2],
            amax=cute.struct.Align[cute.struct.MemRange[Uint32, 2 * 8 * 2], 16],  # (parity, warp, q block)
            sK=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(layouts.k)], 1024],
            sV=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(layouts.k)], 1024],
            sQ=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(layouts.q)], 1024],
            sdO=cute.struct.Align[cute.struct.MemRange[self.do_dtype, cute.cosize(layouts.q)], 1024],
            sdS=cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(layouts.ds)], 1024],
            sdQ=cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, 16], 128],
        )
        if self.tma_dq:  # the swizzled staging tile (same member: the other variants' struct unchanged)
            fields["sdQ"] = cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(layouts.dq)], 1024]
        if self.smem_stats:  # (LSE, delta) x q_stage, float32
            words = self.q_stage * self.stats_bytes // 4
            fields["stats"] = cute.struct.Align[cute.struct.MemRange[Float32, words], 128]
        if self.sdp_fp8:
            del fields["sV"]
            for name, layout in (("sK8", layouts.k8), ("sV8", layouts.k8), ("sQ8", layouts.q8), ("sdO8", layouts.q8)):
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
        self._launch(q2, k2, v2, do2, lse, delta, lens, dq2, dk2, dv2, scale, stream)

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
        self._launch(
            q2, k2, None, do2, lse, delta, lens, dq2, dk2, dv2, scale, stream, fp8=(q8, k8, v8, do8, qs, ks, vs, dos)
        )

    @cute.jit
    def launch_packed(
        self,
        q2: cute.Tensor,
        k2: cute.Tensor,
        do2: cute.Tensor,
        lse: cute.Tensor,
        delta: cute.Tensor,
        seqs: cute.Tensor,
        work: cute.Tensor,
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
        """The packed entry (sdp_fp8): launch_fp8's operands with seqs and work (the packed sequences' tables,
        tile_scheduler.KeyTileScheduler) in lens' place; B = 1."""
        fp8 = (q8, k8, v8, do8, qs, ks, vs, dos)
        self._launch(q2, k2, None, do2, lse, delta, seqs, dq2, dk2, dv2, scale, stream, fp8=fp8, work=work)

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
        self._launch(q2, k2, v2, do2, lse, delta, lens, dq2, dk2, dv2, scale, stream, dq_mode=(sem, dq_scale))

    def _launch(
        self, q2, k2, v2, do2, lse, delta, lens, dq2, dk2, dv2, scale, stream, dq_mode=None, fp8=None, work=None
    ):
        """launch's body (traced inside the launch entries): the (rows, H, heads) views, the TMA atoms, the
        operand struct, the launch. dq_mode (dq_sem, tau 2^e), fp8 (q8, k8, v8, do8, qs, ks, vs, dos) and work
        only for those entries."""
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
        v = k if cutlass.const_expr(self.sdp_fp8) else rows(v2, sp, bk)  # (sdp_fp8: no bfloat16 v; not read)

        layouts = self._smem_layouts()
        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()

        def tma(x, layout, tile, op=g2s) -> TmaTile:  # the atom of one stage of `layout`
            return TmaTile(*cute.nvgpu.cpasync.make_tiled_tma_atom(op, x, cute.slice_(layout, (None, None, 0)), tile))

        q_tile, k_tile = (TILE_M, h), (CTA_N, h)
        fp8_ops = None
        if cutlass.const_expr(self.sdp_fp8):
            q8, k8, v8, do8, qs, ks, vs, dos = fp8
            q8_t, do8_t = tma(rows(q8, tp, q_heads), layouts.q8, q_tile), tma(rows(do8, tp, bn), layouts.q8, q_tile)
            k8_t, v8_t = tma(rows(k8, sp, bk), layouts.k8, k_tile), tma(rows(v8, sp, bk), layouts.k8, k_tile)
            fp8_ops = Fp8Operands(q8_t, do8_t, k8_t, v8_t, qs, ks, vs, dos)
        dq_tma = None
        if cutlass.const_expr(self.tma_dq):  # a TMA reduce-add (.add) of (16, 64) boxes into dq
            dq_tma = tma(dq, layouts.dq, (16, 64), cute.nvgpu.cpasync.CopyReduceBulkTensorTileS2GOp())
        ops = BwdOperands(
            mma=Mmas(self._sdp_mma(), self._dkv_mma(), self._dq_mma()),
            q=tma(q, layouts.q, q_tile),
            do=tma(do, layouts.q, q_tile),
            k=tma(k, layouts.k, k_tile),
            v=tma(v, layouts.k, k_tile),
            lse=lse,
            delta=delta,
            lens=lens,
            work=work,
            dq=dq,
            dk=dk,
            dv=dv,
            scale=scale,
            dq_mode=None if dq_mode is None else DqModeOperands(*dq_mode),
            dq_tma=dq_tma,
            fp8=fp8_ops,
            smem=layouts,
        )
        self.kernel(ops).launch(
            grid=[sp // CTA_N, bk, 1], block=[self.threads, 1, 1], stream=stream, min_blocks_per_mp=1
        )

    # ------------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, ops: BwdOperands):
        """One CTA: key tile n (128 keys) of KV head bk = b * K + kv; loops over the G query heads of the
        group and the 64-row query tiles that can see this key tile (KeyTileScheduler)."""
        tidx, _, _ = cute.arch.thread_idx()
        tile = self.scheduler.work_tile(ops.lens, ops.work, ops.lse.shape[0], ops.dk.shape[2], ops.lse.shape[1])
        dq_mode = None  # the dQ modes' (dq_sem address, tau 2^e, key tile or None) for the dQ stores
        if cutlass.const_expr(self.dq_mode):
            key_tile = tile.n if self.config.deterministic else None  # the ordered adds' turn
            dq_mode = (ops.dq_mode.sem.iterator.toint(), ops.dq_mode.scale, key_tile)

        storage = utils.SmemAllocator().allocate(self._shared_storage(ops.smem))
        consumer_warps = ws.WARPGROUP_WARPS * NUM_CONSUMERS
        q_tx = 2 * self.q_bytes + 2 * self.q8_bytes + (self.stats_bytes if self.smem_stats else 0)
        q_pipe = ws.make_tma_pipeline(storage.q_mbar.data_ptr(), self.q_stage, consumer_warps, q_tx)
        # sdp_fp8: K, K8 and V8 (no bfloat16 V)
        kv_tx = self.k_bytes + 2 * self.k8_bytes if self.sdp_fp8 else 2 * self.k_bytes
        kv_pipe = ws.make_tma_pipeline(storage.kv_mbar.data_ptr(), 1, consumer_warps, kv_tx)
        sm = self._smem_tensors(storage, ops.smem)

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)

        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if wg == 0:
            cute.arch.setmaxregister_decrease(ws.PRODUCER_REGISTERS)
            if warp == 0:
                self._produce(ops, sm, q_pipe, kv_pipe, tile)
            if cutlass.const_expr(self.dq_writer):
                if warp == 1:
                    self.write_dq(tile, self.partition_dq_tma(ops.dq_tma.atom, ops.dq_tma.tensor, sm.dq))
        else:
            cute.arch.setmaxregister_increase(ws.CONSUMER_REGISTERS)
            self.consume(ops, sm, q_pipe, kv_pipe, tile, wg - 1, tidx - 128, dq_mode)

    def _smem_tensors(self, storage, layouts: SmemLayouts) -> BwdSmem:
        """The shared-memory tensors of the allocated struct (traced inline in the kernel)."""
        sQ = storage.sQ.get_tensor(layouts.q.outer, swizzle=layouts.q.inner)
        sdO = storage.sdO.get_tensor(layouts.q.outer, swizzle=layouts.q.inner)
        sK = storage.sK.get_tensor(layouts.k.outer, swizzle=layouts.k.inner)
        sV = sK  # (sdp_fp8: not read; V comes in as V8)
        fp8 = None
        if cutlass.const_expr(self.sdp_fp8):
            fp8 = (
                storage.sQ8.get_tensor(layouts.q8.outer, swizzle=layouts.q8.inner),
                storage.sdO8.get_tensor(layouts.q8.outer, swizzle=layouts.q8.inner),
                storage.sK8.get_tensor(layouts.k8.outer, swizzle=layouts.k8.inner),
                storage.sV8.get_tensor(layouts.k8.outer, swizzle=layouts.k8.inner),
            )
        else:
            sV = storage.sV.get_tensor(layouts.k.outer, swizzle=layouts.k.inner)
        sdS = storage.sdS.get_tensor(layouts.ds.outer, swizzle=layouts.ds.inner)
        sAmax = storage.amax.get_tensor(cute.make_layout(2 * 8 * 2))
        dq_base = storage.sdQ.data_ptr().toint()
        stats_base = Int32(0)
        sStats = sAmax  # (unused unless smem_stats)
        sDQ = None
        if cutlass.const_expr(self.tma_dq):
            sDQ = storage.sdQ.get_tensor(layouts.dq.outer, swizzle=layouts.dq.inner)
        if cutlass.const_expr(self.smem_stats):
            stats_base = storage.stats.data_ptr().toint()
            # (query column, LSE / delta, stage)
            sStats = storage.stats.get_tensor(cute.make_layout((TILE_M, 2, self.q_stage)))
        return BwdSmem(sQ, sdO, sK, sV, sdS, sAmax, sStats, stats_base, dq_base, sDQ, fp8)

    @cute.jit
    def _produce(self, ops: BwdOperands, sm: BwdSmem, q_pipe, kv_pipe, tile: KeyTile):
        """Producer warp: K and V of the key tile (once), then Q and dO of every (head g, query tile m) step
        (smem_stats: and that tile's 64 LSE and 64 delta values, by lane 0, on the stage's mbarrier)."""
        h = self.h
        n, bk = tile.n, tile.bk
        part = tma_tile_partition
        tQsQ, tQgQ = part(ops.q.atom, ops.q.tensor, sm.q, (TILE_M, h))
        tOsO, tOgO = part(ops.do.atom, ops.do.tensor, sm.do, (TILE_M, h))
        tKsK, tKgK = part(ops.k.atom, ops.k.tensor, sm.k, (CTA_N, h))
        tVsV, tVgV = part(ops.v.atom, ops.v.tensor, sm.v, (CTA_N, h))
        if cutlass.const_expr(self.sdp_fp8):
            f8 = ops.fp8
            sQ8, sdO8, sK8, sV8 = sm.fp8
            tQsQ8, tQgQ8 = part(f8.q8.atom, f8.q8.tensor, sQ8, (TILE_M, h))
            tOsO8, tOgO8 = part(f8.do8.atom, f8.do8.tensor, sdO8, (TILE_M, h))
            tKsK8, tKgK8 = part(f8.k8.atom, f8.k8.tensor, sK8, (CTA_N, h))
            tVsV8, tVgV8 = part(f8.v8.atom, f8.v8.tensor, sV8, (CTA_N, h))
        if tile.steps > 0:
            kv_prod = kv_pipe.make_producer()
            handle = kv_prod.acquire_and_advance()
            cute.copy(ops.k.atom, tKgK[(None, n, 0, bk)], tKsK[(None, 0)], tma_bar_ptr=handle.barrier)
            if cutlass.const_expr(self.sdp_fp8):
                cute.copy(f8.k8.atom, tKgK8[(None, n, 0, bk)], tKsK8[(None, 0)], tma_bar_ptr=handle.barrier)
                cute.copy(f8.v8.atom, tVgV8[(None, n, 0, bk)], tVsV8[(None, 0)], tma_bar_ptr=handle.barrier)
            else:
                cute.copy(ops.v.atom, tVgV[(None, n, 0, bk)], tVsV[(None, 0)], tma_bar_ptr=handle.barrier)
            q_prod = q_pipe.make_producer()
            for it in cutlass.range(tile.steps, unroll=1):
                # KeyTile.step's (query tile, query head) of this step, spelled out: the head's add after the
                # stage's acquire, the order the kernel was measured in
                g = it // tile.n_m
                m = tile.m_start + it - g * tile.n_m
                handle = q_prod.acquire_and_advance()
                bn = tile.bn0 + g  # the step's query head: dO, LSE, delta, and Q's
                q_head = bn
                if cutlass.const_expr(self.config.broadcast_q):
                    q_head = bn % ops.q.tensor.shape[2]  # batch 0's head n: the one query sequence
                stage, bar = handle.index, handle.barrier
                cute.copy(ops.q.atom, tQgQ[(None, m, 0, q_head)], tQsQ[(None, stage)], tma_bar_ptr=bar)
                cute.copy(ops.do.atom, tOgO[(None, m, 0, bn)], tOsO[(None, stage)], tma_bar_ptr=bar)
                if cutlass.const_expr(self.sdp_fp8):
                    cute.copy(f8.q8.atom, tQgQ8[(None, m, 0, q_head)], tQsQ8[(None, stage)], tma_bar_ptr=bar)
                    cute.copy(f8.do8.atom, tOgO8[(None, m, 0, bn)], tOsO8[(None, stage)], tma_bar_ptr=bar)
                if cutlass.const_expr(self.smem_stats):
                    if cute.arch.lane_idx() == 0:
                        offset = (Int64(bn) * Int64(ops.lse.shape[1]) + Int64(m * TILE_M)) * 4
                        dst = sm.stats_base + stage * self.stats_bytes
                        mbar = bar.toint()
                        half = self.stats_bytes // 2
                        bulk_load(dst, ops.lse.iterator.toint() + offset, half, mbar)
                        bulk_load(dst + half, ops.delta.iterator.toint() + offset, half, mbar)


def make_kernel(config: AttentionBwdConfig) -> AttentionBackwardSm90:
    return AttentionBackwardSm90(config)
