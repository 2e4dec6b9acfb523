"""The five block-scaled GEMMs of the Blackwell attention backward (kernels/sm100/attention_bwd.py): their tiled
MMAs, shared-memory and tensor-memory layouts, scale-factor layouts and copies, and the issue of one GEMM.
Traced inside @cute.jit / @cute.kernel (sm_100f, CuTe DSL 4.8.1).

One CTA holds a 128-key tile in the TMEM lanes and walks 128-query steps. With M = keys or queries (128, the
1-CTA block-scaled MMA's M), every GEMM is `tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale` (SASS
UTCQMMA) with E4M3 operands and E8M0 scales in TMEM, 32 K per instruction:

  GEMM   D (TMEM)          A                          B                          K (contracted)
  S^T    keys x queries    K   smem, K-major          Q   smem, K-major          head_dim
  dP^T   keys x queries    V   smem, K-major          dO  smem, K-major          head_dim
  dV    keys x head_dim    P^T TMEM (E4M3)            dO  smem, MN-major         queries
  dK    keys x head_dim    dS^T TMEM (E4M3)           Q   smem, MN-major         queries
  dQ    queries x head_dim dS  smem, MN-major         K   smem, MN-major         keys

Q and dO are loaded once per step (K-major by TMA) and read by two GEMMs each: the MN-major view of the same
bytes is the same function of (row, column) (both 128B- or 64B-swizzled rows of head_dim bytes), so no second
copy or transpose exists; likewise K for S^T and dQ. Scale factors: SFA indexed by the A rows, SFB by the B
rows, each a 128 x 4 blocked chunk (formats/blocked_scales.py) of 512 bytes in shared memory, copied to its
TMEM slot by tcgen05.cp 32x128b.warpx4 (UTCCP) before the GEMM; which chunk each GEMM reads:

  S^T   SFA K "hd" (keys x head_dim blocks)      SFB Q "hd" (queries x head_dim blocks)
  dP^T  SFA V "hd"                               SFB dO "hd"
  dV    SFA P^T's bytes (keys x query blocks)    SFB dO "seq" (head_dim x query blocks)
  dK    SFA dS^T's bytes (keys x query blocks)   SFB Q "seq"
  dQ    SFA dS's bytes (queries x key blocks)    SFB K "seq" (head_dim x key blocks)

The TMEM columns come from the declared map (kernels/sm100/attention_bwd_config.tmem_columns).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled
from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

from jax_mxfp8.kernels.sm100.attention_geometry import TILE
from jax_mxfp8.kernels.sm100.blockscaled_mma import SF_DTYPE, SF_VEC, make_scale_copy

E4M3 = cutlass.Float8E4M3FN
GEMMS = ("S", "dP", "dV", "dK", "dQ")


def _mma(a_major, b_major, mn, a_source=tcgen05.OperandSource.SMEM):
    return sm100_utils.make_blockscaled_trivial_tiled_mma(
        E4M3, E4M3, a_major, b_major, SF_DTYPE, SF_VEC, tcgen05.CtaGroup.ONE, mn, a_source
    )


def _stage0(layout):
    return cute.slice_(layout, (None, None, None, 0))


class BwdGemms:
    """Tiled MMAs and layouts of the five GEMMs for one head_dim and ring depth (built while tracing).

    Attributes: mma[g] / tiler[g] per GEMM g in GEMMS (S^T and dP^T share one tiled MMA, dV and dK another);
    k_smem (K or V tile, one stage, K-major A), q_smem (Q or dO ring, K-major B), qt_smem (the same ring
    viewed MN-major as dV's / dK's B), kt_smem (K viewed MN-major as dQ's B), ds_smem (dS, MN-major A of dQ),
    tmem_a (P^T / dS^T in TMEM, K-major A); sfa[g], sfb[g]: one chunk's shared-memory scale layout (a
    stage mode of 1)."""

    def __init__(self, head_dim: int, stages: int):
        k, mn = OperandMajorMode.K, OperandMajorMode.MN
        h = head_dim
        mma_s = _mma(k, k, (TILE, TILE))
        mma_kv = _mma(k, mn, (TILE, h), tcgen05.OperandSource.TMEM)
        mma_dq = _mma(mn, mn, (TILE, h))
        tiler_s, tiler_kv, tiler_dq = (TILE, TILE, h), (TILE, h, TILE), (TILE, h, TILE)
        self.mma = {"S": mma_s, "dP": mma_s, "dV": mma_kv, "dK": mma_kv, "dQ": mma_dq}
        self.tiler = {"S": tiler_s, "dP": tiler_s, "dV": tiler_kv, "dK": tiler_kv, "dQ": tiler_dq}
        self.k_smem = _stage0(sm100_utils.make_smem_layout_a(mma_s, tiler_s, E4M3, 1))
        self.q_smem = sm100_utils.make_smem_layout_b(mma_s, tiler_s, E4M3, stages)
        self.qt_smem = sm100_utils.make_smem_layout_b(mma_kv, tiler_kv, E4M3, stages)
        self.kt_smem = _stage0(sm100_utils.make_smem_layout_b(mma_dq, tiler_dq, E4M3, 1))
        self.ds_smem = _stage0(sm100_utils.make_smem_layout_a(mma_dq, tiler_dq, E4M3, 1))
        self.tmem_a = _stage0(sm100_utils.make_smem_layout_a(mma_kv, tiler_kv, E4M3, 1))
        self.stages = stages
        self.cta_group = tcgen05.CtaGroup.ONE
        self.sfa = {g: self.sf_layout(g, "a", 1) for g in GEMMS}
        self.sfb = {g: self.sf_layout(g, "b", 1) for g in GEMMS}

    def sf_layout(self, gemm: str, side: str, stages: int):
        """The shared-memory layout of `stages` consecutive 512-byte chunks of `gemm`'s SFA ("a") or SFB ("b")
        (mode 4: the chunk)."""
        make = blockscaled.make_smem_layout_sfa if side == "a" else blockscaled.make_smem_layout_sfb
        return make(self.mma[gemm], self.tiler[gemm], SF_VEC, stages)

    def check_views(self, head_dim: int) -> None:
        """At trace time: the K-major and MN-major views of Q / dO (and of K) are the same function of (row,
        column) -- one swizzle and equal offsets -- so one TMA load serves both GEMMs; and the dS tile is the
        layout the compute warps write (key row r at r 128, 16-byte chunks XOR-swizzled by r % 8: S<3,4,3>).
        Raises ValueError otherwise (a DSL whose layouts differ would need a second copy)."""
        cols = sorted({0, 1, 15, 16, 31, 32, 33, head_dim // 2, head_dim - 1})
        rows = range(TILE)
        pairs = (
            (_stage0(self.q_smem), _stage0(self.qt_smem), "Q / dO"),
            (self.k_smem, self.kt_smem, "K"),
        )
        for kmaj, mnmaj, name in pairs:
            if str(kmaj.inner) != str(mnmaj.inner):
                raise ValueError(f"{name}: K-major swizzle {kmaj.inner} != MN-major {mnmaj.inner}")
            for r in rows:
                for c in cols:
                    a = cute.crd2idx(((r, c % 32), 0, c // 32), kmaj.outer)
                    b = cute.crd2idx(((c, r % 32), 0, r // 32), mnmaj.outer)
                    if a != b:
                        raise ValueError(f"{name}: element ({r}, {c}) at {a} K-major but {b} MN-major")
        if str(self.ds_smem.inner) != "S<3,4,3>":
            raise ValueError(f"dS tile swizzle {self.ds_smem.inner}: the compute warps write S<3,4,3>")
        for r in rows:
            for q in (0, 1, 17, 63, 64, 127):
                if cute.crd2idx(((q, r % 32), 0, r // 32), self.ds_smem.outer) != r * TILE + q:
                    raise ValueError(f"dS tile: (query {q}, key {r}) not at {r * TILE + q}")

    def acc(self, gemm: str, tmem_f32, col: int):
        """The float32 accumulator of `gemm` at TMEM column `col` of the allocation (tmem_f32: its base)."""
        mma = self.mma[gemm]
        shape = mma.get_slice(0).partition_shape_C(self.tiler[gemm][:2])
        return cute.make_tensor(tmem_f32 + col, mma.make_fragment_C(shape).layout)

    def tmem_operand(self, gemm: str, tmem_f32, col: int):
        """dV's / dK's A operand fragment: P^T or dS^T (E4M3, 128 keys x 128 queries = 32 columns) at `col`."""
        t = cute.make_tensor(cute.recast_ptr(tmem_f32 + col, dtype=E4M3), self.tmem_a.outer)
        return self.mma[gemm].make_fragment_A(t)

    def scale_tmem(self, gemm: str, tmem_f32, sfa_col: int, sfb_col: int):
        """(SFA, SFB) TMEM tensors of `gemm` at its slot's columns."""
        mma, tiler = self.mma[gemm], self.tiler[gemm]
        la = blockscaled.make_tmem_layout_sfa(mma, tiler, SF_VEC, _stage0(self.sfa[gemm]))
        lb = blockscaled.make_tmem_layout_sfb(mma, tiler, SF_VEC, _stage0(self.sfb[gemm]))
        sfa = cute.make_tensor(cute.recast_ptr(tmem_f32 + sfa_col, dtype=SF_DTYPE), la)
        sfb = cute.make_tensor(cute.recast_ptr(tmem_f32 + sfb_col, dtype=SF_DTYPE), lb)
        return sfa, sfb

    def scale_copy(self, gemm: str, side: str, smem_ptr, stages: int, tmem_sf):
        """(tiled copy, source, destination) of tcgen05.cp.cta_group::1.32x128b.warpx4 (UTCCP) from `stages`
        consecutive 512-byte chunks of `gemm`'s SFA / SFB at smem_ptr (shared memory) to the slot tmem_sf;
        copy_scales issues one chunk (the MMA warp)."""
        layout = self.sf_layout(gemm, side, stages)
        smem = cute.make_tensor(cute.recast_ptr(smem_ptr, dtype=SF_DTYPE), layout)
        return make_scale_copy(self, smem, tmem_sf)


@cute.jit
def scaled_gemm(tiled_mma, acc, a, b, sfa, sfb, accumulate) -> None:
    """acc (+)= A B^T over the whole K of the fragments: one block-scaled MMA per 32 K, each reading its K
    block's scale bytes (accumulate: run-time Boolean; False makes the first MMA overwrite acc).
    a, b: the fragments of one stage (modes (MMA, MMA_M|N, MMA_K)). A fresh MMA atom per call carries the
    accumulate flag, so no state of a shared tiled MMA escapes the run-time branch or loop it is set in; the K
    loop is a run-time loop (the MMA warp then holds one K block's descriptors at a time, not all of them)."""
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(tcgen05.Field.ACCUMULATE, accumulate)
    for kb in cutlass.range(cute.size(a, mode=[2]), unroll=1):
        k = (None, None, kb)
        cute.gemm(atom, acc, [a[k], sfa[k]], [b[k], sfb[k]], acc)
        atom.set(tcgen05.Field.ACCUMULATE, True)
