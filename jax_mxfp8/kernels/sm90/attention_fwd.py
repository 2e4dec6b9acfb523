"""MXFP8 attention forward for Hopper (sm_90a), CuTe DSL, compiled ahead of time.

Supported features (kernels/registry.py, AttentionFwdConfig):
  head_dim 64 or 128; non-causal or causal (top-left: query i sees keys j <= i); GQA/MQA (query head n
  reads KV head n // G); per-batch query and KV lengths (padded batches); packed jagged sequences
  (config.packed: one batch row holding every sequence from a 128-row tile boundary, a work list of
  (sequence, query tile) items; ops/varlen_kernel.py); kv tile 128 (= the contract's
  AttentionConfig.kv_tile default, visited in ascending order, as the reference does); p_scale "const"
  and "block" (scale rule "up"; "floor" is implemented but not registered, see below); one query
  sequence for every batch row (config.broadcast_q: q, qs of batch 1 read at batch 0; O, LSE per row).
  Not here (the XLA reference takes them): bias and boolean masks, causal_safe, p_scale "block" with
  scale_rounding "floor", qkv_blocks "row", other kv tiles, head_dim 256.

Inputs come from the producer pass jax_mxfp8.primitives.attention_fwd.prepare_sequence_major (exponents
in XLA, the FP8 data through kernels/sm90/attention_realign.py; `prepare` is its XLA formulation), which
re-encodes the contract's square-block MX operands to a shared exponent per GEMM sub-tile (docs/numerics.md
"Hopper attention kernel"; operand tables: docs/interfaces.md):
  q   (B*N*Tp, H)     float8_e4m3fn  Q' rows, head-major (b, n, t); Tp = T rounded up to 128
  k   (B*K*Sp, H)     float8_e4m3fn  K' rows, head-major (b, kv, s); Sp = S rounded up to 128
  vt  (B*K*H, Sp)     float8_e4m3fn  V'^T: per (b, kv) an (H, Sp) matrix whose columns are the KV
                                     positions, permuted inside every 32 by PV_PERMUTATION (wgmma_fragment.py)
  qs  (B*N, Tp/32)    float32        tau * log2(e) * 2^eQ per 32 query rows
  ks  (B*K, Sp/32)    float32        2^eK per 32 keys
  vs  (B*K, Sp/128*H/32) float32     2^eV per (kv tile, 32 head-dim columns)
  vi  (B*K, Sp/128*H/32) float32     2^-eV (the same, inverted exactly)
  lens (2, B)         int32          query lengths, KV lengths (<= T, S)
Outputs:
  o   (B*Tp*N, H)     bfloat16       O in the caller's (B, Tp, N, H) layout (no transpose after the
                                     kernel); rows >= q_len are 0
  lse (B*N, Tp)       float32        natural-log LSE; -inf on rows with no valid key (and rows >= q_len)

Numerics, per 32x32 sub-tile of S the exact scale product is 2^(eQ+eK), so
S = (qs * ks[g]) * (Q' K'^T) with g = the key's 32-group. P~ = exp2(S*log2e - m) is computed as
ex2((t - m) + 8) = 256 P~ with t = acc * c_g rounded once (mul.rn; the max m is over the same t, so t - m
is 0 at the max and <= 0 elsewhere for any logit magnitude; fp32_math.softmax_exponent), the contract's
constant P scale 2^-8 as the offset, and
rounded to E4M3 (cvt.rn.satfinite), l sums the float32 values before rounding. PV runs on V' of the tile
in units of 2^eV[tile, hg]; acc_O is kept in the current tile's units: the per-tile online-softmax rescale
becomes alpha_row * 2^(eV[j-1,hg] - eV[j,hg]) (exact powers of two). Epilogue: O = acc * 2^eV[last] / l.

Packed variant (launch_packed): the same operands with B = 1, Tp / Sp the aligned packed row counts, plus
  seqs (4, S) int32  per sequence: first query tile, first KV tile, query length, KV length
  work (2, W) int32  per CTA column: (sequence, query tile inside it), longest first; sequence -1 = no work
and o (Tp, N, H), lse (N, Tp) in the aligned rows. Each CTA runs the dense code on its sequence's tiles
(tile offsets qt0, kt0; masks and lengths relative to the sequence), so a sequence gets the bits the
dense kernel gives it alone on a padded batch. Rows outside every sequence's query tiles are not written.

p_scale "block" (config.p_scale): the contract scales P~ per 32-key block along KV, the P V GEMM's
contracting axis, which wgmma cannot do; the kernel re-encodes instead, as for Q and K: ONE power-of-two
scale s_rt = 2^-off per (query row, KV tile), the one the contract's rule gives for the row-tile's amax
2^-d, d = m - tile_max ("up": off = floor(d + log2 448); "floor": off = 8 + ceil(d)), capped at
P_OFFSET_MAX = 24 (acc_O bound). P = ex2((t - m) + off) = P~ * 2^off, cvt.rn.satfinite to E4M3
(satfinite: where float rounding of d picks the finer scale, the max lands just above 448 and becomes
448 * s_rt, the contract's value). Why that is the contract's numerics: every 32-key block's contract
scale s_b <= s_rt; an element x >= 2^-6 * s_rt is E4M3-normal at both scales, so both round it to 3
mantissa bits in its own binade: identical values; smaller elements differ by at most half a subnormal
step, 2^-10 * s_rt (tests/attention/test_attention_kernel_pblock.py checks it bit for bit). "floor" also
saturates a block's elements above 448 * s_b, which a coarser s_rt does not reproduce (1-2% of O,
below the 40 dB gate): those variants are not registered. Units: l stays in 2^-8 units
(row_sum = row_sum * alpha + sum(P) * 2^(8 - off), so LSE is unchanged); acc_O is kept in the current
tile's P units: the rescale factor becomes alpha_row * 2^(off_j - off_{j-1}) * 2^(eV[j-1] - eV[j]), and
the epilogue multiplies by 2^(8 - off_last). A fully masked row-tile keeps the previous offset (no
inf - inf); a NaN row gets the cap and stays NaN through its P and l. Powers of two are built from
exponent bits (F2I, SHL, IADD), never ex2. Cost: a floor, a min, a select and two such powers per row
and tile, and the acc_O rescale on tiles whose offset moved (64 FMUL per thread).

P V accumulation (config.pv_fp32, production at H64): each tile's P V runs on a fresh wgmma accumulator that
float32 FADDs add to acc_O, because the FP8 wgmma's own accumulation keeps fewer bits than float32 and a
chain over all KV tiles loses small addends beside a large sum (docs/numerics.md "P V accumulation"). At
H128 the extra registers spill, so H128 chains P V on acc_O (the known error on attention-sink inputs).

Structure (per CTA: one (batch, query head, 128-row tile); 3 warpgroups, FA3-style):
  WG0   producer: one warp issues TMA for Q (two 64-row stages, one per consumer), then K_j, V_j into a
        shared K/V ring of `kv_stage` stages (K and V tiles have the same bytes), 24 registers.
  WG1/2 consumers (240 registers), 64 query rows each: S = Q K_j^T (FP8 wgmma, both operands K-major from
        shared memory), online softmax in registers, P packed to E4M3 in registers as the A operand of
        O += P V_j (wgmma RS; V' is K-major along KV because it is stored transposed).
  P needs no shuffles: packed from the S accumulator in the A fragment's order, its k-slot a holds key
  PV_PERMUTATION[a] of every 32, the order the producer pass stores V'^T in (kernels/sm90/wgmma_fragment.py).
  With config.overlap the consumer issues S_{j+1} = Q K_{j+1}^T before O += P_j V_j and runs the softmax of
  tile j+1 while that PV wgmma is in flight (FA3's intra-warpgroup overlap).
Building blocks (shared with the other kernels, import them rather than copy): kernels/sm90/ tile_scheduler
(dense grid / packed work list -> WorkTile), warp_specialization (TMA pipelines, turns, registers), wgmma
and wgmma_fragment (FP8 MMAs, accumulator -> A repacking), attention_mask, attention_softmax (online
softmax step, P offset, acc_O rescale); kernels/common/fp32_math (pow2, tree_reduce).

Measured on the H200 (docs/perf/attention-forward.md, benchmarks/results/h200_attention_fwd.json): O within
45.9-52.1 dB of the XLA reference (LSE 97-106 dB), 0.01 dB of its float64 SQNR; 717-811 TFLOP/s
non-causal at N16 H128 (1.13-1.33x cuDNN BF16, 0.77-0.89x cuDNN FP8), latency-bound (ncu: 40% issue
slots, 36% tensor pipe).
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32

from jax_mxfp8.kernels.common.fp32_math import pow2
from jax_mxfp8.kernels.registry import P_CONST_OFFSET, AttentionFwdConfig
from jax_mxfp8.kernels.sm90 import warp_specialization as ws
from jax_mxfp8.kernels.sm90 import wgmma
from jax_mxfp8.kernels.sm90.attention_mask import AttentionMask
from jax_mxfp8.kernels.sm90.attention_softmax import OnlineSoftmax
from jax_mxfp8.kernels.sm90.tile_scheduler import DenseTileScheduler, PackedTileScheduler, WorkTile
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords, pack_acc_to_a_fp8

FP8 = cutlass.Float8E4M3FN
TILE_M = 64  # query rows per consumer warpgroup
NUM_CONSUMERS = 2
CTA_M = TILE_M * NUM_CONSUMERS
TILE_N = 128  # keys per KV tile (the reference's kv_tile)
LN2 = math.log(2.0)


class AttentionForwardSm90:
    """Host entry: (q, k, vt, qs, ks, vs, vi, lens, o, lse, stream); see the module docstring for shapes."""

    def __init__(self, config: AttentionFwdConfig):
        self.config = config
        self.h = config.head_dim
        self.hg = self.h // 32
        self.kv_stage = config.kv_stage
        self.block_p = config.p_scale == "block"
        self.qk_tiler = (TILE_M, TILE_N, self.h)
        self.pv_tiler = (TILE_M, self.h, TILE_N)
        self.threads = ws.WARPGROUP_THREADS * (1 + NUM_CONSUMERS)
        self.mask = AttentionMask(config.causal, CTA_M, TILE_N)
        self.softmax = OnlineSoftmax(config, self.mask, TILE_N)
        ws.check_register_budget(NUM_CONSUMERS)

    # ------------------------------------------------------------------------------------------------
    # AOT interface (tools/build_kernels.py)
    # ------------------------------------------------------------------------------------------------

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        def t(dtype, rows, cols):
            return make_fake_compact_tensor(dtype, (rows, cols), stride_order=(1, 0), assumed_align=16)

        s = cute.sym_int32
        return (
            t(FP8, s(divisibility=128), s(divisibility=64)),  # q
            t(FP8, s(divisibility=128), s(divisibility=64)),  # k
            t(FP8, s(divisibility=64), s(divisibility=128)),  # vt
            t(Float32, s(), s(divisibility=4)),  # qs
            t(Float32, s(), s(divisibility=4)),  # ks
            t(Float32, s(), s(divisibility=2)),  # vs
            t(Float32, s(), s(divisibility=2)),  # vi
            t(Int32, s(), s()),  # lens (dense) or seqs (packed)
            *((t(Int32, s(), s()),) if self.config.packed else ()),  # work (packed)
            t(cutlass.BFloat16, s(divisibility=128), s(divisibility=64)),  # o
            t(Float32, s(), s(divisibility=128)),  # lse
            make_fake_stream(),
        )

    def tensor_names(self) -> tuple[str, ...]:
        if self.config.packed:
            return ("q", "k", "vt", "qs", "ks", "vs", "vi", "seqs", "work", "o", "lse")
        return ("q", "k", "vt", "qs", "ks", "vs", "vi", "lens", "o", "lse")

    def entry(self):
        return self.launch_packed if self.config.packed else self.launch

    # ------------------------------------------------------------------------------------------------
    # Host side: views, TMA descriptors, launch
    # ------------------------------------------------------------------------------------------------

    @cute.jit
    def launch(
        self,
        q2: cute.Tensor,
        k2: cute.Tensor,
        vt2: cute.Tensor,
        qs: cute.Tensor,
        ks: cute.Tensor,
        vs: cute.Tensor,
        vi: cute.Tensor,
        lens: cute.Tensor,
        o2: cute.Tensor,
        lse: cute.Tensor,
        stream: cuda.CUstream,
    ):
        """Dense batch: grid (Tp / 128, B * N), one CTA per (128-row query tile, batch and head)."""
        self._launch(q2, k2, vt2, qs, ks, vs, vi, lens, lens, o2, lse, stream, qs.shape[1] * 32 // CTA_M, lens.shape[1])

    @cute.jit
    def launch_packed(
        self,
        q2: cute.Tensor,
        k2: cute.Tensor,
        vt2: cute.Tensor,
        qs: cute.Tensor,
        ks: cute.Tensor,
        vs: cute.Tensor,
        vi: cute.Tensor,
        seqs: cute.Tensor,
        work: cute.Tensor,
        o2: cute.Tensor,
        lse: cute.Tensor,
        stream: cuda.CUstream,
    ):
        """Packed sequences (one batch row holding every sequence, each starting on a 128-row tile): grid
        (W, N), one CTA per (work item, head); work[:, i] = (sequence, its query tile), or sequence -1."""
        self._launch(q2, k2, vt2, qs, ks, vs, vi, seqs, work, o2, lse, stream, work.shape[1], 1)

    @cute.jit
    def _launch(
        self,
        q2: cute.Tensor,
        k2: cute.Tensor,
        vt2: cute.Tensor,
        qs: cute.Tensor,
        ks: cute.Tensor,
        vs: cute.Tensor,
        vi: cute.Tensor,
        lens: cute.Tensor,
        work: cute.Tensor,
        o2: cute.Tensor,
        lse: cute.Tensor,
        stream: cuda.CUstream,
        grid_x: Int32,
        nb: Int32,
    ):
        h = self.h
        bn = qs.shape[0]
        q_heads = bn
        if cutlass.const_expr(self.config.broadcast_q):
            bn = lse.shape[0]  # q and qs hold one batch row (N heads); the grid and O, LSE have B * N
        bk = ks.shape[0]
        tp = qs.shape[1] * 32
        sp = ks.shape[1] * 32
        # (rows, H, heads) views of the 2-D buffers
        q = cute.make_tensor(q2.iterator, cute.make_layout((tp, h, q_heads), stride=(h, 1, tp * h)))
        k = cute.make_tensor(k2.iterator, cute.make_layout((sp, h, bk), stride=(h, 1, sp * h)))
        vt = cute.make_tensor(vt2.iterator, cute.make_layout((h, sp, bk), stride=(sp, 1, sp * h)))
        # O is written in the caller's (B, Tp, N, H) layout: head bn = b * N + n, rows N * H apart
        heads = bn // nb
        o = cute.make_tensor(
            o2.iterator, cute.make_layout((tp, h, (heads, nb)), stride=(heads * h, 1, (h, tp * heads * h)))
        )

        kmajor = utils.LayoutEnum.ROW_MAJOR
        qk_mma = self._qk_mma()
        pv_mma = self._pv_mma()
        q_smem = sm90_utils.make_smem_layout_a(kmajor, self.qk_tiler, FP8, NUM_CONSUMERS)
        k_smem = sm90_utils.make_smem_layout_b(kmajor, self.qk_tiler, FP8, self.kv_stage)
        v_smem = sm90_utils.make_smem_layout_b(kmajor, self.pv_tiler, FP8, self.kv_stage)

        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tq = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, q, cute.slice_(q_smem, (None, None, 0)), (TILE_M, h))
        tma_k, tk = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, k, cute.slice_(k_smem, (None, None, 0)), (TILE_N, h))
        tma_v, tv = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, vt, cute.slice_(v_smem, (None, None, 0)), (h, TILE_N))
        self.q_bytes = cute.size_in_bytes(FP8, cute.slice_(q_smem, (None, None, 0)))
        self.kv_bytes = cute.size_in_bytes(FP8, cute.slice_(k_smem, (None, None, 0)))

        @cute.struct
        class SharedStorage:
            q_mbar: cute.struct.MemRange[cutlass.Int64, NUM_CONSUMERS * 2]
            kv_mbar: cute.struct.MemRange[cutlass.Int64, self.kv_stage * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[FP8, cute.cosize(q_smem)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[FP8, cute.cosize(k_smem)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(
            qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, qs, ks, vs, vi, lens, work, o, lse, q_smem, k_smem, v_smem
        ).launch(
            grid=[grid_x, bn, 1],
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ------------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        mQs: cute.Tensor,
        mKs: cute.Tensor,
        mVs: cute.Tensor,
        mVi: cute.Tensor,
        mLen: cute.Tensor,
        mWork: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        q_smem: cute.ComposedLayout,
        k_smem: cute.ComposedLayout,
        v_smem: cute.ComposedLayout,
    ):
        if cutlass.const_expr(self.config.packed):
            # one batch row; padding items past the work list's end are not live
            w = PackedTileScheduler().work_tile(mWork, mLen, mQs.shape[0], mKs.shape[0])
            if w.live:
                self._cta(
                    qk_mma, pv_mma, tma_q, mQ, tma_k, mK, tma_v, mV, mQs, mKs, mVs, mVi, mO, mLse,
                    q_smem, k_smem, v_smem, w,
                )  # fmt: skip
        else:
            # q_heads = B * N: with broadcast_q only LSE (and O) have every batch row's heads
            q_heads = mLse.shape[0] if cutlass.const_expr(self.config.broadcast_q) else mQs.shape[0]
            w = DenseTileScheduler(self.config.causal).work_tile(mLen, q_heads, mKs.shape[0])
            self._cta(
                qk_mma, pv_mma, tma_q, mQ, tma_k, mK, tma_v, mV, mQs, mKs, mVs, mVi, mO, mLse, q_smem, k_smem, v_smem, w
            )

    @cute.jit
    def _cta(
        self, qk_mma, pv_mma, tma_q, mQ, tma_k, mK, tma_v, mV, mQs, mKs, mVs, mVi, mO, mLse,
        q_smem, k_smem, v_smem, w: WorkTile,
    ):  # fmt: skip
        """One CTA's work w: query tile m_tile (128 rows) of head bn against KV head bkv. qt0, kt0: the
        sequence's first query / KV tile in the operands (0 for a dense batch); m_tile, lengths and masks
        are relative to the sequence. Warp roles: WG0 produces (one warp), WG1/2 consume."""
        m_tile, bn, bkv, q_len, kv_len, qt0, kt0, _ = w
        tidx, _, _ = cute.arch.thread_idx()
        n_tiles = self.mask.kv_tile_count(m_tile, q_len, kv_len)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        # one Q stage per consumer warpgroup, each filled and read once
        q_pipe = ws.make_tma_pipeline(storage.q_mbar.data_ptr(), NUM_CONSUMERS, ws.WARPGROUP_WARPS, self.q_bytes)
        # K_j and V_j take one stage each (same bytes); every consumer warp releases each stage
        kv_pipe = ws.make_tma_pipeline(
            storage.kv_mbar.data_ptr(), self.kv_stage, ws.WARPGROUP_WARPS * NUM_CONSUMERS, self.kv_bytes
        )
        kv_prod = kv_pipe.make_producer()

        sQ = storage.sQ.get_tensor(q_smem.outer, swizzle=q_smem.inner)
        sK = storage.sKV.get_tensor(k_smem.outer, swizzle=k_smem.inner)
        sV = cute.make_tensor(cute.recast_ptr(sK.iterator, v_smem.inner), v_smem.outer)

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)

        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if wg == 0:
            cute.arch.setmaxregister_decrease(ws.PRODUCER_REGISTERS)
            if warp == 0:
                self._produce(
                    tma_q, mQ, sQ, tma_k, mK, sK, tma_v, mV, sV, q_pipe, kv_prod, qt0 + m_tile, self._q_head(bn, mQs),
                    bkv, kt0, n_tiles,
                )  # fmt: skip
        else:
            cute.arch.setmaxregister_increase(ws.CONSUMER_REGISTERS)
            self._consume(
                qk_mma, pv_mma, sQ, sK, sV, q_pipe, kv_pipe, mQs, mKs, mVs, mVi, mO, mLse,
                m_tile, bn, bkv, q_len, kv_len, n_tiles, qt0, kt0, wg - 1, tidx % 128,
            )  # fmt: skip

    def _q_head(self, bn, mQs):
        """The Q (and qs) head row of CTA head bn = b * N + n: bn itself, or with config.broadcast_q batch 0's
        head n (mQs then holds the N heads of the one query sequence). Traced inline (a trace-time branch)."""
        return bn % mQs.shape[0] if self.config.broadcast_q else bn

    @cute.jit
    def _produce(self, tma_q, mQ, sQ, tma_k, mK, sK, tma_v, mV, sV, q_pipe, kv_prod, q_tile, bn, bkv, kt0, n_tiles):
        """Producer warp: Q (one 64-row stage per consumer) of the operands' 128-row tile q_tile, then K_j,
        V_j of KV tiles kt0 + j for j = 0 .. n_tiles - 1."""
        tQsQ, tQgQ = cute.nvgpu.cpasync.tma_partition(
            tma_q,
            0,
            cute.make_layout(1),
            cute.group_modes(sQ, 0, 2),
            cute.group_modes(cute.flat_divide(mQ, (TILE_M, self.h)), 0, 2),
        )
        tKsK, tKgK = cute.nvgpu.cpasync.tma_partition(
            tma_k,
            0,
            cute.make_layout(1),
            cute.group_modes(sK, 0, 2),
            cute.group_modes(cute.flat_divide(mK, (TILE_N, self.h)), 0, 2),
        )
        tVsV, tVgV = cute.nvgpu.cpasync.tma_partition(
            tma_v,
            0,
            cute.make_layout(1),
            cute.group_modes(sV, 0, 2),
            cute.group_modes(cute.flat_divide(mV, (self.h, TILE_N)), 0, 2),
        )
        for c in cutlass.range_constexpr(NUM_CONSUMERS):
            state = pipeline.PipelineState(NUM_CONSUMERS, Int32(0), Int32(c), Int32(1))
            q_pipe.producer_acquire(state)
            cute.copy(
                tma_q,
                tQgQ[(None, q_tile * NUM_CONSUMERS + c, 0, bn)],
                tQsQ[(None, c)],
                tma_bar_ptr=q_pipe.producer_get_barrier(state),
            )
        for j in cutlass.range(n_tiles, unroll=1):
            handle = kv_prod.acquire_and_advance()
            cute.copy(tma_k, tKgK[(None, kt0 + j, 0, bkv)], tKsK[(None, handle.index)], tma_bar_ptr=handle.barrier)
            handle = kv_prod.acquire_and_advance()
            cute.copy(tma_v, tVgV[(None, 0, kt0 + j, bkv)], tVsV[(None, handle.index)], tma_bar_ptr=handle.barrier)

    @cute.jit
    def _consume(
        self, qk_mma, pv_mma, sQ, sK, sV, q_pipe, kv_pipe, mQs, mKs, mVs, mVi, mO, mLse,
        m_tile, bn, bkv, q_len, kv_len, n_tiles, qt0, kt0, c, tid,
    ):  # fmt: skip
        """One consumer warpgroup: 64 query rows (c = 0 or 1) over all visited KV tiles, then the epilogue.
        Rows and KV tiles are counted from the sequence start; qt0, kt0 locate it in the operands."""
        h, hg = self.h, self.hg
        qk_thr = qk_mma.get_slice(tid)
        pv_thr = pv_mma.get_slice(tid)
        tSrQ = qk_mma.make_fragment_A(qk_thr.partition_A(sQ))
        tSrK = qk_mma.make_fragment_B(qk_thr.partition_B(sK))
        tOrV = pv_mma.make_fragment_B(pv_thr.partition_B(sV))
        acc_s = cute.make_rmem_tensor(qk_thr.partition_shape_C((TILE_M, TILE_N)), Float32)
        acc_o = cute.make_rmem_tensor(pv_thr.partition_shape_C((TILE_M, h)), Float32)
        # config.pv_fp32: each tile's P V goes to a fresh accumulator that the CUDA cores add to acc_O (the
        # tensor core's FP8 accumulation keeps too few bits for a long chain of small addends)
        acc_pv = cute.make_rmem_tensor(pv_thr.partition_shape_C((TILE_M, h)), Float32) if self.config.pv_fp32 else acc_o
        p_f32 = cute.make_rmem_tensor(pv_thr.partition_shape_A((TILE_M, TILE_N)), Float32)
        p_fp8 = cute.make_rmem_tensor(pv_thr.partition_shape_A((TILE_M, TILE_N)), FP8)
        # partitioned before the main loop: the wgmma ACCUMULATE field set inside it rebinds the tiled MMA
        tOgO = pv_thr.partition_C(cute.local_tile(mO, (TILE_M, h), ((qt0 + m_tile) * NUM_CONSUMERS + c, 0, bn)))
        assert cute.size(acc_s) == 64 and cute.size(p_fp8) == 64 and cute.size(acc_o) == h // 2

        lane = tid % 32
        row0 = m_tile * CTA_M + c * TILE_M + (tid // 32) * 16 + lane // 4  # this thread's rows: row0, row0 + 8
        col_in_tile = 2 * (lane % 4)  # + v0 + 8 * nb
        # tau * log2(e) * 2^eQ of the 32-row block holding both rows
        q_factor = mQs[self._q_head(bn, mQs), qt0 * (CTA_M // 32) + row0 // 32]

        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            row_max[r] = -Float32.inf
            row_sum[r] = Float32(0.0)
        acc_o.fill(0.0)
        v_prev = cute.make_rmem_tensor((hg,), Float32)  # 2^eV of the previous tile
        for g in cutlass.range_constexpr(hg):
            v_prev[g] = Float32(1.0)
        # p_scale="block": each row's P offset of the previous tile (acc_O's P units); unused for "const"
        p_off = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            p_off[r] = Float32(P_CONST_OFFSET)

        q_pipe.consumer_wait(pipeline.PipelineState(NUM_CONSUMERS, Int32(0), c, Int32(0)))
        tSrQ = tSrQ[(None, None, None, c)]

        if cutlass.const_expr(not self.config.overlap):
            for j in cutlass.range(n_tiles, unroll=1):
                kv_pipe.consumer_wait(self._kv_state(2 * j))
                cute.nvgpu.warpgroup.fence()
                self._gemm("qk", acc_s, tSrQ, tSrK[(None, None, None, (2 * j) % self.kv_stage)], False)
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(0)
                kv_pipe.consumer_release(self._kv_state(2 * j))
                alpha = self.softmax.step(
                    acc_s, row_max, row_sum, p_off, q_factor, mKs, bkv, kt0, j, m_tile, row0, col_in_tile, kv_len
                )
                pack_acc_to_a_fp8(acc_s, p_f32, p_fp8)
                self.softmax.rescale_o(acc_o, alpha, v_prev, mVs, mVi, bkv, kt0 + j)
                kv_pipe.consumer_wait(self._kv_state(2 * j + 1))
                cute.nvgpu.warpgroup.fence()
                self._gemm("pv", acc_pv, p_fp8, tOrV[(None, None, None, (2 * j + 1) % self.kv_stage)], self._pv_chain)
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(0)
                kv_pipe.consumer_release(self._kv_state(2 * j + 1))
                self._add_pv(acc_o, acc_pv)
        else:
            # S_j = Q K_j^T is issued together with O += P_{j-1} V_{j-1}; softmax(j) runs while P V is in flight
            if n_tiles > 0:
                kv_pipe.consumer_wait(self._kv_state(0))
                cute.nvgpu.warpgroup.fence()
                self._gemm("qk", acc_s, tSrQ, tSrK[(None, None, None, 0)], False)
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(0)
                kv_pipe.consumer_release(self._kv_state(0))
                alpha0 = self.softmax.step(
                    acc_s, row_max, row_sum, p_off, q_factor, mKs, bkv, kt0, 0, m_tile, row0, col_in_tile, kv_len
                )
                pack_acc_to_a_fp8(acc_s, p_f32, p_fp8)
                self.softmax.rescale_o(acc_o, alpha0, v_prev, mVs, mVi, bkv, kt0)
            for j in cutlass.range(1, n_tiles, unroll=1):
                kv_pipe.consumer_wait(self._kv_state(2 * j))
                kv_pipe.consumer_wait(self._kv_state(2 * j - 1))
                cute.nvgpu.warpgroup.fence()
                self._gemm("qk", acc_s, tSrQ, tSrK[(None, None, None, (2 * j) % self.kv_stage)], False)
                cute.nvgpu.warpgroup.commit_group()
                self._gemm("pv", acc_pv, p_fp8, tOrV[(None, None, None, (2 * j - 1) % self.kv_stage)], self._pv_chain)
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(1)
                kv_pipe.consumer_release(self._kv_state(2 * j))
                alpha = self.softmax.step(
                    acc_s, row_max, row_sum, p_off, q_factor, mKs, bkv, kt0, j, m_tile, row0, col_in_tile, kv_len
                )
                cute.nvgpu.warpgroup.wait_group(0)
                kv_pipe.consumer_release(self._kv_state(2 * j - 1))
                self._add_pv(acc_o, acc_pv)
                pack_acc_to_a_fp8(acc_s, p_f32, p_fp8)
                self.softmax.rescale_o(acc_o, alpha, v_prev, mVs, mVi, bkv, kt0 + j)
            if n_tiles > 0:
                last = 2 * n_tiles - 1
                kv_pipe.consumer_wait(self._kv_state(last))
                cute.nvgpu.warpgroup.fence()
                self._gemm("pv", acc_pv, p_fp8, tOrV[(None, None, None, last % self.kv_stage)], self._pv_chain)
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(0)
                kv_pipe.consumer_release(self._kv_state(last))
                self._add_pv(acc_o, acc_pv)

        self._epilogue(tOgO, acc_o, row_max, row_sum, p_off, v_prev, mLse, bn, qt0 * CTA_M, row0, q_len)

    @property
    def _pv_chain(self) -> bool:
        """Whether P V accumulates onto acc_O in the tensor core (False: a fresh accumulator per tile)."""
        return not self.config.pv_fp32

    @cute.jit
    def _add_pv(self, acc_o, acc_pv):
        """config.pv_fp32: acc_O += this tile's P V (float32 FADD on the CUDA cores)."""
        if cutlass.const_expr(self.config.pv_fp32):
            for i in cutlass.range_constexpr(cute.size(acc_o)):
                acc_o[i] = acc_o[i] + acc_pv[i]

    def _qk_mma(self) -> cute.TiledMma:
        """S = Q K^T: both operands K-major in shared memory, float32 accumulator (64 x 128)."""
        return wgmma.make_fp8_ss_mma(self.qk_tiler[:2])

    def _pv_mma(self) -> cute.TiledMma:
        """O += P V: P (A) in registers, V'^T K-major in shared memory (64 x H)."""
        return wgmma.make_fp8_rs_mma(self.pv_tiler[:2])

    def _gemm(self, which: str, acc, a, b, accumulate_first: bool):
        """S = Q K_j^T ("qk") or O (+)= P V_j ("pv"): wgmma.gemm on a fresh tiled MMA (fence/commit/wait are
        the caller's)."""
        wgmma.gemm(self._qk_mma if which == "qk" else self._pv_mma, acc, a, b, accumulate_first)

    def _kv_state(self, pos):
        """Consumer state of K/V ring position pos (K_j at 2j, V_j at 2j + 1)."""
        return ws.ring_state(self.kv_stage, pos)

    @cute.jit
    def _epilogue(self, tOgO, acc_o, row_max, row_sum, p_off, v_last, mLse, bn, lse_row0, row0, q_len):
        """O = acc * 2^eV[last] / l in bfloat16 (times 2^(8 - p_off[last]) for p_scale="block": acc_O is in
        the last tile's P units, l in 2^-8 units), LSE = ln2 * (m - 8 + log2 l); zeros / -inf for empty rows."""
        inv = cute.make_rmem_tensor((2,), Float32)
        lse = cute.make_rmem_tensor((2,), Float32)
        keep = cute.make_rmem_tensor((2,), cutlass.Boolean)
        for v1 in cutlass.range_constexpr(2):
            total = row_sum[v1]
            for s in cutlass.range_constexpr(1, 3):
                total = total + cute.arch.shuffle_sync_bfly(total, offset=s)
            # rows past q_len are masked whole in the reference: 0 and -inf even if a NaN reached them
            live = (row0 + 8 * v1 < q_len) & ((total > 0.0) | (total != total))
            keep[v1] = live
            inv[v1] = Float32(0.0)
            lse[v1] = -Float32.inf
            if live:
                inv[v1] = cute.arch.rcp_approx(total)
                if cutlass.const_expr(self.block_p):
                    inv[v1] = inv[v1] * pow2(float(P_CONST_OFFSET) - p_off[v1])
                lse[v1] = (row_max[v1] - 8.0 + cute.math.log2(total, fastmath=True)) * LN2
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            _, v1, nb = acc_coords(i)
            acc_o[i] = cutlass.select_(keep[v1], acc_o[i] * (v_last[nb // 4] * inv[v1]), Float32(0.0))
        out = cute.make_rmem_tensor_like(acc_o, cutlass.BFloat16)
        out.store(acc_o.load().to(cutlass.BFloat16))
        cute.autovec_copy(out, tOgO)
        lane = cute.arch.lane_idx()
        if lane % 4 == 0:
            mLse[bn, lse_row0 + row0] = lse[0]
            mLse[bn, lse_row0 + row0 + 8] = lse[1]


def make_kernel(config: AttentionFwdConfig) -> AttentionForwardSm90:
    return AttentionForwardSm90(config)
