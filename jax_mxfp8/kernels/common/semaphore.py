"""Global-memory semaphores for ordered work across CTAs (any CuTe DSL kernel, sm_70+ PTX; traced inline).

The attention backwards' deterministic dQ mode (kernels/sm90/attention_bwd_dq.py, kernels/sm100/
attention_bwd_dq.py) orders the key tiles' adds into a query tile with one int32 counter per tile: the
adding CTA waits until the counter equals its key tile's index, adds, makes its writes visible and
increments the counter.

  sem_wait(addr, value)   spin until the int32 at addr equals value (ld.acquire.gpu: what the releasing
                          CTA wrote before its release is visible after)
  sem_release_add(addr)   the int32 at addr += 1 with release semantics at GPU scope (red.release.gpu)
  fence_acq_rel_gpu()     fence.acq_rel.gpu: orders this thread's writes before a later release by another
                          thread of its CTA (after a barrier)
"""

from __future__ import annotations

from cutlass import Int32, Int64
from cutlass.cute.arch import inline_ptx


def sem_wait(addr: Int64, value: Int32) -> None:
    """Spins until the int32 at global address addr equals value (ld.acquire.gpu: what the releasing
    thread's CTA wrote before its release is visible after)."""
    inline_ptx(
        "{ .reg .pred p; .reg .b32 v; SEM_WAIT: ld.acquire.gpu.global.b32 v, [{$r0}];"
        " setp.ne.s32 p, v, {$r1}; @p bra SEM_WAIT; }",
        read_only_args=[addr, value],
    )


def sem_release_add(addr: Int64) -> None:
    """The int32 at global address addr += 1 with release semantics at GPU scope."""
    inline_ptx("red.release.gpu.global.add.s32 [{$r0}], 1;", read_only_args=[addr])


def fence_acq_rel_gpu() -> None:
    inline_ptx("fence.acq_rel.gpu;")
