"""Register fragment layouts of Hopper's wgmma, and the accumulator -> 8-bit A operand repacking.

For sm_90a kernels that feed one wgmma's float32 accumulator into the next one as the register (RS) A
operand in FP8 without shuffles: attention's P = softmax(S) into O += P V (forward), and likewise P / dS in
the backward. Per thread, for a 64-row warpgroup tile (row0 = 16 * warp + lane // 4, q = lane % 4):
  accumulator  ((2, 2, N/8), 1, 1) float32: flat index i = v0 + 2 v1 + 4 nb holds
               (row0 + 8 v1, 2q + v0 + 8 nb)                                          (acc_coords)
  8-bit A      ((4, 2, 2), 1, K/32): byte i of word (row half v1, k half v2) of k-block kb holds
               (row0 + 8 v1, 32 kb + 16 v2 + 4q + i)
Per 32 keys the accumulator holds keys {2q, 2q+1, 8+2q, 9+2q, 16+2q, 17+2q, 24+2q, 25+2q} while the A
fragment wants k-slots {4q..4q+3, 16+4q..19+4q}: packing accumulator values in acc_index_for_a_slot order
puts key PV_PERMUTATION[a] in k-slot a of every 32-key chunk. The B operand (V'^T) must hold its keys in
that same order (the producer pass stores them so: registry.pv_permutation(), kernels/sm90/attention_realign.py),
and the GEMM sums the same (P, V) pairs.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from jax_mxfp8.kernels.registry import pv_permutation

FP8 = cutlass.Float8E4M3FN


def acc_coords(i: int) -> tuple[int, int, int]:
    """(v0, v1, nb) of flat index i of a 64 x N float32 wgmma accumulator fragment: the value sits at
    (row0 + 8 v1, 2 (lane % 4) + v0 + 8 nb) of the warpgroup tile (trace time)."""
    return i % 2, (i // 2) % 2, i // 4


def acc_index_for_a_slot(flat_a: int) -> int:
    """Flat index into the (64 x 128) S accumulator fragment of the value for A-fragment element flat_a.

    A fragment ((4, 2, 2), 1, 4): byte i of word (row half v1, k half v2) of k-block kb.
    Accumulator ((2, 2, 16), 1, 1): v0 (column + 1), v1 (row + 8), nb (column + 8).
    """
    i, v1, v2, kb = flat_a % 4, (flat_a // 4) % 2, (flat_a // 8) % 2, flat_a // 16
    nb = 4 * kb + 2 * v2 + i // 2
    return (i % 2) + 2 * v1 + 4 * nb


def a_slot_key_order() -> tuple[int, ...]:
    """Key (within its 32-key chunk) that k-slot a = 16 v2 + 4q + i of the packed A fragment holds, the same
    for every thread: the column 2q + v0 + 8 nb of the accumulator value acc_index_for_a_slot puts there."""
    order = []
    for a in range(32):
        v2, q, i = a // 16, (a % 16) // 4, a % 4
        v0, _, nb = acc_coords(acc_index_for_a_slot(i + 8 * v2))  # row half v1 = 0, k-block 0
        order.append(2 * q + v0 + 8 * nb)
    return tuple(order)


PV_PERMUTATION = pv_permutation()
"""k-slot a of the A fragment holds key PV_PERMUTATION[a] of its 32-key chunk (registry.pv_permutation)."""
assert a_slot_key_order() == PV_PERMUTATION, "acc_index_for_a_slot disagrees with registry.pv_permutation"


@cute.jit
def pack_acc_to_a_fp8(acc, a_f32, a_fp8):
    """acc (64 x 128 float32 accumulator fragment) into the 8-bit A fragment a_fp8 (PV_PERMUTATION order,
    cvt.rn.satfinite to E4M3); a_f32 is a float32 register tensor shaped like a_fp8 (the gather buffer)."""
    for a in cutlass.range_constexpr(cute.size(a_f32)):
        a_f32[a] = acc[acc_index_for_a_slot(a)]
    a_fp8.store(a_f32.load().to(FP8))
