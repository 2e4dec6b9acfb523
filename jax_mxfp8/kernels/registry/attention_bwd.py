"""Hopper attention backward variants (kernels/sm90/attention_bwd.py), sm_90a only (wgmma).

The FFI call is `jax_mxfp8_attention_bwd` (csrc/attention_bwd.cc; /work/coord/ATTN_BWD_INTERFACE.md): dense
padded batches, operands in bfloat16 holding the contract's MX values exactly. Only tested variants are
registered (ATTENTION_BWD_VARIANTS).
"""

from __future__ import annotations

import dataclasses

from jax_mxfp8.kernels.registry.base import P_SCALE_CODE, P_SCALES, ROUNDING_CODE, SCALE_ROUNDINGS, KernelConfig

DQ_ACCUMS = ("fp32",)
DQ_ACCUM_CODE = {"fp32": 0, "fp16": 1}


@dataclasses.dataclass(frozen=True)
class AttentionBwdConfig(KernelConfig):
    """MXFP8 attention backward (kernels/sm90/attention_bwd.py): one variant per head_dim x causal.

    Attributes:
      head_dim: 64 or 128.
      causal: top-left causal masking (query i sees keys j <= i).
      p_scale: the contract's AttentionConfig.p_scale for dV's P operand; only "const" (E4M3(P 2^8) 2^-8)
        is implemented.
      p_rounding: the P scale rule for p_scale="block" (unused for "const": must be "up").
      dq_accum: dQ accumulation across KV tiles: "fp32" (float32 atomics into a zero-filled dq).
      deterministic: dQ accumulated in a fixed order (not implemented: False).
      packed: packed jagged sequences (not implemented: False).
      q_stage: Q / dO tiles (64 query rows each) in flight in shared memory.
      dq_store: how each query tile's dQ partial reaches dq: "red" (one red.global.add.f32 per element
        from the registers) or "bulk" (staged in shared memory, then cp.reduce.async.bulk .add.f32 of
        whole rows: 256-byte bulk reductions in L2 instead of scattered 4-byte ones).
      overlap: 0, or issue the next query tile's S^T (1) or S^T and dP^T (2) wgmmas between this tile's dQ
        staging and its bulk reductions (waited at the end of the step), so that the dQ store's barriers and
        reductions run while they occupy the tensor cores; with 1, dP^T is issued at the top of the step and
        runs during the P computation as in tune 0. ("bulk" only; with global stats the next tile's LSE /
        delta stay live across the store: H128 spills 232-256 bytes.)
      smem_stats: False: each consumer thread loads its 16 LSE and 16 delta values per query tile from
        global memory (32 LDG, live in registers from the tile's start); True: the producer copies the
        tile's 64 LSE and 64 delta values (cp.async.bulk, 2 x 256 bytes) into the Q / dO stage, and the
        consumers read them from shared memory right where they are used (fewer live registers).
      broadcast_q: one query sequence for every batch row (broadcast_query_attention): q holds batch 1 and
        the producer loads each query head's Q tiles at batch 0; dO, LSE, delta and dq stay per batch row
        (the caller sums dq over the batch).
      tune: 0 for the production variant; > 0 for alternatives built only for benchmarks.
    """

    op = "attention_bwd"
    kernels = {"sm_90a": "jax_mxfp8.kernels.sm90.attention_bwd:make_kernel"}  # wgmma: Hopper only
    key_fields = ("head_dim", "causal", "p_scale", "p_rounding", "dq_accum", "deterministic", "packed", "broadcast_q")
    codes = {"p_scale": P_SCALE_CODE, "p_rounding": ROUNDING_CODE, "dq_accum": DQ_ACCUM_CODE}

    head_dim: int = 128
    causal: bool = False
    p_scale: str = "const"
    p_rounding: str = "up"
    dq_accum: str = "fp32"
    deterministic: bool = False
    packed: bool = False
    q_stage: int = 2
    dq_store: str = "bulk"
    overlap: int = 0
    smem_stats: bool = False
    broadcast_q: bool = False
    tune: int = 0

    def __post_init__(self):
        if self.head_dim not in (64, 128):
            raise ValueError(f"head_dim={self.head_dim} not in (64, 128)")
        if self.p_scale not in P_SCALES:
            raise ValueError(f"p_scale={self.p_scale!r} not in {P_SCALES}")
        if self.p_scale != "const":
            raise ValueError("p_scale='block' is not implemented by the backward kernel (use 'const')")
        if self.p_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"p_rounding={self.p_rounding!r} not in {SCALE_ROUNDINGS}")
        if self.p_scale == "const" and self.p_rounding != "up":
            raise ValueError("p_rounding only applies to p_scale='block' (leave it 'up' for 'const')")
        if self.dq_accum not in DQ_ACCUMS:
            raise ValueError(f"dq_accum={self.dq_accum!r} not in {DQ_ACCUMS}")
        if self.deterministic:
            raise ValueError("deterministic=True is not implemented (dQ uses float32 atomics)")
        if self.packed:
            raise ValueError("packed=True is not implemented (dense padded batches only)")
        if self.dq_store not in ("red", "bulk"):
            raise ValueError(f"dq_store={self.dq_store!r} not in ('red', 'bulk')")
        if self.overlap not in (0, 1, 2):
            raise ValueError(f"overlap={self.overlap} not in (0, 1, 2)")
        if self.overlap and self.dq_store != "bulk":
            raise ValueError(f"overlap={self.overlap} needs dq_store='bulk' (got {self.dq_store!r})")
        if not isinstance(self.smem_stats, bool):
            raise ValueError(f"smem_stats={self.smem_stats!r} is not a bool")
        if not 1 <= self.q_stage <= 4:
            raise ValueError(f"q_stage={self.q_stage} not in [1, 4]")

    @property
    def name(self) -> str:
        base = f"attention_bwd_h{self.head_dim}{'_causal' if self.causal else ''}"
        if self.broadcast_q:
            base += "_bcastq"
        return f"{base}_t{self.tune}" if self.tune else base


