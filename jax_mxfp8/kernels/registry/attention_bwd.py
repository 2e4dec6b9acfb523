"""Hopper attention backward variants (kernels/sm90/attention_bwd.py), sm_90a only (wgmma).

The FFI calls are `jax_mxfp8_attention_bwd` (bfloat16 operands holding the contract's MX values exactly) and,
for the sdp_fp8 variants (production), `jax_mxfp8_attention_bwd_fp8` with FP8 copies of Q, K, V, dO as well;
operands in docs/interfaces.md and csrc/attention_bwd.cc. Registered: production per head_dim x causal, two
comparison schedules (tune > 0, built with `tools/build_library.py --with-tunes`), and the feature variants (dQ
modes, broadcast_q, p_scale "block", packed). The measurements behind each choice, and the schedules no longer
built, are in docs/perf/removed-variants.md.
"""

from __future__ import annotations

import dataclasses

from jax_mxfp8.kernels.registry.base import P_SCALE_CODE, P_SCALES, ROUNDING_CODE, SCALE_ROUNDINGS, KernelConfig

DQ_ACCUMS = ("fp32", "fp16")
DQ_ACCUM_CODE = {"fp32": 0, "fp16": 1}
DQ_STORES = ("red", "tma_warp", "tma_writer")


@dataclasses.dataclass(frozen=True)
class AttentionBwdConfig(KernelConfig):
    """MXFP8 attention backward (kernels/sm90/attention_bwd.py): one variant per head_dim x causal x feature.

    Key fields (what the call asks for):
      head_dim: 64 or 128.  causal: top-left causal masking (query i sees keys j <= i).
      p_scale: dV's P operand: "const" (E4M3(P 2^8) 2^-8) or "block" (one E8M0 scale per 32 queries of each
        key, dV's contracting axis; needs p_scaled=False, dq_accum "fp32", not deterministic, no broadcast_q).
      p_rounding: the scale rule of p_scale "block" ("up" for "const").
      dq_accum: "fp32" (float32 adds into a zero-filled float32 dq) or "fp16" (a float16 dq holding dQ 2^e,
        e the call's dq_scale_log2; kernels/sm90/attention_bwd_dq.py).
      deterministic: dQ's adds of the KV tiles in ascending tile order (the dq_sem semaphore operand): dq
        bit-identical across runs; False: the atomics' order.
      packed: packed jagged sequences in one batch row of the aligned packed layout (seqs / work tables of
        kernels/sm90/tile_scheduler.py, as the forward's); dq_accum "fp32", not deterministic, no broadcast_q,
        no dv_f16 (dv_f16's dO shift per KV head would span every sequence).
      broadcast_q: one query sequence for every batch row (q and dq of batch 1, every row's dQ added into it);
        not with the dQ modes (their float16 dq and ordering are per batch row).
    Schedule fields (how; the same sums unless said):
      q_stage: Q / dO tiles (64 query rows each) in flight in shared memory.
      dq_store: how a query tile's float32 dQ reaches dq: "red" (red.global.add from the registers),
        "tma_warp" (staged in a 128-byte-swizzled shared tile, one TMA tensor reduce-add per warp of its 16
        rows) or "tma_writer" ("tma_warp"'s staging; warp 1 of the producer warpgroup issues every box).
        The dQ modes take "red"; broadcast_q takes "red" (its per-CTA rebase of dq's address cannot move a
        TMA tensor map's coordinates).
      dq_red_width: "red": floats per red.global.add (1: .f32, 2: .v2.f32 of a thread's two adjacent columns).
      smem_stats: the producer copies each tile's 64 LSE and 64 delta values into the Q / dO stage
        (cp.async.bulk), read from shared memory where used (False: 32 global loads per thread and tile).
      stats_early: smem_stats only: the LSE shared-memory loads issued before the S^T wait.
      amax_reduce: the dS square block's warp amax: "shfl" (5 shfl.sync.bfly + max) or "redux" (one
        redux.sync.max.u32 on the bits of |x|).
      dq_first: dQ's wgmma issued before dK's, its store running while dK's wgmma is in flight.
      sdp_fp8: S^T = K Q^T and dP^T = V dO^T on FP8 wgmma from FP8 copies re-encoded to one exponent per 32
        rows (primitives/attention_operands.py aligned_rows), accumulators times the row factors (operands q8,
        k8, v8, do8, qs, ks, vs, dos); dV, dK, dQ stay on BF16 wgmma. Not with the dQ modes or broadcast_q.
      dk_ss: dK += dSq^T Q reads dSq^T from the dS tile in shared memory (SS wgmma) instead of registers.
      p_scaled: P computed as 2^8 P by the exponent (the 2^-8 rides on dQ's and dK's tau and dV's epilogue),
        so Pq needs no multiplies; ex2(x + 8) moves P by an ulp or so (dk, dv not bit-equal without it).
      dv_f16: dV on float16 wgmma: Pq's E4M3 values to the A fragment by one cvt per pair, and the do operand
        float16 holding dO 2^-shift, one power of two per (batch, KV head) (attention_operands.do_shift); dv
        comes out times 2^-shift. Needs sdp_fp8 and p_scaled.
      factors_ahead: sdp_fp8's query-block factors (qs, dos) loaded one loop step before their tile.
      tune: 0 for production and the feature variants; > 0 for the comparison schedules (benchmarks only).
    """

    op = "attention_bwd"
    kernels = {"sm_90a": "jax_mxfp8.kernels.sm90.attention_bwd:make_kernel"}  # wgmma: Hopper only
    key_fields = ("head_dim", "causal", "p_scale", "p_rounding", "dq_accum", "deterministic", "packed", "broadcast_q")
    codes = {"p_scale": P_SCALE_CODE, "p_rounding": ROUNDING_CODE, "dq_accum": DQ_ACCUM_CODE}
    # in the kernel table: the handler checks an sdp_fp8 variant's FP8 operands and a dv_f16 one's float16 do
    table_fields = ("sdp_fp8", "dv_f16")

    head_dim: int = 128
    causal: bool = False
    p_scale: str = "const"
    p_rounding: str = "up"
    dq_accum: str = "fp32"
    deterministic: bool = False
    packed: bool = False
    q_stage: int = 2
    dq_store: str = "red"
    smem_stats: bool = False
    amax_reduce: str = "shfl"
    stats_early: bool = False
    dq_first: bool = False
    dq_red_width: int = 1
    broadcast_q: bool = False
    sdp_fp8: bool = False
    dk_ss: bool = False
    p_scaled: bool = False
    dv_f16: bool = False
    factors_ahead: bool = False
    tune: int = 0

    def __post_init__(self):
        for field in ("deterministic", "packed", "broadcast_q", "smem_stats", "stats_early", "dq_first", "sdp_fp8",
                      "dk_ss", "p_scaled", "dv_f16", "factors_ahead"):  # fmt: skip
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"{field}={getattr(self, field)!r} is not a bool")
        for field, allowed in (("head_dim", (64, 128)), ("p_scale", P_SCALES), ("p_rounding", SCALE_ROUNDINGS),
                               ("dq_accum", DQ_ACCUMS), ("dq_store", DQ_STORES), ("amax_reduce", ("shfl", "redux")),
                               ("dq_red_width", (1, 2)), ("q_stage", (1, 2, 3, 4))):  # fmt: skip
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field}={getattr(self, field)!r} not in {allowed}")
        if self.p_scale == "const" and self.p_rounding != "up":
            raise ValueError("p_rounding only applies to p_scale='block' (leave it 'up' for 'const')")
        if self.p_scale == "block" and (self.p_scaled or self.dq_mode or self.broadcast_q):
            raise ValueError(
                "p_scale='block' needs p_scaled=False (its block scales come from P itself), dq_accum='fp32', "
                "deterministic=False and broadcast_q=False"
            )
        if (self.dq_mode or self.broadcast_q) and self.dq_store != "red":
            raise ValueError(
                f"the dQ modes and broadcast_q take dq_store='red' (per-element adds; got {self.dq_store!r})"
            )
        if self.packed and (self.dq_mode or self.broadcast_q or self.dv_f16):
            raise ValueError(
                "packed=True needs dq_accum='fp32', deterministic=False, broadcast_q=False and dv_f16=False (one "
                "dO shift per KV head would span every sequence)"
            )
        if self.broadcast_q and self.dq_mode:
            raise ValueError(
                "broadcast_q=True sums dQ over the batch rows with float32 atomics: not with dq_accum='fp16' or "
                "deterministic=True (broadcast_query_attention's backward takes the XLA reference for those)"
            )
        if self.stats_early and not self.smem_stats:
            raise ValueError("stats_early=True needs smem_stats=True")
        if self.dq_red_width != 1 and self.dq_store != "red":
            raise ValueError(f"dq_red_width={self.dq_red_width} needs dq_store='red'")
        if self.sdp_fp8 and (self.dq_mode or self.broadcast_q):
            raise ValueError("sdp_fp8=True needs dq_accum='fp32', deterministic=False, broadcast_q=False")
        if self.p_scaled and self.dq_mode:
            raise ValueError("p_scaled=True needs dq_accum='fp32', deterministic=False (the dQ modes scale dq apart)")
        if self.dv_f16 and not (self.sdp_fp8 and self.p_scaled):
            raise ValueError("dv_f16=True needs sdp_fp8=True and p_scaled=True (dV alone reads the do operand)")
        if self.factors_ahead and not self.sdp_fp8:
            raise ValueError("factors_ahead=True needs sdp_fp8=True")

    @property
    def dq_mode(self) -> bool:
        """True for the dQ paths of kernels/sm90/attention_bwd_dq.py (float16 dq or the ordered adds): the
        kernel then takes the dq_sem operand and the dq scale tau 2^e as well."""
        return self.dq_accum != "fp32" or self.deterministic

    @property
    def name(self) -> str:
        base = f"attention_bwd_h{self.head_dim}{'_causal' if self.causal else ''}"
        base += ("_fp16" if self.dq_accum == "fp16" else "") + ("_det" if self.deterministic else "")
        if self.broadcast_q:
            base += "_bcastq"
        if self.p_scale == "block":
            base += "_pblock" + ("_floor" if self.p_rounding == "floor" else "")
        if self.packed:
            base += "_packed"
        return f"{base}_t{self.tune}" if self.tune else base


