"""FP8 warpgroup MMA (wgmma) building blocks for Hopper (sm_90a) kernels.

For every sm_90a kernel that multiplies FP8 operands on the tensor cores (attention forward and backward,
the MX GEMM): tiled-MMA construction for the two operand sources and the K-block issue loop. Hopper's FP8
wgmma reads both operands K-major (the transpose bits exist only for 16-bit types),
so every operand here is K-major; a GEMM contracting along the other axis needs a transposed FP8 copy.
Register fragment layouts (accumulator -> A operand) are in kernels/sm90/wgmma_fragment.py.
"""

from __future__ import annotations

from collections.abc import Callable

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32

FP8 = cutlass.Float8E4M3FN


def make_fp8_ss_mma(
    tiler_mn: tuple[int, int],
    a_dtype: type[cutlass.Numeric] = FP8,
    b_dtype: type[cutlass.Numeric] = FP8,
    atom_layout: tuple[int, int, int] = (1, 1, 1),
) -> cute.TiledMma:
    """One warpgroup's (M, N) = tiler_mn FP8 wgmma, A and B both K-major in shared memory, float32
    accumulator: C (M, N) = A (M, K) B (N, K)^T, e.g. S = Q K^T with tiler (64, 128).

    a_dtype, b_dtype: Float8E4M3FN (default) or Float8E5M2, any mix. atom_layout: warpgroups tiling the
    atom, e.g. (2, 1, 1) for two consumer warpgroups on 64-row halves of a 128-row tile (the MX GEMM;
    the slice of thread t in [0, 256) covers rows 64 (t // 128) ..)."""
    k = utils.LayoutEnum.ROW_MAJOR.sm90_mma_major_mode()
    return sm90_utils.make_trivial_tiled_mma(a_dtype, b_dtype, k, k, Float32, atom_layout, tiler_mn)


def make_fp8_rs_mma(tiler_mn: tuple[int, int]) -> cute.TiledMma:
    """As make_fp8_ss_mma with A (M, K) in registers (the 8-bit A fragment, see wgmma_fragment.py) and B
    K-major in shared memory, e.g. O += P V with P from the softmax and V'^T stored (H, keys)."""
    k = utils.LayoutEnum.ROW_MAJOR.sm90_mma_major_mode()
    return sm90_utils.make_trivial_tiled_mma(
        FP8, FP8, k, k, Float32, (1, 1, 1), tiler_mn, cute.nvgpu.warpgroup.OperandSource.RMEM
    )


@cute.jit
def gemm(make_mma: Callable[[], cute.TiledMma], acc, a, b, accumulate_first: bool):
    """acc (+)= a b over every K block (mode 2 of the partitioned a, b: 32 FP8 elements per wgmma).

    a, b: one stage of the MMA's A / B fragments (make_fragment_A/B, stage index already applied), acc its
    C fragment. The first K block accumulates onto acc iff accumulate_first (a run-time or trace-time
    Boolean), the others always. Issues the wgmmas only: the caller fences, commits and waits.
    make_mma builds a fresh tiled MMA per call: setting its ACCUMULATE field rebinds run-time state, which
    must not escape the staged loop or branch it was set in.
    """
    tiled_mma = make_mma()
    for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, accumulate_first or kb != 0)
        cute.gemm(tiled_mma, acc, a[None, None, kb], b[None, None, kb], acc)
