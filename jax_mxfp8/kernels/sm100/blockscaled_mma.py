"""Block-scaled tcgen05 MMA building blocks for Blackwell kernels (sm_100f, CuTe DSL), traced inside @cute.jit.

Everything a kernel needs to multiply E4M3 tiles with E8M0 scales applied by the tensor core
(`tcgen05.mma.cta_group::{1,2}.kind::mxf8f6f4.block_scale`, SASS `UTCQMMA`):

  MmaSetup(a_dtype, b_dtype, cta_group, tile_n, k_tile, stages)   host side: the tiled MMAs
      (utils.blackwell_helpers.make_blockscaled_trivial_tiled_mma -> tcgen05.MmaMXF8F6F4Op), the staged
      shared-memory layouts of A, B (128B-swizzled, K-major) and of their scales (utils.blockscaled_layout:
      one 128x4 blocked tile per 128 rows and 128 K), the cluster layouts, TMA atoms for all four
  blocked_scale_layout(rows, k, g)          the global layout of scales in the 128x4 blocked order
                                            (formats/blocked_scales.py), as the TMA loads it
  scale_tmem_tensors(setup, tmem_base, sfa_col, sfb_col)   the TMEM tensors the MMAs read the scales from,
                                            at the columns of the kernel's TMEM map
  make_scale_copy, copy_scales             tcgen05.cp 4x32dp128bit (tcgen05.Cp4x32x128bOp, SASS UTCCP): one
                                            stage's scales from shared memory to TMEM
  mma_k_tile(setup, acc, tCrA, tCrB, tCtSFA, tCtSFB, stage, accumulate)   one K tile: 4 MMAs of K 32

The MMA warp issues the scale copies and then the MMAs of the same stage; tcgen05.cp and tcgen05.mma
issued by one thread execute in order, so one TMEM copy of the scales serves each K tile (the next copy
cannot overtake the MMAs still reading the previous one). Never run on a Blackwell GPU: compiled and
checked statically (tools/check_sm100.py).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled
from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

SF_VEC = 32
"""Elements per scale (MX)."""
SF_DTYPE = cutlass.Float8E8M0FNU
SCALE_TILE_ROWS = 128
SCALE_TILE_BYTES = 512


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class MmaSetup:
    """Host-side (trace-time) pieces of a block-scaled GEMM mainloop; build it inside the @cute.jit host
    function (its layouts are MLIR values).

    Attributes: cta_group (tcgen05.CtaGroup), tiled_mma, tiled_mma_sfb (1-CTA view over the full tile_n
    rounded up to 128, used to load and place B's scales), mma_tiler (tile_m, tile_n, k_tile),
    mma_tiler_sfb, a_smem, b_smem (ComposedLayout, staged), sfa_smem, sfb_smem (Layout, staged),
    cluster_vmnk, cluster_sfb_vmnk (the cluster (cta_group, 1, 1) divided by the MMA's CTA count)."""

    def __init__(self, a_dtype, b_dtype, cta_group: int, tile_n: int, k_tile: int, stages: int):
        self.ncta = cta_group
        self.cta_group = tcgen05.CtaGroup.TWO if cta_group == 2 else tcgen05.CtaGroup.ONE
        tile_m = 128 * cta_group
        kmaj = OperandMajorMode.K
        self.tiled_mma = sm100_utils.make_blockscaled_trivial_tiled_mma(
            a_dtype, b_dtype, kmaj, kmaj, SF_DTYPE, SF_VEC, self.cta_group, (tile_m, tile_n)
        )
        sfb_mn = (tile_m // cta_group, _round_up(tile_n, SCALE_TILE_ROWS))
        self.tiled_mma_sfb = sm100_utils.make_blockscaled_trivial_tiled_mma(
            a_dtype, b_dtype, kmaj, kmaj, SF_DTYPE, SF_VEC, tcgen05.CtaGroup.ONE, sfb_mn
        )
        self.mma_tiler = (tile_m, tile_n, k_tile)
        self.mma_tiler_sfb = (*sfb_mn, k_tile)
        self.k_blocks = k_tile // cute.size(self.tiled_mma.shape_mnk, mode=[2])
        self.a_smem = sm100_utils.make_smem_layout_a(self.tiled_mma, self.mma_tiler, a_dtype, stages)
        self.b_smem = sm100_utils.make_smem_layout_b(self.tiled_mma, self.mma_tiler, b_dtype, stages)
        self.sfa_smem = blockscaled.make_smem_layout_sfa(self.tiled_mma, self.mma_tiler, SF_VEC, stages)
        self.sfb_smem = blockscaled.make_smem_layout_sfb(self.tiled_mma, self.mma_tiler, SF_VEC, stages)
        cluster = cute.make_layout((cta_group, 1, 1))
        self.cluster_vmnk = cute.tiled_divide(cluster, (self.tiled_mma.thr_id.shape,))
        self.cluster_sfb_vmnk = cute.tiled_divide(cluster, (self.tiled_mma_sfb.thr_id.shape,))

    def stage(self, layout):
        """One stage of a staged shared-memory layout."""
        return cute.slice_(layout, (None, None, None, 0))

    def tma_atoms(self, mA, mB, mSFA, mSFB):
        """TMA atoms and TMA tensors for A, B and their scales (2-CTA: the 2SM forms; each CTA loads its
        128 rows of A and SFA and half of B; SFB goes to both CTAs of the pair)."""
        mma, vmnk = self.tiled_mma, self.cluster_vmnk.shape
        cluster_mn = (self.ncta, 1)
        a_op = sm100_utils.cluster_shape_to_tma_atom_A(cluster_mn, mma.thr_id)
        b_op = sm100_utils.cluster_shape_to_tma_atom_B(cluster_mn, mma.thr_id)
        sfb_op = sm100_utils.cluster_shape_to_tma_atom_SFB(cluster_mn, mma.thr_id)
        tma_a, tA = cute.nvgpu.make_tiled_tma_atom_A(a_op, mA, self.stage(self.a_smem), self.mma_tiler, mma, vmnk)
        tma_b, tB = cute.nvgpu.make_tiled_tma_atom_B(b_op, mB, self.stage(self.b_smem), self.mma_tiler, mma, vmnk)
        tma_sfa, tSFA = cute.nvgpu.make_tiled_tma_atom_A(
            a_op, mSFA, self.stage(self.sfa_smem), self.mma_tiler, mma, vmnk, internal_type=cutlass.Int16
        )
        tma_sfb, tSFB = cute.nvgpu.make_tiled_tma_atom_B(
            sfb_op,
            mSFB,
            self.stage(self.sfb_smem),
            self.mma_tiler_sfb,
            self.tiled_mma_sfb,
            self.cluster_sfb_vmnk.shape,
            internal_type=cutlass.Int16,
        )
        return (tma_a, tA), (tma_b, tB), (tma_sfa, tSFA), (tma_sfb, tSFB)

    def tx_bytes(self, a_dtype, b_dtype) -> int:
        """Bytes one stage's TMA loads bring into the CTA that waits for them (the pair's leader counts the
        pair's bytes: a 2-CTA MMA waits for both halves)."""
        size = (
            cute.size_in_bytes(a_dtype, self.stage(self.a_smem))
            + cute.size_in_bytes(b_dtype, self.stage(self.b_smem))
            + cute.size_in_bytes(SF_DTYPE, self.stage(self.sfa_smem))
            + cute.size_in_bytes(SF_DTYPE, self.stage(self.sfb_smem))
        )
        return size * self.ncta


def blocked_scale_layout(rows, k, g):
    """((32, 4, row tiles), (32, 4, K tiles), G) over the bytes of formats/blocked_scales.py's layout for a
    (G, rows, K) operand: row r, K element k -> byte (r % 32) 16 + ((r // 32) % 4) 4 + (k // 32) % 4 of
    tile (r // 128, k // 128), tiles row-major, 512 bytes each (the 32 elements of a block share a byte:
    stride 0). Rows and K are padded to whole 128x4 tiles (the buffer holds the padding)."""
    tr = (rows + SCALE_TILE_ROWS - 1) // SCALE_TILE_ROWS
    tk = (k + 4 * SF_VEC - 1) // (4 * SF_VEC)
    shape = (((32, 4), tr), ((SF_VEC, 4), tk), g)
    stride = (((16, 4), tk * SCALE_TILE_BYTES), ((0, 1), SCALE_TILE_BYTES), tr * tk * SCALE_TILE_BYTES)
    return cute.make_layout(shape, stride=stride)


def scale_tmem_tensors(setup: MmaSetup, acc_tmem_ptr, sfa_col: int, sfb_col: int):
    """(tCtSFA, tCtSFB): the TMEM tensors of one K tile's scales at columns sfa_col and sfb_col of the
    allocation whose base is acc_tmem_ptr (a Float32 TMEM pointer)."""
    sfa_ptr = cute.recast_ptr(acc_tmem_ptr + sfa_col, dtype=SF_DTYPE)
    sfb_ptr = cute.recast_ptr(acc_tmem_ptr + sfb_col, dtype=SF_DTYPE)
    sfa_layout = blockscaled.make_tmem_layout_sfa(setup.tiled_mma, setup.mma_tiler, SF_VEC, setup.stage(setup.sfa_smem))
    sfb_layout = blockscaled.make_tmem_layout_sfb(setup.tiled_mma, setup.mma_tiler, SF_VEC, setup.stage(setup.sfb_smem))
    return cute.make_tensor(sfa_ptr, sfa_layout), cute.make_tensor(sfb_ptr, sfb_layout)


def make_scale_copy(setup: MmaSetup, sSF, tSF):
    """(tiled copy, source, destination) of tcgen05.cp.cta_group::{1,2}.32x128b.warpx4 for one operand's
    scales, shared memory -> TMEM (copy_scales issues one stage).

    sSF: the staged shared-memory scale tensor (MMA, MMA_MN, MMA_K, STAGE); tSF: its TMEM tensor. The
    shared-memory side gets the copy's x4 broadcast mode explicitly (tcgen05.append_s2t_broadcast_mode) so
    its partition matches the TMEM-derived tiler."""
    op = tcgen05.Cp4x32x128bOp(setup.cta_group)
    tiled = tcgen05.make_s2t_copy(cute.make_copy_atom(op, SF_DTYPE), cute.filter_zeros(tSF))
    thr = tiled.get_slice(0)
    src = tcgen05.append_s2t_broadcast_mode(op, cute.filter_zeros(sSF))
    return tiled, tcgen05.get_s2t_smem_desc_tensor(tiled, thr.partition_S(src)), thr.partition_D(cute.filter_zeros(tSF))


def copy_scales(scale_copy, stage) -> None:
    """Issues the scale copy of ring stage `stage` (one thread of the MMA warp)."""
    tiled, src, dst = scale_copy
    cute.copy(tiled, src[(None, None, None, None, stage)], dst)


@cute.jit
def mma_k_tile(tiled_mma, acc, tCrA, tCrB, tCtSFA, tCtSFB, stage, accumulate) -> None:
    """acc (+)= the K tile in ring stage `stage`: one block-scaled MMA per 32 K (accumulate: a run-time
    Boolean, False for a tile's first K tile: its first MMA overwrites the accumulator)."""
    for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
        tiled_mma.set(tcgen05.Field.ACCUMULATE, accumulate if kb == 0 else True)
        k = (None, None, kb, stage)
        cute.gemm(
            tiled_mma,
            acc,
            [tCrA[k], tCtSFA[(None, None, kb)]],
            [tCrB[k], tCtSFB[(None, None, kb)]],
            acc,
        )
