"""config.split_n of the Hopper MX GEMM (kernels/sm90/mx_gemm.py): the K loop in two column halves.

Supported features: what mx_gemm.py supports (any FP8 mix, bf16 / float32 out, bias, batch, edge tiles:
the epilogue and the producer are mx_gemm.py's), tile_n 128 or 192, lockstep consumers only (registry
MXGemmConfig.split_n excludes pingpong, overlap, early / preload scales, diagnostics; with unroll_stages
mx_gemm.py's lap loop runs _split_tile with constant stage indices).

Per K tile and consumer warpgroup: the 4 m64 n{tile_n / 2} k32 wgmmas of column half 0 into temporary ta
and those of half 1 into tb are issued together (two commit groups); after wait_group(1) half 0 is promoted
while half 1's wgmmas still run, after wait_group(0) half 1 (main += t * (sa * sb), the same per-element
FMUL + FFMA as mx_gemm.py's _fma, in the same K order: bit-identical). Registers: main (tile_n / 2 per
thread) + ta + tb (tile_n / 4 each) = lockstep's main + tmp. A is read from shared memory twice per K
tile. Issuing the next K tile's half 0 before this tile's half 1 is promoted (a wgmma group in flight
across the loop's back edge, the full overlap) made ptxas serialize every wgmma (C7514; docs/perf-notes.md).
Mixed into MXGemmSm90, whose attributes (config, tn, stages, a_dtype, b_dtype, _state) it uses.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from jax_mxfp8.kernels.registry import GEMM_K_TILE
from jax_mxfp8.kernels.sm90 import warp_specialization as ws
from jax_mxfp8.kernels.sm90 import wgmma
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords

WG_M = 64  # rows per consumer warpgroup (mx_gemm.WG_M)
NUM_CONSUMERS = 2


class MXGemmSplitN:
    """The split_n K loop (methods of MXGemmSm90)."""

    def _make_mma_half(self) -> cute.TiledMma:
        """config.split_n: the m64 n{tile_n / 2} k32 wgmma of one column half (both warpgroups)."""
        return wgmma.make_fp8_ss_mma((WG_M, self.tn // 2), self.a_dtype, self.b_dtype, (NUM_CONSUMERS, 1, 1))

    @cute.jit
    def _split_operands(self, sA, sB, tid):
        """config.split_n: (tCrA, tCrB of column half 0, tCrB of half 1) of the half-width MMA (rows
        tile_n / 2 .. of B's K-major stage start on a swizzle-atom boundary: 8-row, 1024-byte atoms)."""
        mma = self._make_mma_half()
        thr = mma.get_slice(tid)
        thr_h = mma.get_slice(cute.arch.make_warp_uniform(tid // ws.WARPGROUP_THREADS) * ws.WARPGROUP_THREADS)
        if cutlass.const_expr(not self.config.uniform_desc):
            thr_h = thr
        half = (self.tn // 2, GEMM_K_TILE, self.stages)
        tCrA = mma.make_fragment_A(thr_h.partition_A(sA))
        tCrB0 = mma.make_fragment_B(thr_h.partition_B(cute.local_tile(sB, half, (0, 0, 0))))
        tCrB1 = mma.make_fragment_B(thr_h.partition_B(cute.local_tile(sB, half, (1, 0, 0))))
        return tCrA, tCrB0, tCrB1

    @cute.jit
    def _mainloop_split(self, sp, main, base, k_tiles):
        """config.split_n: each K tile's wgmmas in two column halves with fixed temporaries (half 0 -> ta,
        half 1 -> tb), both issued, then half 0 promoted while half 1's wgmmas still run, then half 1. No
        wgmma stays in flight across the loop's back edge (a loop-carried one, issued a half ahead as in
        config.overlap, made ptxas serialize every wgmma: C7514).
        sp = (pipe, tCrA, tCrB0, tCrB1, ta, tb, sSA, sSB, row, col)."""
        for kt in cutlass.range(k_tiles, unroll=1):
            self._split_tile(sp, main, base + kt)

    @cute.jit
    def _split_tile(self, sp, main, pos):
        """One K tile at ring position pos (or, with unroll_stages, a state with a constant stage index)."""
        pipe, tCrA, tCrB0, tCrB1, ta, tb, sSA, sSB, row, col = sp
        self._issue_half(pipe, ta, tCrA, tCrB0, pos, True)
        self._issue_half(pipe, tb, tCrA, tCrB1, pos, False)
        cute.nvgpu.warpgroup.wait_group(1)
        s = self._state(pos).index
        sa_r = cute.make_rmem_tensor((2,), Float32)
        for v1 in cutlass.range_constexpr(2):
            sa_r[v1] = sSA[(row + 8 * v1, 0, s)]
        self._promote_half(main, ta, sa_r, sSB, s, col, 0)
        cute.nvgpu.warpgroup.wait_group(0)
        self._promote_half(main, tb, sa_r, sSB, s, col, 1, (pipe, self._state(pos)))

    @cute.jit
    def _issue_half(self, pipe, acc, tCrA, tCrB, pos, wait: bool):
        """config.split_n: (waits for ring position pos if `wait`,) issues one column half's 4 wgmmas into
        the fresh temporary acc and commits them as one group."""
        state = self._state(pos)
        if cutlass.const_expr(wait):
            pipe.consumer_wait(state)
        cute.nvgpu.warpgroup.fence()
        s = state.index
        wgmma.gemm(self._make_mma_half, acc, tCrA[(None, None, None, s)], tCrB[(None, None, None, s)], False)
        cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def _promote_half(self, main, acc, sa_r, sSB, s, col, h: int, release=None):
        """main[half h] += acc * (sa * sb) for stage s: element i of the half-width fragment is element
        i + h * size(acc) of the full one (columns + h tile_n / 2, acc_coords' nb + h tile_n / 16).
        release = (pipe, state): the stage is released once its last scales are loaded."""
        sb_c = cute.make_rmem_tensor((self.tn // 8,), Float32)
        for j in cutlass.range_constexpr(self.tn // 8):
            sb_c[j] = sSB[(h * (self.tn // 2) + col + j % 2 + 8 * (j // 2), 0, s)]
        if cutlass.const_expr(release is not None):
            release[0].consumer_release(release[1])
        n = cute.size(acc)
        for i in cutlass.range_constexpr(n):
            v0, v1, nb = acc_coords(i)
            main[i + h * n] = main[i + h * n] + acc[i] * (sa_r[v1] * sb_c[2 * nb + v0])
