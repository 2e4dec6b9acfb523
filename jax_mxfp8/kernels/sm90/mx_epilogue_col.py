"""The column orientation of the MX GEMM's quantize epilogue (store_col, kernels/sm90/mx_gemm_epilogue.py).

What it writes, per 128 x tile_n CTA tile of z (float32, the value the row epilogue quantizes): exactly
gemm_operands' "col" output of z (reference/gemm_align.py align128 of quantize(z, axis=-2)), the operand
a wgrad GEMM contracting over M takes:
  qc (G, N, Mp)       E4M3, K-major along M (the tile transposed); rows M <= m < Mp are +0
  sc (G, Mp/128, N)   float32 2^(E - 127), E = max of the 4 block exponents e_b of the 128-row run
  data' = RNE_satfinite(RNE_satfinite(z * 2^(127 - e_b)) * 2^(e_b - E))  (quantize, then align128)
The CTA tile's 128 rows are exactly one 128-run (tile_m = 128 and Mp a multiple of 128), so E needs the
whole tile: both consumer warpgroups.

Data flow (the wgmma accumulator: thread holds rows row, row + 8 of columns col + v0 + 8 nb, a warp 16
rows, a 32-row block two warps of one warpgroup), through COL_SMEM bytes of shared memory beside the
ring (the ring is NOT free here: the producer already loads the next work tile's K tiles into it):
  1. amax over the warp's 16 rows per column: max of the thread's two rows, butterfly over lanes 4, 8, 16
     (3 shuffles per column pair value); lanes 0-3 store [warp][column] u32.            named barrier
  2. one thread per column (tid < tile_n): e_b of the 4 blocks (two warps each; blocks at or past M have
     e_b = 0: padding), E = max, the run scale to global, the blocks' quantize / align factors to shared
     memory.                                                                             named barrier
  3. every thread: quantize4_f32 + ptx_align.requant4 of its 4 values per column pair (the producer
     kernel's exact formula), byte stores into a transposed staging tile [column][128 rows] (pitch 144:
     the 4 columns of a store instruction fall in distinct banks).                      named barrier
  4. 16-byte rows of the staging tile to qc (each column's 128 bytes contiguous in global memory).
A work tile wholly past M (cluster_m = 2's partner of the last M tile) runs the barriers but stores nothing.
Memory ordering across work tiles: a region is rewritten only after the barrier that follows its last
read (amax: read in 2, next written in 1 after barrier 3; factors: read in 3, rewritten in 2 after the next
barrier 1; tile: read in 4, rewritten in 3 after the next barrier 2).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

from jax_mxfp8.kernels.common import ptx, ptx_align
from jax_mxfp8.kernels.sm90.mx_epilogue import ABS_MASK
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords

RUN = 128  # rows of the tile = one aligned run along M
WARPS = 8  # consumer warps (2 warpgroups x 4), 16 rows each
BLOCKS = RUN // 32
THREADS = 32 * WARPS
PITCH = 144  # bytes per column of the staging tile: 128 rows + 16 (bank spread, 16-byte aligned rows)
BARRIER = 3  # named barrier id (0: __syncthreads)
ELEM = "float8_e4m3fn"


def smem_bytes(tile_n: int) -> int:
    """Shared memory of the column epilogue: amax [8][tile_n] u32, factors [4][tile_n] (u32, u32), the
    staging tile [tile_n][PITCH] bytes."""
    return WARPS * tile_n * 4 + BLOCKS * tile_n * 8 + tile_n * PITCH


def zero_unless(x: Uint32, rows_left: Int32) -> Uint32:
    """x where rows_left > 0, else 0 (a block at or past M: exponent 0, data +0)."""
    code = "{\n.reg .pred p;\nsetp.gt.s32 p, {$r1}, 0;\nselp.b32 {$w0}, {$r0}, 0, p;\n}"
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[x, rows_left])


def _sync() -> None:
    cute.arch.barrier(barrier_id=BARRIER, number_of_threads=THREADS)


def column_epilogue(z, sbase: Int32, qc_base: Int64, sc_base: Int64, mp, m, n, tn: int, w, row, col) -> None:
    """Writes the tile's column orientation (module docstring). z: the thread's tn / 2 float32 bit patterns
    in acc_coords order; sbase: smem_bytes(tn) of shared memory (128-byte aligned); qc_base / sc_base: the
    (G*N, Mp) E4M3 and (G*Mp/128, N) float32 outputs; mp, m, n: Mp, M, N; w: the work tile; row, col:
    the thread's tile row (0..127) and first column (2 (lane % 4))."""
    warp = row // 16  # consumer warp 0..7
    rsub = row % 16  # lane // 4
    tid = 32 * warp + 4 * rsub + col // 2
    amax_s = sbase
    fac_s = sbase + WARPS * tn * 4
    tile_s = fac_s + BLOCKS * tn * 8
    tile_row0 = w.m_tile * RUN
    live = Boolean(tile_row0 < m)  # with cluster_m = 2 a CTA's tile may lie wholly past M: it stores nothing
    nbs = tn // 8

    # 1. per-column amax of the warp's 16 rows
    lead = Boolean(rsub == 0)
    for nb in range(nbs):
        for v0 in range(2):
            i0, i1 = v0 + 4 * nb, v0 + 2 + 4 * nb
            assert acc_coords(i0) == (v0, 0, nb) and acc_coords(i1) == (v0, 1, nb)
            a = ptx.max_u32(z[i0] & Uint32(ABS_MASK), z[i1] & Uint32(ABS_MASK))
            for offset in (4, 8, 16):
                a = ptx.max_u32(a, ptx.shfl_bfly(a, offset))
            ptx.st_shared_b32(amax_s + (warp * tn + col + v0 + 8 * nb) * 4, a, pred=lead)
    _sync()

    # 2. one thread per column: block exponents, the run exponent, its scale, the factors
    t = tid % tn
    active = Boolean(tid < tn)
    eb = []
    for b in range(BLOCKS):
        a = ptx.max_u32(
            ptx.ld_shared_b32(amax_s + ((2 * b) * tn + t) * 4), ptx.ld_shared_b32(amax_s + ((2 * b + 1) * tn + t) * 4)
        )
        e, _ = ptx.scale_and_factor(a, ELEM, "up")
        eb.append(zero_unless(e, m - (tile_row0 + 32 * b)))
    e_run = ptx.max_u32(ptx.max_u32(eb[0], eb[1]), ptx.max_u32(eb[2], eb[3]))
    gcol = w.n_tile * tn + t
    s_addr = sc_base + ((Int64(w.g) * Int64(mp // RUN) + Int64(w.m_tile)) * Int64(n) + Int64(gcol)) * 4
    ptx.st_global(s_addr, [ptx_align.run_scale_bits(e_run)], pred=active & (gcol < n) & live)
    for b in range(BLOCKS):
        af = ptx_align.align_factor(e_run, eb[b], ELEM)
        words = [ptx_align.quant_factor(eb[b]), ptx_align.pack_halves(af, af)]
        ptx_align.st_shared_v2(fac_s + (b * tn + t) * 8, words, pred=active)
    _sync()

    # 3. quantize + align128 re-rounding, transposed byte stores into the staging tile
    blk = warp // 2
    rows_left = m - (tile_row0 + 32 * blk)
    for nb in range(nbs):
        c0 = col + 8 * nb
        fq0, fa0, fq1, fa1 = ptx.ld_shared_v4(fac_s + (blk * tn + c0) * 8)
        xs = [z[4 * nb], z[2 + 4 * nb], z[1 + 4 * nb], z[3 + 4 * nb]]  # (c0, row), (c0, row+8), (c0+1, ..)
        word = ptx.quantize4_f32(xs, [fq0, fq0, fq1, fq1], ELEM)
        word = zero_unless(ptx_align.requant4(word, [fa0, fa1], ELEM), rows_left)
        addr = tile_s + c0 * PITCH + row
        ptx.st_shared_u8(addr, word)
        ptx.st_shared_u8(addr + 8, word >> Uint32(8))
        ptx.st_shared_u8(addr + PITCH, word >> Uint32(16))
        ptx.st_shared_u8(addr + PITCH + 8, word >> Uint32(24))
    _sync()

    # 4. the staging tile's columns (128 contiguous bytes each) to qc, 16 bytes per thread and step
    assert (tn * 8) % THREADS == 0
    for k in range(tn * 8 // THREADS):
        chunk = tid + THREADS * k
        cl, part = chunk // 8, chunk % 8
        words = ptx.ld_shared_v4(tile_s + cl * PITCH + part * 16)
        gc = w.n_tile * tn + cl
        addr = qc_base + (Int64(w.g) * Int64(n) + Int64(gc)) * Int64(mp) + Int64(tile_row0 + part * 16)
        ptx.st_global(addr, list(words), pred=live & (gc < n))
