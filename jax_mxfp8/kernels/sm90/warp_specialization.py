"""Warp-specialization set-up for Hopper (sm_90a) kernels: TMA pipelines, registers.

For every FA3-style sm_90a kernel with one producer warpgroup (a single warp issues TMA loads into a
shared-memory ring) and consumer warpgroups (wgmma + CUDA-core math): attention forward and backward, the
MX GEMM. Provides:
  make_tma_pipeline    the mbarrier ring between the TMA producer thread and the consumer warps
  ring_state           the pipeline state of an absolute ring position (for loops that count positions)
  PRODUCER_REGISTERS, CONSUMER_REGISTERS, check_register_budget: setmaxnreg reallocation
"""

from __future__ import annotations

import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

WARPGROUP_THREADS = 128
WARPGROUP_WARPS = 4
PRODUCER_REGISTERS = 24
"""setmaxnreg of the producer warpgroup: its one TMA warp needs only addresses and a loop counter."""
CONSUMER_REGISTERS = 240
"""setmaxnreg of each consumer warpgroup: accumulators and softmax state (the register file allows
128 * (24 + 2 * 240) = 64512 <= 65536 for one producer and two consumers)."""
REGISTER_FILE = 65536  # 32-bit registers per SM (one CTA per SM)


def check_register_budget(
    num_consumers: int, producer: int = PRODUCER_REGISTERS, consumer: int = CONSUMER_REGISTERS
) -> None:
    """Trace-time check that one producer warpgroup (`producer` registers per thread) and num_consumers
    consumer warpgroups (`consumer` each) fit the register file."""
    total = WARPGROUP_THREADS * (producer + num_consumers * consumer)
    assert total <= REGISTER_FILE, f"setmaxnreg budget {total} > {REGISTER_FILE} registers"


def make_tma_pipeline(
    barrier_storage, num_stages: int, consumer_warps: int, tx_count: int, cluster_m: int = 1
) -> pipeline.PipelineTmaAsync:
    """A ring of num_stages shared-memory stages filled by TMA (one producer thread; tx_count bytes per
    stage) and released by consumer_warps warps (one elected thread per warp arrives on the empty barrier).

    cluster_m > 1: a cluster of cluster_m CTAs along M whose stages are filled partly by multicast from the
    others (the MX GEMM's B tile): each consumer warp arrives on the empty barrier of every CTA of the
    cluster, so a producer refills a stage only once all cluster_m CTAs have released it.
    barrier_storage: shared memory for 2 * num_stages mbarriers (Int64). defer_sync: the caller issues
    cute.arch.mbarrier_init_fence() and a CTA (cluster) barrier once after creating all its pipelines.
    """
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barrier_storage,
        num_stages=num_stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps * cluster_m),
        tx_count=tx_count,
        cta_layout_vmnk=cute.make_layout((1, cluster_m, 1, 1)) if cluster_m > 1 else None,
        defer_sync=True,
    )


def ring_state(num_stages: int, pos: Int32) -> pipeline.PipelineState:
    """Consumer state of absolute ring position pos (count, stage pos % num_stages, phase of its lap), so
    that a loop can address any position (e.g. K_j at 2j and V_j at 2j + 1) without carrying a state."""
    return pipeline.PipelineState(num_stages, pos, pos % num_stages, (pos // num_stages) % 2)
