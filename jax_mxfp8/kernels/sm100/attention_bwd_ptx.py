"""PTX building blocks of the Blackwell attention backward's warp roles (sm_100f), called while a CuTe DSL
kernel is traced: tensor-memory loads and stores, the fences around them, bulk copies and bulk reduce-adds,
IEEE float32 arithmetic that must not be contracted, and the deterministic dQ semaphore.

TMEM addresses are 32-bit: lane in bits 16-31, column in bits 0-15. A warp may reach only its lane quarter
(warp w % 4: lanes 32 (w % 4) .. + 31), so every address here carries that quarter's lane base.
"""

from __future__ import annotations

import struct

from cutlass import Boolean, Float32, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

# ------------------------------------------------------------------------------------------ tensor memory


def tmem_addr(base: Uint32, lane_quarter, column) -> Uint32:
    """The TMEM address of (lane 32 lane_quarter, column) in the allocation at `base`."""
    return base + (Uint32(lane_quarter * 32) << Uint32(16)) + Uint32(column)


def tmem_load(taddr: Uint32, columns: int) -> list[Float32]:
    """`columns` (16, 32 or 64) consecutive columns of this thread's lane: tcgen05.ld.32x32b.x16 / .x32 (one
    per 32 columns) and tcgen05.wait::ld in ONE asm statement, so that no use of a value can be scheduled
    before the wait (the values are undefined until it)."""
    per = min(columns, 32)
    lines, k = [], 0
    for c in range(columns // per):
        outs = ", ".join(f"{{$w{k + i}}}" for i in range(per))
        lines.append(f"tcgen05.ld.sync.aligned.32x32b.x{per}.b32 {{{outs}}}, [{{$r{c}}}];")
        k += per
    lines.append("tcgen05.wait::ld.sync.aligned;")
    addrs = [taddr + Uint32(per * c) for c in range(columns // per)]
    return list(inline_ptx("\n".join(lines), write_only_types=[Float32] * columns, read_only_args=addrs))


def tmem_store8(taddr: Uint32, words: list[Uint32]) -> None:
    """8 consecutive columns of this thread's lane (tcgen05.st.32x32b.x8): 32 E4M3 bytes."""
    ins = ", ".join(f"{{$r{i + 1}}}" for i in range(8))
    inline_ptx(f"tcgen05.st.sync.aligned.32x32b.x8.b32 [{{$r0}}], {{{ins}}};", read_only_args=[taddr, *words])


def tmem_wait_store() -> None:
    inline_ptx("tcgen05.wait::st.sync.aligned;")


def tmem_fence_before_sync() -> None:
    """Orders this thread's completed tcgen05 loads / stores before a following arrive or barrier."""
    inline_ptx("tcgen05.fence::before_thread_sync;")


def tmem_fence_after_sync() -> None:
    """Orders a preceding wait or barrier before this thread's following tcgen05 operations."""
    inline_ptx("tcgen05.fence::after_thread_sync;")


def fence_proxy_async_shared() -> None:
    """Makes this thread's generic shared-memory stores visible to the async proxy (tcgen05.cp, the MMA's
    shared-memory operands, bulk copies out of shared memory)."""
    inline_ptx("fence.proxy.async.shared::cta;")


def named_barrier(barrier_id, threads: int) -> None:
    """bar.sync on named barrier `barrier_id` (an int or a run-time Int32) of `threads` threads."""
    inline_ptx(f"bar.sync {{$r0}}, {threads};", read_only_args=[Int32(barrier_id)])


# ------------------------------------------------------------------------------------------ bulk copies


def bulk_load(dst_smem: Int32, src: Int64, nbytes: int, mbar_smem: Int32) -> None:
    """cp.async.bulk of nbytes (a multiple of 16, both addresses 16-byte aligned) global -> shared, completing
    nbytes of transactions on the mbarrier (the caller expects them)."""
    inline_ptx(
        f"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{{$r0}}], [{{$r1}}], {nbytes}, [{{$r2}}];",
        read_only_args=[dst_smem, src, mbar_smem],
    )


def bulk_reduce_add(dst: Int64, src_smem: Int32, nbytes: int, dtype: str, pred: Boolean) -> None:
    """dst[0 : nbytes] += src (cp.reduce.async.bulk .add, float32 or float16 elements) when pred; committed as
    one bulk group."""
    kind = "add.f32" if dtype == "float32" else "add.noftz.f16"
    inline_ptx(
        "{\n.reg .pred p;\nsetp.ne.u32 p, {$r2}, 0;\n"
        f"@p cp.reduce.async.bulk.global.shared::cta.bulk_group.{kind} [{{$r0}}], [{{$r1}}], {nbytes};\n"
        "cp.async.bulk.commit_group;\n}",
        read_only_args=[dst, src_smem, Uint32(pred)],
    )


def bulk_wait_read(pending: int) -> None:
    """Waits until at most `pending` of this thread's bulk groups still read their shared-memory source."""
    inline_ptx(f"cp.async.bulk.wait_group.read {pending};")


def bulk_wait_all() -> None:
    """Waits until this thread's bulk groups are complete (their global writes performed)."""
    inline_ptx("cp.async.bulk.wait_group 0;")


# ---------------------------------------------------------------------------------- shared / global memory


def st_shared_v4(addr: Int32, words) -> None:
    inline_ptx("st.shared.v4.b32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};", read_only_args=[addr, *words])


def st_shared_u16(addr: Int32, value: Uint32) -> None:
    inline_ptx("st.shared.u16 [{$r0}], {$r1};", read_only_args=[addr, value])


def ld_shared_v4_f32(addr: Int32) -> list[Float32]:
    code = "ld.shared.v4.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];"
    return list(inline_ptx(code, write_only_types=[Float32] * 4, read_only_args=[addr]))


def ld_global_f32(addr: Int64, pred: Boolean, other: float) -> Float32:
    """The float32 at addr when pred, else `other` (no access)."""
    bits = Uint32(struct.unpack("<I", struct.pack("<f", other))[0])
    return inline_ptx(
        "{\n.reg .pred p;\nsetp.ne.u32 p, {$r1}, 0;\nmov.b32 {$w0}, {$r2};\n@p ld.global.f32 {$w0}, [{$r0}];\n}",
        write_only_types=[Float32],
        read_only_args=[addr, Uint32(pred), bits],
    )


def ld_global_i32(addr: Int64) -> Int32:
    return inline_ptx("ld.global.nc.b32 {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[addr])


def ld_global_i32_pred(addr: Int64, pred: Boolean, other: int) -> Int32:
    """The int32 at addr when pred, else `other` (no access)."""
    return inline_ptx(
        "{\n.reg .pred p;\nsetp.ne.u32 p, {$r1}, 0;\nmov.b32 {$w0}, {$r2};\n@p ld.global.nc.b32 {$w0}, [{$r0}];\n}",
        write_only_types=[Int32],
        read_only_args=[addr, Uint32(pred), Int32(other)],
    )


def ballot(pred: Boolean) -> Uint32:
    """The warp's lanes whose pred is true, as a bit mask (vote.sync.ballot)."""
    return inline_ptx(
        "{\n.reg .pred p;\nsetp.ne.u32 p, {$r0}, 0;\nvote.sync.ballot.b32 {$w0}, p, 0xffffffff;\n}",
        write_only_types=[Uint32],
        read_only_args=[Uint32(pred)],
    )


def popc(x: Uint32) -> Int32:
    return inline_ptx("popc.b32 {$w0}, {$r0};", write_only_types=[Int32], read_only_args=[x])


# ------------------------------------------------------------------------------------------ float32 math


def mul_rn(a: Float32, b: Float32) -> Float32:
    """a * b rounded once (mul.rn: never contracted into a fused multiply-add)."""
    return inline_ptx("mul.rn.f32 {$w0}, {$r0}, {$r1};", write_only_types=[Float32], read_only_args=[a, b])


def sub_rn(a: Float32, b: Float32) -> Float32:
    """a - b rounded once (sub.rn: never contracted)."""
    return inline_ptx("sub.rn.f32 {$w0}, {$r0}, {$r1};", write_only_types=[Float32], read_only_args=[a, b])


def exp2_min0(x: Float32) -> Float32:
    """2^min(x, 0) with NaN kept (min.NaN: a NaN logit stays NaN), ex2.approx.f32 without flushing
    subnormal results."""
    return inline_ptx(
        "{\n.reg .f32 t;\nmin.NaN.f32 t, {$r0}, 0f00000000;\nex2.approx.f32 {$w0}, t;\n}",
        write_only_types=[Float32],
        read_only_args=[x],
    )


def select_f32(pred: Boolean, a: Float32, b: Float32) -> Float32:
    """pred ? a : b."""
    return inline_ptx(
        "{\n.reg .pred p;\nsetp.ne.u32 p, {$r0}, 0;\nselp.f32 {$w0}, {$r1}, {$r2}, p;\n}",
        write_only_types=[Float32],
        read_only_args=[Uint32(pred), a, b],
    )


# ------------------------------------------------------------------------- deterministic dQ semaphore


def sem_wait(addr: Int64, value: Int32) -> None:
    """Spins until the int32 at addr equals value (ld.acquire.gpu: the writes the releasing CTA performed
    before its release are visible afterwards)."""
    inline_ptx(
        "{\n.reg .pred p;\n.reg .b32 v;\nSEM_SPIN:\nld.acquire.gpu.global.b32 v, [{$r0}];\n"
        "setp.ne.s32 p, v, {$r1};\n@p bra SEM_SPIN;\n}",
        read_only_args=[addr, value],
    )


def sem_release(addr: Int64) -> None:
    """The int32 at addr += 1, release semantics at GPU scope."""
    inline_ptx("red.release.gpu.global.add.s32 [{$r0}], 1;", read_only_args=[addr])


def fence_acq_rel_gpu() -> None:
    inline_ptx("fence.acq_rel.gpu;")