# Registered: the variants the GPU tests cover (tests/test_attention_bwd_kernel_gpu.py, run on the H200).
# Production (tune 0): dq_store "bulk" (5.35 vs 6.10 ms for "red" at B4 T4k N16 H128, docs/perf-notes.md).
# Alternatives for benchmarks/attention_bwd_kernel.py (non-production; the GPU test checks each against the
# reference and against tune 0's outputs, dk and dv bit for bit):
#   tune 1: dq_store "red"
#   tune 2: overlap 1 (the next tile's S^T issued before this tile's dQ store)
#   tune 3: overlap 2 (S^T and dP^T)
#   tune 4: overlap 2 + smem_stats (LSE and delta with the Q / dO stage, read from shared memory)
#   tune 5: smem_stats alone (tune 0's schedule)
#   tune 6: overlap 1 + smem_stats
TUNINGS: tuple[tuple[int, dict], ...] = (
    (0, {}),
    (1, dict(dq_store="red")),
    (2, dict(overlap=1)),
    (3, dict(overlap=2)),
    (4, dict(overlap=2, smem_stats=True)),
    (5, dict(smem_stats=True)),
    (6, dict(overlap=1, smem_stats=True)),
)

# broadcast_q (broadcast_query_attention): the production schedule only.
ATTENTION_BWD_VARIANTS: tuple[AttentionBwdConfig, ...] = tuple(
    AttentionBwdConfig(head_dim=h, causal=c, tune=tune, **fields)
    for h in (128, 64)
    for c in (False, True)
    for tune, fields in TUNINGS
) + tuple(AttentionBwdConfig(head_dim=h, causal=c, broadcast_q=True) for h in (128, 64) for c in (False, True))
