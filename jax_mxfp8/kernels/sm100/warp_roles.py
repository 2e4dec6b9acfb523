"""Warp roles, pipelines, TMEM allocation and the persistent schedule of warp-specialized Blackwell kernels
(sm_100f, CuTe DSL). Traced inside @cute.jit / @cute.kernel.

One CTA (one per SM, persistent) = 6 warps:
  warps 0-3  EPILOGUE  read the accumulator from TMEM (warp w reaches lanes 32 w .. 32 w + 31, one row per
                       thread), convert / quantize, store; warp 0 also allocates and frees TMEM
  warp 4     MMA       one elected thread: tcgen05.cp of the scales, tcgen05.mma, tcgen05.commit
  warp 5     TMA       one elected thread: TMA loads of A, B and their scales into the shared-memory ring
With cta_group 2 a cluster of two CTAs shares each 256-row MMA tile: both CTAs' TMA warps load their halves,
the leader CTA's (rank 0) MMA warp issues the pair's MMAs (reading both CTAs' shared memory, writing both
CTAs' TMEM), both CTAs' epilogues drain their own 128 rows.

Pipelines (mbarrier rings in shared memory):
  ab   PipelineTmaUmma   TMA warp -> MMA warp: `stages` ring slots; the MMA warp releases a slot with
                         tcgen05.commit once the MMAs reading it complete (UTCBAR)
  acc  PipelineUmmaAsync MMA warp -> epilogue warps: `acc_stages` accumulator buffers in TMEM; the MMA
                         warp commits a finished tile, every epilogue thread (of both CTAs) releases it
The schedule (GemmTileScheduler, shared with the Hopper GEMM): work item t = (batch, 256- or 128-row MMA
tile, N tile), clusters take items c, c + clusters, ...; every role walks the same sequence.
Never run on a Blackwell GPU: compiled and checked statically (tools/check_sm100.py).
"""

from __future__ import annotations

import cutlass.pipeline as pipeline
from cutlass.memory import TmemAllocator

from jax_mxfp8.kernels.common.gemm_schedule import GemmTile, GemmTileScheduler

EPILOGUE_WARPS = (0, 1, 2, 3)
MMA_WARP = 4
TMA_WARP = 5
THREADS = 32 * (len(EPILOGUE_WARPS) + 2)
EPILOGUE_THREADS = 32 * len(EPILOGUE_WARPS)
EPILOGUE_BARRIER = 1
"""Named barrier of the epilogue warps (barrier 0 is __syncthreads)."""
TMEM_ALLOC_BARRIER = 2
"""Named barrier on which the MMA and epilogue warps wait for the TMEM allocation."""

__all__ = [
    "EPILOGUE_BARRIER",
    "EPILOGUE_THREADS",
    "EPILOGUE_WARPS",
    "MMA_WARP",
    "TMA_WARP",
    "THREADS",
    "GemmTile",
    "GemmTileScheduler",
    "make_ab_pipeline",
    "make_acc_pipeline",
    "make_tmem_allocator",
    "epilogue_barrier",
]


def make_ab_pipeline(barrier_storage, stages: int, tx_bytes: int, cluster_vmnk) -> pipeline.PipelineTmaUmma:
    """The shared-memory ring from the TMA warp to the MMA warp (2 * stages mbarriers at barrier_storage);
    tx_bytes per stage (the leader of a pair waits for both CTAs' bytes). Call pipeline_init_arrive /
    pipeline_init_wait around the set-up (defer_sync)."""
    return pipeline.PipelineTmaUmma.create(
        barrier_storage=barrier_storage,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
        tx_count=tx_bytes,
        cta_layout_vmnk=cluster_vmnk,
        defer_sync=True,
    )


def make_acc_pipeline(barrier_storage, acc_stages: int, cta_group: int, cluster_vmnk) -> pipeline.PipelineUmmaAsync:
    """The accumulator buffers from the MMA warp to the epilogue warps (2 * acc_stages mbarriers): released
    by every epilogue thread of the cluster (128 per CTA)."""
    return pipeline.PipelineUmmaAsync.create(
        barrier_storage=barrier_storage,
        num_stages=acc_stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, EPILOGUE_THREADS * cta_group),
        cta_layout_vmnk=cluster_vmnk,
        defer_sync=True,
    )


def make_tmem_allocator(holding_ptr, dealloc_mbar_ptr, cta_group: int) -> TmemAllocator:
    """TMEM allocation by epilogue warp 0 (cta_group 2: both CTAs of the pair, with the dealloc mbarrier);
    the MMA and epilogue warps read the base address after TMEM_ALLOC_BARRIER."""
    barrier = pipeline.NamedBarrier(barrier_id=TMEM_ALLOC_BARRIER, num_threads=32 * (1 + len(EPILOGUE_WARPS)))
    return TmemAllocator(
        holding_ptr,
        barrier_for_retrieve=barrier,
        allocator_warp_id=EPILOGUE_WARPS[0],
        is_two_cta=cta_group == 2,
        two_cta_tmem_dealloc_mbar_ptr=dealloc_mbar_ptr if cta_group == 2 else None,
    )


def epilogue_barrier() -> pipeline.NamedBarrier:
    """The named barrier of the epilogue warps (before TMEM is freed)."""
    return pipeline.NamedBarrier(barrier_id=EPILOGUE_BARRIER, num_threads=EPILOGUE_THREADS)
