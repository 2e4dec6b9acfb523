"""Row-wise tensor-memory access and the synchronization around it, for Blackwell kernels whose threads own
one TMEM lane each (sm_100f; traced inside CuTe DSL kernels). Used by the attention kernels' softmax,
correction and epilogue warps (forward and backward).

  lane_addr(tmem_base, quarter, col)   the TMEM address of column col of lane quarter `quarter`: a warp
                                       reaches only lanes 32 (warp % 4) .. + 31 (its lane quarter)
  lane_base(tmem_base, warp)           lane_addr of column 0 of this warp's quarter
  load_cols(taddr, n, dtype)           n 32-bit values (8, 16 or a multiple of 32; Uint32 bit patterns or
                                       Float32) of this thread's lane from columns taddr .. taddr + n - 1:
                                       tcgen05.ld.32x32b per 32 columns, then tcgen05.wait::ld, in ONE asm
                                       statement (so that no use of a result can be scheduled before the wait)
  store_cols(taddr, words)             tcgen05.st.32x32b.x{8,16,32} of the words (no wait: wait_st)
  wait_st(), fence_before_sync(), fence_after_sync()   tcgen05.wait::st and the tcgen05 thread-sync fences
  Mbarrier                             one mbarrier of a MemRange: init, arrive, wait(phase), commit (the MMA
                                       warp's tcgen05.commit: arrives when its prior MMAs and copies complete)
  fence_async_shared()                 fence.proxy.async.shared::cta (generic-proxy shared stores -> TMA,
                                       tcgen05.cp)

Ordering rules these implement (PTX ISA "tcgen05 memory consistency"): a thread's TMEM loads / stores are
complete after wait::ld / wait::st; before signalling another thread that reads or overwrites those columns it
issues tcgen05.fence::before_thread_sync, and the waiting side issues tcgen05.fence::after_thread_sync before
its own tcgen05 operations (the MMA warp after its mbarrier waits). Never run on hardware.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Uint32
from cutlass.cute.arch import inline_ptx
from cutlass.cute.nvgpu import tcgen05

LANES_PER_WARP = 32


def lane_addr(tmem_base: Uint32, quarter, column=0) -> Uint32:
    """TMEM address (lane << 16 | column) of `column`, lane 32 quarter (TMEM lane quarter 0..3)."""
    return tmem_base + (Uint32(quarter * LANES_PER_WARP) << Uint32(16)) + Uint32(column)


def lane_base(tmem_base: Uint32, warp: Int32) -> Uint32:
    """lane_addr of column 0 for warp `warp`: its lane quarter is warp % 4."""
    return lane_addr(tmem_base, warp % 4)


def load_cols(taddr: Uint32, n: int, dtype=Uint32) -> list:
    """This thread's lane, columns taddr .. taddr + n - 1 (n = 8, 16 or a multiple of 32), loaded and waited
    for, as n values of dtype (Uint32 bit patterns or Float32)."""
    per = min(n, 32)
    assert n % per == 0 and per in (8, 16, 32)
    lines, k = [], 0
    for c in range(n // per):
        outs = ", ".join(f"{{$w{k + i}}}" for i in range(per))
        lines.append(f"tcgen05.ld.sync.aligned.32x32b.x{per}.b32 {{{outs}}}, [{{$r{c}}}];")
        k += per
    lines.append("tcgen05.wait::ld.sync.aligned;")
    addrs = [taddr + Uint32(per * c) for c in range(n // per)]
    return list(inline_ptx("\n".join(lines), write_only_types=[dtype] * n, read_only_args=addrs))


def store_cols(taddr: Uint32, words: list[Uint32]) -> None:
    """tcgen05.st of len(words) (8, 16 or 32) 32-bit words of this thread's lane from column taddr on."""
    n = len(words)
    assert n in (8, 16, 32)
    ins = ", ".join(f"{{$r{i + 1}}}" for i in range(n))
    inline_ptx(f"tcgen05.st.sync.aligned.32x32b.x{n}.b32 [{{$r0}}], {{{ins}}};", read_only_args=[taddr, *words])


def wait_st() -> None:
    inline_ptx("tcgen05.wait::st.sync.aligned;")


def fence_before_sync() -> None:
    """Orders this thread's completed tcgen05 operations before its next barrier arrive / mbarrier arrive."""
    inline_ptx("tcgen05.fence::before_thread_sync;")


def fence_after_sync() -> None:
    """Orders this thread's later tcgen05 operations after its last barrier / mbarrier wait."""
    inline_ptx("tcgen05.fence::after_thread_sync;")


def fence_async_shared() -> None:
    """Makes this thread's generic-proxy shared-memory stores visible to the async proxy (TMA stores,
    tcgen05.cp) once ordered by a later barrier."""
    inline_ptx("fence.proxy.async.shared::cta;")


class Mbarrier:
    """mbarrier `index` of a shared-memory MemRange[Int64, n] (ptr = the range's data_ptr())."""

    def __init__(self, base_ptr, index: int):
        self.ptr = base_ptr + index

    def init(self, count: int) -> None:
        """One thread of the CTA, before the CTA-wide sync that publishes it (mbarrier_init_fence)."""
        cute.arch.mbarrier_init(self.ptr, count)

    def arrive(self) -> None:
        cute.arch.mbarrier_arrive(self.ptr)

    def wait(self, phase) -> None:
        cute.arch.mbarrier_wait(self.ptr, phase)

    def commit(self) -> None:
        """tcgen05.commit (one thread of the MMA warp): arrives once every tcgen05.mma / tcgen05.cp this thread
        issued before completes."""
        with cute.arch.elect_one():
            tcgen05.commit(self.ptr, None, tcgen05.CtaGroup.ONE)
