"""Building blocks of the Hopper attention backward kernel (kernels/sm90/attention_bwd.py).

  quantize_ds_square   dS^T (a consumer's 64 keys x 64 queries accumulator fragment) -> its 32x32 square-block
                       MX values (scale rule "up", E4M3 satfinite), the block amax shared by a warp pair
  quantize_p_blocks    P^T (the same fragment) -> its MX values in blocks of 32 queries per key (p_scale "block":
                       dV's contracting axis), the block amax reduced over a lane quad
  red_add_f32          red.global.add.f32 (dq_store "red"); red_add_v2_f32: 2 adjacent floats
  bulk_*               the bulk-group commit and waits of the TMA dQ stores; bulk_load: cp.async.bulk
                       global -> shared on an mbarrier (smem_stats)
  st_shared_v2_f32     8-byte shared-memory store
  tma_tile_partition   the TMA partitions of a tiled (rows, H, heads) tensor and its staged smem tile
  redux_max_u32        warp-wide unsigned max in one instruction (amax_reduce "redux")
Accumulator coordinates: kernels/sm90/wgmma_fragment.py (acc_coords). The kernel's tile geometry and named
barrier ids are defined here, shared by its modules (attention_bwd.py, _consumer.py, _dq_reduce.py).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords

BF16 = cutlass.BFloat16
FP8 = cutlass.Float8E4M3FN
TILE_M = 64  # query rows per step
NUM_CONSUMERS = 2
WG_N = 64  # keys per consumer warpgroup
CTA_N = WG_N * NUM_CONSUMERS  # keys per CTA (the reference's kv_tile)
LOG2E = math.log2(math.e)
P_CONST = 256.0  # p_scale "const": P stored as E4M3(P * 2^8)
DS_BARRIER = 1  # named barrier: dS tile written by both consumers (256 threads)
AMAX_BARRIER0 = 2  # named barriers 2..5: one per warp pair (64 threads), the dS block amax exchange
DQ_BARRIER0 = 6  # named barriers 6, 7: one per consumer (128 threads), the deterministic dQ mode's ordering
DQ_FULL_BARRIER = 10  # dq_store "tma_writer": the dQ staging tile written (consumers arrive, the writer warp syncs)
DQ_EMPTY_BARRIER = 11  # dq_store "tma_writer": the staging tile read by the TMA (the writer arrives, consumers sync)

SDP_FP8_OPERANDS = ("q8", "k8", "v8", "do8", "qs", "ks", "vs", "dos")
"""The sdp_fp8 variants' extra operands, after dv: the FP8 copies (realigned to one exponent per 32 rows,
head-major like q, k, v, do) and their row factors (qs: tau log2(e) 2^e per 32 query rows; ks, vs, dos: 2^e)."""

QB_INDICES = tuple(tuple(i for i in range(32) if acc_coords(i)[2] // 4 == qb) for qb in range(2))
"""Flat indices of a 64 x 64 accumulator fragment in query block qb (columns 32 qb .. 32 qb + 31)."""

PB_INDICES = tuple(
    tuple(tuple(i for i in QB_INDICES[qb] if acc_coords(i)[1] == v1) for v1 in range(2)) for qb in range(2)
)
"""PB_INDICES[qb][v1]: the 8 flat indices of one key row (row half v1) in query block qb; the row's 32 queries
of the block are these 8 in each lane of the quad (lane % 4 = 0..3)."""


def tma_tile_partition(atom, g_tensor, s_tensor, tile):
    """TMA partitions (smem, gmem) of a (rows, H, heads) tensor in tiles `tile` (rows, columns) and of a
    staged shared-memory tile (rows, columns, stages): index the smem one by (None, stage), the gmem one by
    (None, row tile, column tile, head)."""
    return cute.nvgpu.cpasync.tma_partition(
        atom,
        0,
        cute.make_layout(1),
        cute.group_modes(s_tensor, 0, 2),
        cute.group_modes(cute.flat_divide(g_tensor, tile), 0, 2),
    )


def red_add_f32(addr: Int64, value: Float32) -> None:
    """Float32 atomic add without return (red.global.add.f32) at global address addr."""
    inline_ptx("red.global.add.f32 [{$r0}], {$r1};", read_only_args=[addr, value])


def red_add_v2_f32(addr: Int64, a: Float32, b: Float32) -> None:
    """Float32 atomic adds without return of a, b at the 8-byte aligned global address addr, addr + 4
    (red.global.add.v2.f32, sm_90): one L2 reduction of two floats."""
    inline_ptx("red.global.add.v2.f32 [{$r0}], {{$r1}, {$r2}};", read_only_args=[addr, a, b])


def bulk_load(dst: Int32, src: Int64, size: int, mbar: Int32) -> None:
    """cp.async.bulk of `size` bytes from global address src to shared address dst (both 16-byte aligned),
    completing `size` transaction bytes on the mbarrier at shared address mbar (smem_stats)."""
    inline_ptx(
        f"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{{$r0}}], [{{$r1}}], {size}, [{{$r2}}];",
        read_only_args=[dst, src, mbar],
    )


def bulk_commit() -> None:
    inline_ptx("cp.async.bulk.commit_group;")


def bulk_wait_read() -> None:
    """Waits until this thread's committed bulk operations have read their shared-memory sources."""
    inline_ptx("cp.async.bulk.wait_group.read 0;")


def bulk_wait() -> None:
    """Waits until this thread's committed bulk operations are complete."""
    inline_ptx("cp.async.bulk.wait_group 0;")