# Schedules (docs/perf/removed-variants.md has the measurements; the tune numbers are those of the results).
_STATS = dict(smem_stats=True, amax_reduce="redux", stats_early=True)
BF16_SCHEDULE = dict(_STATS, dq_store="tma_warp", dq_first=True)
"""Every GEMM on BF16 wgmma: production's dQ store (a TMA reduce-add per warp, under the dK wgmma) and stats path
without the FP8 S^T / dP^T, dK from shared memory, P in 2^8 units or dv_f16. Comparison tune 17; the dQ modes'
GEMM precision (their dk, dv equal its bit for bit)."""
_FP8_SCHEDULE = dict(BF16_SCHEDULE, sdp_fp8=True, dk_ss=True)
PREVIOUS: dict[int, dict] = {
    128: dict(_FP8_SCHEDULE, p_scaled=True, dq_store="tma_writer"),
    64: dict(_FP8_SCHEDULE, p_scaled=True),  # the dQ writer warp measured 0.5% slower at H64
}
"""Production without dv_f16 (and at H128 without factors_ahead): comparison tune 25 (H128) / 24 (H64), and the
packed variants' schedule (dk, dv bit-equal to production's where dO's blocks fit float16)."""
PRODUCTION: dict[int, dict] = {
    128: dict(PREVIOUS[128], dv_f16=True, factors_ahead=True),
    64: dict(PREVIOUS[64], dv_f16=True),  # factors_ahead measured 4-5% slower at H64
}
"""Tune 0 per head_dim."""
COMPARISONS: dict[int, dict[int, dict]] = {
    128: {17: BF16_SCHEDULE, 25: PREVIOUS[128]},
    64: {17: BF16_SCHEDULE, 24: PREVIOUS[64]},
}
"""head_dim -> {tune: fields}: the two comparison schedules benchmarks/attention_bwd_kernel.py times against
production (what the FP8 S^T / dP^T and dK-from-smem steps bought; what dv_f16 and factors_ahead bought)."""

