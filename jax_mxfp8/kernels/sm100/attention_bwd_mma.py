"""The MMA warp of the Blackwell attention backward (kernels/sm100/attention_bwd.py, warp 12): the scale
copies and the five block-scaled GEMMs of kernels/sm100/attention_bwd_gemms.py, in the order of the design
(docs/perf/blackwell-attention.md "Backward", the MMA warp schedule) that the declared TMEM map is proven for
(kernels/sm100/attention_tmem.backward_map):

  prologue                           cp SF_S;  S^T(0) = K Q(0)^T                       commit s_full
  step i (query head g, tile m):
  [dO(i), S^T(i) drained, dQ(i-1) drained]   cp SF_dP; dP^T(i) = V dO(i)^T              commit dp_full
  [P^T(i) full]                      cp SF_dV; dV += P^T(i) dO(i)   (P^T from TMEM)     commit do_empty
  [Q(i+1), dP^T(i) drained]          cp SF_S;  S^T(i+1) = K Q(i+1)^T                    commit s_full
  [dS(i) full]                       cp SF_dK; dK += dS^T(i) Q(i)   (dS^T from TMEM)    commit q_empty
  [S^T(i+1) drained]                 cp SF_dQ; dQ(i) = dS(i) K      (dS from smem)      commit dq_full
  after the last step                                                                   commit dkv_full

Each wait frees the TMEM columns (or shared-memory chunks) the next copy or MMA writes; the pairs the map
lists as resting on in-order MMA execution (P^T(i) against S^T(i+1), dS^T(i) against dQ(i) at H128) have no
wait, like FlashAttention-4's. One thread issues (the DSL elects it for tcgen05.mma and tcgen05.cp; commits are
elected explicitly); the stage's scale chunks are copied right before the GEMM that reads them.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import tcgen05

from jax_mxfp8.kernels.sm100.attention_bwd_config import sf_slot
from jax_mxfp8.kernels.sm100.attention_bwd_gemms import GEMMS, BwdGemms, scaled_gemm
from jax_mxfp8.kernels.sm100.attention_geometry import SCALE_CHUNK
from jax_mxfp8.kernels.sm100.blockscaled_mma import copy_scales

ACC_REGION = {"S": "S^T", "dP": "dP^T", "dV": "dV", "dK": "dK", "dQ": "dQ"}
STAGED_B = ("S", "dP", "dV", "dK")
"""GEMMs whose B operand (Q or dO) and SFB chunk live in the ring: indexed by the step's stage."""