def st_shared_v2_f32(addr: Int32, a: Float32, b: Float32) -> None:
    inline_ptx("st.shared.v2.f32 [{$r0}], {{$r1}, {$r2}};", read_only_args=[addr, a, b])


def redux_max_u32(x: Uint32) -> Uint32:
    """The unsigned max of x over the full warp (redux.sync.max.u32, sm_80+): the same value as 5 butterfly
    shuffle + max steps, one instruction (no chain of dependent shuffles)."""
    return inline_ptx("redux.sync.max.u32 {$w0}, {$r0}, -1;", write_only_types=[Uint32], read_only_args=[x])


def tree_max_u32(vals: list) -> Uint32:
    """Unsigned max of a power-of-two count of values as a balanced tree (trace-time Python: no staged loop)."""
    while len(vals) > 1:
        vals = [ptx.max_u32(vals[j], vals[j + 1]) for j in range(0, len(vals), 2)]
    return vals[0]


def f32_bits(x: Float32) -> Uint32:
    return x.bitcast(Uint32)


def bits_f32(x: Uint32) -> Float32:
    return x.bitcast(Float32)


@cute.jit
def quantize_ds_square(acc, sAmax, buf, c, warp_wg, lane, pair_barrier, redux: bool = False):
    """acc (dS^T, 64 keys x 64 queries of this consumer) -> its 32x32 square-block MX values in place
    (scale rule "up", E4M3 satfinite, dequantized). A block is 32 queries (nb in [4 qb, 4 qb + 4)) of
    a warp pair's 32 keys: the lanes' amax (integer max of |x| bits: NaN/Inf blocks seen) is reduced
    over the warp (trace-time redux: one redux.sync instead of 5 shuffles), then over the pair through
    shared memory (slot (buf, warp, qb))."""
    amax = cute.make_rmem_tensor((2,), Uint32)
    for qb in cutlass.range_constexpr(2):
        if cutlass.const_expr(redux):
            # a 4-level tree over the 16 values instead of a 16-long dependent chain (ILP)
            mx = redux_max_u32(tree_max_u32([f32_bits(acc[i]) & Uint32(0x7FFFFFFF) for i in QB_INDICES[qb]]))
        else:
            mx = Uint32(0)
            for i in cutlass.range_constexpr(16):
                mx = ptx.max_u32(mx, f32_bits(acc[QB_INDICES[qb][i]]) & Uint32(0x7FFFFFFF))
            for k in cutlass.range_constexpr(5):
                mx = ptx.max_u32(mx, ptx.shfl_bfly(mx, 1 << k))
        amax[qb] = mx
    slot = (buf * 8 + c * 4 + warp_wg) * 2
    partner = (buf * 8 + c * 4 + (warp_wg ^ 1)) * 2
    if lane == 0:
        sAmax[slot] = amax[0]
        sAmax[slot + 1] = amax[1]
    cute.arch.barrier(barrier_id=pair_barrier, number_of_threads=64)
    for qb in cutlass.range_constexpr(2):
        block_amax = ptx.max_u32(amax[qb], sAmax[partner + qb])
        b8, factor = ptx.scale_and_factor(block_amax, "float8_e4m3fn", "up")
        # the scale 2^(b - 127) from the exponent bits (b = 0: 0, the block's values are below 2^-118
        # and flush; b = 255, a NaN/Inf block: inf, times the NaN elements)
        inv = bits_f32(b8 << Uint32(23))
        for k4 in cutlass.range_constexpr(4):
            group = QB_INDICES[qb][4 * k4 : 4 * k4 + 4]
            word = ptx.quantize4_f32([f32_bits(acc[i]) for i in group], [factor] * 4, "float8_e4m3fn")
            vals = ptx.fp8x4_to_f32(word, "float8_e4m3fn")
            for t in cutlass.range_constexpr(4):
                acc[group[t]] = bits_f32(vals[t]) * inv


@cute.jit
def quantize_p_blocks(acc, out, rounding: str):
    """acc (P^T, 64 keys x 64 queries of this consumer, float32 in [0, 1] or NaN) -> out (the same fragment
    layout): P's MX values in blocks of 32 queries per key (p_scale "block": dV = P^T dO contracts the
    queries), scale rule `rounding`, E4M3 satfinite, dequantized (exact in bfloat16). A block is one row's 8
    values in each lane of a quad: the amax (integer max of |x| bits, NaN seen) is a tree over the 8, then
    two butterfly shuffles. Scale byte 0 (a block below ~2^-118) gives 0 as quantize_ds_square's does; a NaN
    block gives NaN everywhere in it (scale byte 255), as the reference's."""
    for qb in cutlass.range_constexpr(2):
        for v1 in cutlass.range_constexpr(2):
            idx = PB_INDICES[qb][v1]
            mx = tree_max_u32([f32_bits(acc[i]) & Uint32(0x7FFFFFFF) for i in idx])
            for k in cutlass.range_constexpr(2):
                mx = ptx.max_u32(mx, ptx.shfl_bfly(mx, 1 << k))
            b8, factor = ptx.scale_and_factor(mx, "float8_e4m3fn", rounding)
            inv = bits_f32(b8 << Uint32(23))  # 2^(b - 127); b = 0: 0; b = 255: inf (times NaN elements)
            for k4 in cutlass.range_constexpr(2):
                group = idx[4 * k4 : 4 * k4 + 4]
                word = ptx.quantize4_f32([f32_bits(acc[i]) for i in group], [factor] * 4, "float8_e4m3fn")
                vals = ptx.fp8x4_to_f32(word, "float8_e4m3fn")
                for t in cutlass.range_constexpr(4):
                    out[group[t]] = bits_f32(vals[t]) * inv