# The feature variants keep the schedules they were measured and tested on: production's cannot take them
# (the dQ modes and broadcast_q need per-element dQ adds and BF16 S^T / dP^T, p_scale "block" needs P in its
# own units, packed cannot take dv_f16), and a schedule change would make a kernel no measurement covers.
DQ_MODES: tuple[dict, ...] = (
    dict(dq_accum="fp16"),
    dict(deterministic=True),
    dict(dq_accum="fp16", deterministic=True),
)
"""dq_accum "fp16", deterministic "fp32" and "fp16", on the plain schedule (dq_store "red", LSE and delta from
global memory, shuffle amax)."""
BROADCAST_Q: dict[int, dict] = {128: dict(_STATS, dq_store="red", dq_red_width=2), 64: dict(dq_store="red")}
"""broadcast_q: per-element dQ reductions, red.global.add.v2 with the smem stats at H128, the plain schedule at
H64 (the productions before the TMA dQ stores)."""
BLOCK_P: dict[int, dict] = {128: dict(_FP8_SCHEDULE), 64: dict(_FP8_SCHEDULE)}
"""p_scale "block" (rule "up": the forward kernel takes only that rule): production's schedule without p_scaled
(whose 2^8 P units would move the block scales of P blocks below 2^-117) and so without dv_f16 or the dQ writer."""
PACKED: dict[int, dict] = PREVIOUS
"""packed (varlen_attention's backward, p_scale "const"): the PREVIOUS schedule (no dv_f16)."""


def comparison_fields(tune: int, head_dim: int) -> dict | None:
    """The config fields of schedule `tune` at head_dim (0: PRODUCTION), None where it is not registered."""
    return dict(PRODUCTION[head_dim]) if tune == 0 else COMPARISONS[head_dim].get(tune)


ATTENTION_BWD_VARIANTS: tuple[AttentionBwdConfig, ...] = (
    tuple(
        AttentionBwdConfig(head_dim=h, causal=c, tune=tune, **comparison_fields(tune, h))
        for h in (128, 64)
        for c in (False, True)
        for tune in (0, *COMPARISONS[h])
    )
    + tuple(
        AttentionBwdConfig(head_dim=h, causal=c, dq_store="red", **mode)
        for h in (128, 64)
        for c in (False, True)
        for mode in DQ_MODES
    )
    + tuple(
        AttentionBwdConfig(head_dim=h, causal=c, broadcast_q=True, **BROADCAST_Q[h])
        for h in (128, 64)
        for c in (False, True)
    )
    + tuple(
        AttentionBwdConfig(head_dim=h, causal=c, p_scale="block", **BLOCK_P[h])
        for h in (128, 64)
        for c in (False, True)
    )
    + tuple(
        AttentionBwdConfig(head_dim=h, causal=c, packed=True, **PACKED[h]) for h in (128, 64) for c in (False, True)
    )
)
