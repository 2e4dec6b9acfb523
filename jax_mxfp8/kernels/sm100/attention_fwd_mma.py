"""The Blackwell attention forward's tensor-core side (sm_100f, CuTe DSL): the two block-scaled tiled MMAs with
their shared-memory, scale and TMEM layouts (ForwardMmas), and the MMA warp's schedule (MmaRole, a method
mixin of kernels/sm100/attention_fwd.AttentionForwardSm100).

  S_s = Q_s K_j^T   tcgen05.mma kind::mxf8f6f4.block_scale, M 128, N 128, K head_dim: Q and K K-major in
                    shared memory, scales (Q's "hd" chunk, K's "hd" chunk) copied to the slot SF_QK_s
  O_s += P_s V_j    M 128, N head_dim, K 128: P (E4M3) from TMEM (K-major: row = lane, key k in byte k % 4
                    of column k // 4), V MN-major in shared memory (the sequence-major bytes as is), scales
                    (P's bytes, written by the softmax to shared memory; V's "seq" chunk) copied to SF_PV_s
Every scale copy is tcgen05.cp 4x32dp128bit (UTCCP) of one 512-byte chunk into 4 TMEM columns (SFA), the
next 4 (SFB); the slots are the declared map's (attention_fwd_config.tmem_columns).

MMA warp schedule (docs/perf/blackwell-attention.md "MMA warp schedule"; key tile j, Q tile s), per item
with n KV tiles, K_j at ring position p + 2 j and V_j at p + 2 j + 1:
  start   for s: [wait its V (s = 0), previous item's last PV_s, commit O_s full]; [wait Q_s, S_{1-s} drained]
          cp SF_QK_s;
          QK_s(0); commit S_s full              (the KV-unroll overlap across items: one item's last P V
                                                 runs next to the next item's first Q K)
  j < n-1 for s: [wait P_s(j) ready] cp SF_PV_s; PV_s(j); [wait S_{1-s} drained] cp SF_QK_s; QK_s(j + 1);
          commit S_s full
  end     release Q; the item's last PV pair is issued with the next item's start (or after the loop)
"S_{1-s} drained" is a named barrier with the other stage's softmax warps (they have read that S from TMEM):
the one wait the TMEM scale slots add. "P_s ready" is an mbarrier the softmax (P and its scale bytes
stored) and the correction warps (O_s rescaled, or read out by the previous item's epilogue) arrive on.
Never run on hardware: compiled and checked statically (tools/check_sm100_attention_fwd.py).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled
from cutlass import Boolean, Int32
from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

from jax_mxfp8.kernels.sm100 import tmem_rows
from jax_mxfp8.kernels.sm100.attention_fwd_config import Q_STAGES, TILE_M, TILE_N
from jax_mxfp8.kernels.sm100.attention_tmem import SF_COLS
from jax_mxfp8.kernels.sm100.blockscaled_mma import SF_DTYPE, SF_VEC, copy_scales, make_scale_copy

FP8 = cutlass.Float8E4M3FN
S_DRAINED_BARRIER = (2, 3)
"""Named barrier ids "S_s drained" (s = 0, 1): the MMA warp and softmax warpgroup s (barrier 1 is the TMEM
allocation's)."""
S_DRAINED_THREADS = 32 * 5


class ForwardMmas:
    """The tiled MMAs and layouts of one head_dim (built inside @cute.jit: layouts are IR values).

    qk, pv: tiled MMAs (new_qk(), new_pv(): fresh ones for each issue: setting a tiled MMA's ACCUMULATE
    field rebinds it, which must not cross the kernel's loops and branches); pv_sfb: the P V MMA with N
    rounded up to 128, whose B-scale layout the V scales are loaded with (a whole 128-row chunk even at
    head_dim 64); q_smem (2 Q tiles), k_smem, v_smem (the ring; K and V share its bytes), p_tmem (P's
    layout in TMEM: its `outer`), sfq_smem, sfk_smem, sfv_smem (staged scale chunks), sfp_smem (2 chunks
    of P scale bytes), o_smem (2 bf16 O tiles, 128B swizzle)."""

    def __init__(self, head_dim: int, kv_stages: int):
        one, kmaj, mnmaj = tcgen05.CtaGroup.ONE, OperandMajorMode.K, OperandMajorMode.MN
        self.cta_group = one
        self.head_dim = head_dim
        self.qk_tiler = (TILE_M, TILE_N, head_dim)
        self.pv_tiler = (TILE_M, head_dim, TILE_N)
        make = sm100_utils.make_blockscaled_trivial_tiled_mma
        self.new_qk = lambda: make(FP8, FP8, kmaj, kmaj, SF_DTYPE, SF_VEC, one, (TILE_M, TILE_N))
        self.new_pv = lambda: make(
            FP8, FP8, kmaj, mnmaj, SF_DTYPE, SF_VEC, one, (TILE_M, head_dim), tcgen05.OperandSource.TMEM
        )
        self.qk, self.pv = self.new_qk(), self.new_pv()
        self.pv_sfb = make(FP8, FP8, kmaj, mnmaj, SF_DTYPE, SF_VEC, one, (TILE_M, 128), tcgen05.OperandSource.TMEM)
        self.pv_sfb_tiler = (TILE_M, 128, TILE_N)
        self.qk_sf_tiler = (TILE_M, TILE_N, 128)
        """The Q / K scale chunks' TMA tile: a whole chunk (4 K blocks) even at head_dim 64, whose MMAs use the
        first two (the shared-memory scale layout of a K-64 tile is a whole chunk too)."""
        self.q_smem = sm100_utils.make_smem_layout_a(self.qk, self.qk_tiler, FP8, Q_STAGES)
        self.k_smem = sm100_utils.make_smem_layout_b(self.qk, self.qk_tiler, FP8, kv_stages)
        self.v_smem = sm100_utils.make_smem_layout_b(self.pv, self.pv_tiler, FP8, kv_stages)
        self.p_tmem = sm100_utils.make_smem_layout_a(self.pv, self.pv_tiler, FP8, 1)
        self.sfq_smem = blockscaled.make_smem_layout_sfa(self.qk, self.qk_tiler, SF_VEC, Q_STAGES)
        self.sfk_smem = blockscaled.make_smem_layout_sfb(self.qk, self.qk_tiler, SF_VEC, kv_stages)
        self.sfp_smem = blockscaled.make_smem_layout_sfa(self.pv, self.pv_tiler, SF_VEC, Q_STAGES)
        self.sfv_smem = blockscaled.make_smem_layout_sfb(self.pv_sfb, self.pv_sfb_tiler, SF_VEC, kv_stages)
        self.o_smem = sm100_utils.make_smem_layout_epi(
            cutlass.BFloat16, cutlass.utils.LayoutEnum.ROW_MAJOR, (TILE_M, head_dim), Q_STAGES
        )

    @staticmethod
    def stage(layout):
        """One stage of a staged (…, STAGE) layout."""
        return cute.slice_(layout, (None, None, None, 0))

    def sf_tmem(self, tmem_ptr, col: int):
        """(QK or PV) scale TMEM tensors of the slot at `col`: (SFA at col, SFB at col + SF_COLS) for the
        QK MMA and for the PV MMA (the same columns; a slot serves one of them at a time)."""
        lay = (
            blockscaled.make_tmem_layout_sfa(self.qk, self.qk_tiler, SF_VEC, self.stage(self.sfq_smem)),
            blockscaled.make_tmem_layout_sfb(self.qk, self.qk_tiler, SF_VEC, self.stage(self.sfk_smem)),
            blockscaled.make_tmem_layout_sfa(self.pv, self.pv_tiler, SF_VEC, self.stage(self.sfp_smem)),
            blockscaled.make_tmem_layout_sfb(self.pv, self.pv_tiler, SF_VEC, self.stage(self.sfv_smem)),
        )
        ptrs = [cute.recast_ptr(tmem_ptr + col + (i % 2) * SF_COLS, dtype=SF_DTYPE) for i in range(4)]
        return tuple(cute.make_tensor(p, layout) for p, layout in zip(ptrs, lay))


@cute.jit
def blockscaled_gemm(tiled_mma, acc, a, b, sfa, sfb, accumulate) -> None:
    """acc (+)= a b^T over the MMA's K: one block-scaled MMA per 32 K (a, b: (MMA, MMA_MN, MMA_K) fragments;
    sfa, sfb: their scale TMEM tensors). accumulate: a Boolean (False: the first MMA overwrites acc)."""
    for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
        tiled_mma.set(tcgen05.Field.ACCUMULATE, accumulate if kb == 0 else True)
        k = (None, None, kb)
        cute.gemm(tiled_mma, acc, [a[k], sfa[k]], [b[k], sfb[k]], acc)


def ring_state(stages: int, pos: Int32) -> pipeline.PipelineState:
    """Pipeline state of absolute ring position pos (index pos % stages, phase of its lap)."""
    return pipeline.PipelineState(stages, pos, pos % stages, (pos // stages) % 2)


def s_drained_wait(s: int) -> None:
    """The MMA warp waits until softmax warpgroup s has read S_s from TMEM."""
    cute.arch.barrier(barrier_id=S_DRAINED_BARRIER[s], number_of_threads=S_DRAINED_THREADS)
    tmem_rows.fence_after_sync()


class MmaRole:
    """The MMA warp (warp 12). Mixin of AttentionForwardSm100: uses self.cfg, self.sched."""

    @cute.jit
    def mma_role(self, mm: ForwardMmas, tmem_ptr, smem: dict, pipes: dict, bars: dict, total_items, dims, tables):
        cfg = self.cfg
        cols = cfg.tmem_columns
        stages = cfg.kv_stages
        acc_s = mm.qk.make_fragment_C(mm.qk.partition_shape_C((TILE_M, TILE_N))).layout
        acc_o = mm.pv.make_fragment_C(mm.pv.partition_shape_C((TILE_M, cfg.head_dim))).layout
        t_s = [cute.make_tensor(tmem_ptr + cols[f"S_{s}"], acc_s) for s in range(Q_STAGES)]
        t_o = [cute.make_tensor(tmem_ptr + cols[f"O_{s}"], acc_o) for s in range(Q_STAGES)]
        t_p = []
        for s in cutlass.range_constexpr(Q_STAGES):
            p_ptr = cute.recast_ptr(tmem_ptr + cols[f"P_{s}"], dtype=FP8)
            t_p.append(mm.pv.make_fragment_A(cute.make_tensor(p_ptr, mm.p_tmem.outer))[None, None, None, 0])
        t_q = mm.qk.make_fragment_A(smem["q"])
        t_k = mm.qk.make_fragment_B(smem["k"])
        t_v = mm.pv.make_fragment_B(smem["v"])
        sf_qk = [mm.sf_tmem(tmem_ptr, cols[f"SF_QK_{s}"]) for s in range(Q_STAGES)]
        sf_pv = [mm.sf_tmem(tmem_ptr, cols[f"SF_PV_{s}"]) for s in range(Q_STAGES)]
        cp_q = [make_scale_copy(mm, smem["sfq"], sf_qk[s][0]) for s in range(Q_STAGES)]
        cp_k = [make_scale_copy(mm, smem["sfk"], sf_qk[s][1]) for s in range(Q_STAGES)]
        cp_p = [make_scale_copy(mm, smem["sfp"], sf_pv[s][2]) for s in range(Q_STAGES)]
        cp_v = [make_scale_copy(mm, smem["sfv"], sf_pv[s][3]) for s in range(Q_STAGES)]
        q_pipe, kv_pipe = pipes["q"], pipes["kv"]

        first, step, total = cute.arch.block_idx()[0], cute.arch.grid_dim()[0], total_items
        pos = Int32(0)  # ring position of the next K
        tiles = Int32(0)  # PV pairs issued (the P-ready phase)
        q_items = Int32(0)
        pending = Boolean(False)  # the last PV pair of the previous item is not issued yet
        pend_v = Int32(0)
        pend_acc = Boolean(False)
        first_qk = Boolean(True)
        for idx in cutlass.range(first, total, step, unroll=1):
            it = self.sched.item(idx, dims, tables)
            if it.live and it.n_kv > 0:
                kv_pipe.consumer_wait(ring_state(stages, pos))
                for s in cutlass.range_constexpr(Q_STAGES):
                    if pending:
                        if cutlass.const_expr(s == 0):  # the previous item's last V
                            kv_pipe.consumer_wait(ring_state(stages, pend_v))
                        self._pv(s, pend_v, pend_acc, tiles, mm, t_o, t_p, t_v, sf_pv, cp_p, cp_v, bars, kv_pipe)
                        tmem_rows.Mbarrier(bars["o_full"], s).commit()
                    q_state = pipeline.PipelineState(Q_STAGES, q_items, Int32(s), q_items % 2)
                    q_pipe.consumer_wait(q_state)
                    if cutlass.const_expr(s == 0):
                        if not first_qk:
                            s_drained_wait(1)
                    else:
                        s_drained_wait(0)
                    self._qk(s, s, pos, mm, t_s, t_q, t_k, sf_qk, cp_q, cp_k, bars)
                if pending:
                    tiles += 1
                kv_pipe.consumer_release(ring_state(stages, pos))
                first_qk = Boolean(False)
                for j in cutlass.range(it.n_kv - 1, unroll=1):
                    v_pos = pos + 2 * j + 1
                    k_pos = v_pos + 1
                    kv_pipe.consumer_wait(ring_state(stages, v_pos))
                    for s in cutlass.range_constexpr(Q_STAGES):
                        self._pv(s, v_pos, j > 0, tiles, mm, t_o, t_p, t_v, sf_pv, cp_p, cp_v, bars, kv_pipe)
                        if cutlass.const_expr(s == 0):
                            kv_pipe.consumer_wait(ring_state(stages, k_pos))
                        s_drained_wait(1 - s)
                        self._qk(s, s, k_pos, mm, t_s, t_q, t_k, sf_qk, cp_q, cp_k, bars)
                    kv_pipe.consumer_release(ring_state(stages, k_pos))
                    tiles += 1
                for s in cutlass.range_constexpr(Q_STAGES):
                    q_pipe.consumer_release(pipeline.PipelineState(Q_STAGES, q_items, Int32(s), q_items % 2))
                pending = Boolean(True)
                pend_v = pos + 2 * it.n_kv - 1
                pend_acc = it.n_kv > 1
                pos += 2 * it.n_kv
                q_items += 1
        if pending:
            kv_pipe.consumer_wait(ring_state(stages, pend_v))
            for s in cutlass.range_constexpr(Q_STAGES):
                self._pv(s, pend_v, pend_acc, tiles, mm, t_o, t_p, t_v, sf_pv, cp_p, cp_v, bars, kv_pipe)
                tmem_rows.Mbarrier(bars["o_full"], s).commit()
            # the softmax warps of stage 1 arrive "S_1 drained" once per tile; every QK_0 but the CTA's first
            # consumed one: consume the last
            s_drained_wait(1)

    @cute.jit
    def _qk(self, s: int, q_stage: int, k_pos, mm, t_s, t_q, t_k, sf_qk, cp_q, cp_k, bars):
        """cp SF_QK_s (Q_s's and K's chunks), S_s = Q_s K^T, commit S_s full."""
        k_idx = k_pos % self.cfg.kv_stages
        copy_scales(cp_q[s], q_stage)
        copy_scales(cp_k[s], k_idx)
        a = t_q[None, None, None, q_stage]
        b = t_k[None, None, None, k_idx]
        blockscaled_gemm(mm.new_qk(), t_s[s], a, b, sf_qk[s][0], sf_qk[s][1], Boolean(False))
        tmem_rows.Mbarrier(bars["s_full"], s).commit()

    @cute.jit
    def _pv(self, s: int, v_pos, accumulate, tiles, mm, t_o, t_p, t_v, sf_pv, cp_p, cp_v, bars, kv_pipe):
        """[wait P_s ready] cp SF_PV_s (P's bytes, V's chunk), O_s (+)= P_s V; after s = 1 release V."""
        tmem_rows.Mbarrier(bars["p_ready"], s).wait(tiles % 2)
        tmem_rows.fence_after_sync()
        v_idx = v_pos % self.cfg.kv_stages
        copy_scales(cp_p[s], s)
        copy_scales(cp_v[s], v_idx)
        b = t_v[None, None, None, v_idx]
        blockscaled_gemm(mm.new_pv(), t_o[s], t_p[s], b, sf_pv[s][2], sf_pv[s][3], accumulate)
        if cutlass.const_expr(s == Q_STAGES - 1):
            kv_pipe.consumer_release(ring_state(self.cfg.kv_stages, v_pos))
