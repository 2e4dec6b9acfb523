"""PTX building blocks of the Blackwell attention backward's warp roles (sm_100f) that the forward does not
use, called while a CuTe DSL kernel is traced: named barriers with a run-time id, bulk copies and bulk
reduce-adds, and predicated global loads. The blocks both kernels use are shared: TMEM rows and fences
(tmem_rows.py), float32 arithmetic (float32_ops.py), shared-memory stores and loads (kernels/common/ptx.py),
the dQ semaphore (kernels/common/semaphore.py).
"""

from __future__ import annotations

import struct

from cutlass import Boolean, Float32, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx


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


# -------------------------------------------------------------------------------------- global memory


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