class MmaRole:
    """The MMA warp's method of AttentionBwdSm100."""

    @cute.jit
    def mma(self, ctx, tmem):
        cfg, w, bars = self.config, ctx.work, ctx.bars
        st = cfg.stages
        g = BwdGemms(cfg.head_dim, st)
        ops, accs, copies = self._operands(ctx, g, tmem)
        if w.steps > 0:
            cute.arch.mbarrier_wait(bars.ptr("kv_full"), 0)
            cute.arch.mbarrier_wait(bars.ptr("q_full", 0), 0)
            self._gemm(g, ops, accs, copies, "S", 0, False)
            self._commit(bars.ptr("s_full"))
        for i in cutlass.range(w.steps, unroll=1):  # the MMA warp needs the step count only
            s, ph, p1 = i % st, (i // st) % 2, i % 2
            nxt = i + 1 < w.steps
            # dP^T(i): its columns held dQ(i - 1) (H128), its scales go into S^T(i)'s drained columns
            cute.arch.mbarrier_wait(bars.ptr("do_full", s), ph)
            cute.arch.mbarrier_wait(bars.ptr("s_drained"), p1)
            if i > 0:
                cute.arch.mbarrier_wait(bars.ptr("dq_drained"), p1 ^ 1)
            self._gemm(g, ops, accs, copies, "dP", s, False)
            self._commit(bars.ptr("dp_full"))
            # dV += P^T(i) dO(i)
            cute.arch.mbarrier_wait(bars.ptr("p_full"), p1)
            self._gemm(g, ops, accs, copies, "dV", s, i > 0)
            self._commit(bars.ptr("do_empty", s))
            # S^T(i + 1): its scales go into dP^T(i)'s drained columns
            if nxt:
                s1 = (i + 1) % st
                cute.arch.mbarrier_wait(bars.ptr("q_full", s1), ((i + 1) // st) % 2)
                cute.arch.mbarrier_wait(bars.ptr("dp_drained"), p1)
                self._gemm(g, ops, accs, copies, "S", s1, False)
                self._commit(bars.ptr("s_full"))
            # dK += dS^T(i) Q(i)
            cute.arch.mbarrier_wait(bars.ptr("ds_full"), p1)
            self._gemm(g, ops, accs, copies, "dK", s, i > 0)
            self._commit(bars.ptr("q_empty", s))
            # dQ(i) = dS(i) K: its scales go into S^T(i + 1)'s drained columns
            if nxt:
                cute.arch.mbarrier_wait(bars.ptr("s_drained"), p1 ^ 1)
            self._gemm(g, ops, accs, copies, "dQ", 0, False)
            self._commit(bars.ptr("dq_full"))
        if w.steps > 0:
            self._commit(bars.ptr("dkv_full"))

    def _commit(self, mbar) -> None:
        with cute.arch.elect_one():
            tcgen05.commit(mbar)

    def _gemm(self, g, ops, accs, copies, gemm: str, stage, accumulate) -> None:
        """Copies `gemm`'s SFA and SFB chunks (ring stage `stage` where they are staged) and issues it."""
        sfa_copy, sfb_copy, sfa, sfb = copies[gemm]
        copy_scales(sfa_copy, 0)
        copy_scales(sfb_copy, stage if gemm in STAGED_B else 0)
        a, b = ops[gemm]
        if cutlass.const_expr(gemm in STAGED_B):
            b = b[(None, None, None, stage)]
        scaled_gemm(g.mma[gemm], accs[gemm], a, b, sfa, sfb, accumulate)

    def _operands(self, ctx, g: BwdGemms, tmem):
        """(A, B fragments per GEMM; accumulators; (SFA copy, SFB copy, SFA, SFB TMEM tensors) per GEMM)."""
        cfg, c, st = self.config, self.cols, self.config.stages
        S = ctx.storage
        sK = S.sK.get_tensor(g.k_smem.outer, swizzle=g.k_smem.inner)
        sV = S.sV.get_tensor(g.k_smem.outer, swizzle=g.k_smem.inner)
        sQ = S.sQ.get_tensor(g.q_smem.outer, swizzle=g.q_smem.inner)
        sdO = S.sdO.get_tensor(g.q_smem.outer, swizzle=g.q_smem.inner)
        sQt = cute.make_tensor(cute.recast_ptr(sQ.iterator, g.qt_smem.inner), g.qt_smem.outer)
        sdOt = cute.make_tensor(cute.recast_ptr(sdO.iterator, g.qt_smem.inner), g.qt_smem.outer)
        sKt = cute.make_tensor(cute.recast_ptr(sK.iterator, g.kt_smem.inner), g.kt_smem.outer)
        sdS = S.sdS.get_tensor(g.ds_smem.outer, swizzle=g.ds_smem.inner)
        ops = {
            "S": (g.mma["S"].make_fragment_A(sK), g.mma["S"].make_fragment_B(sQ)),
            "dP": (g.mma["dP"].make_fragment_A(sV), g.mma["dP"].make_fragment_B(sdO)),
            "dV": (g.tmem_operand("dV", tmem, c["P^T"]), g.mma["dV"].make_fragment_B(sdOt)),
            "dK": (g.tmem_operand("dK", tmem, c["dS^T"]), g.mma["dK"].make_fragment_B(sQt)),
            "dQ": (g.mma["dQ"].make_fragment_A(sdS), g.mma["dQ"].make_fragment_B(sKt)),
        }
        accs = {gemm: g.acc(gemm, tmem, c[ACC_REGION[gemm]]) for gemm in GEMMS}
        kv, q, do, comp = (S.sSF_kv.data_ptr(), S.sSF_q.data_ptr(), S.sSF_do.data_ptr(), S.sSF_c.data_ptr())
        chunk = SCALE_CHUNK
        sources = {  # (SFA chunks, count), (SFB chunks, count): attention_bwd_gemms' table
            "S": ((kv, 1), (q, st)),
            "dP": ((kv + 2 * chunk, 1), (do, st)),
            "dV": ((comp, 1), (do + st * chunk, st)),
            "dK": ((comp + chunk, 1), (q + st * chunk, st)),
            "dQ": ((comp + 2 * chunk, 1), (kv + chunk, 1)),
        }
        copies = {}
        for gemm in GEMMS:
            sfa, sfb = g.scale_tmem(gemm, tmem, *sf_slot(cfg.head_dim, gemm))
            (pa, na), (pb, nb) = sources[gemm]
            copies[gemm] = (g.scale_copy(gemm, "a", pa, na, sfa), g.scale_copy(gemm, "b", pb, nb, sfb), sfa, sfb)
        return ops, accs, copies
