"""A performance model of the Blackwell attention forward (kernels/sm100/attention_fwd.py). Pure Python:
predictions, not measurements -- no Blackwell GPU has run this kernel (docs/perf/blackwell-attention.md
section 6 explains every term; the GPU figures are kernels/sm100/perf_model.py's).

  predict_fwd(config, shape, gpu, softmax_instructions) -> AttentionPrediction

Per SM, per unit = one Q tile (128 rows) against one KV tile (128 keys), in SM clocks:
  t_mma   = 4 * 128 * 128 * H / FP8 FLOP per clock          both block-scaled GEMMs (S = Q K^T, O += P V)
  t_mufu  = 128 * (128 + 1) / MUFU.EX2 per clock            the exponentials (P~ and alpha)
  t_issue = softmax_instructions + CORRECTION_INSTRUCTIONS  one softmax warp's SASS per tile (counted in the
                                                             compiled cubin by tools/check_sm100_attention_fwd.py)
                                                             issues on each of the 4 SM sub-partitions, next
                                                             to a correction warp's rescale
  unit    = max(t_mma, t_mufu, t_issue) / EFFICIENCY[gpu]   the roles overlap; EFFICIENCY is calibrated on the
                                                             anchors (below)
The schedule is the kernel's: items of two Q tiles, static round robin over min(items, SMs) persistent CTAs in
the kernel's order (causal: longest first); an item costs 2 * n_kv units (both Q tiles visit the pair's KV
tiles; a causal pair's first tile visits one fully masked diagonal tile), the units whose KV tile needs the
mask at the masked path's instruction count. The busiest CTA sets the time.
FLOPs counted as usual: 4 T S H per (batch, head), half of it causal (on the valid rows and keys).
"""

from __future__ import annotations

import dataclasses

from jax_mxfp8.kernels.sm100.attention_fwd_config import ITEM_ROWS, TILE_M, TILE_N, AttentionFwdSm100Config
from jax_mxfp8.kernels.sm100.perf_model import B200, FP8_FLOP_PER_CLK_PER_SM, GB300, Gpu

MUFU_EX2_PER_CLK = {"B200": 16, "GB300": 32}
"""ASSUMED MUFU.EX2 throughput per SM per clock: FA4's figure for B200; GB300 (Blackwell Ultra) doubles the
SFU exponential rate (NVIDIA's Blackwell Ultra announcement; not measured here)."""
EFFICIENCY = {"B200": 0.72, "GB300": 0.57}
"""ASSUMED fraction of the balance bound a warp-specialized forward reaches, calibrated on the two anchors:
FlashAttention-4's BF16 forward on B200 (1613 TFLOP/s at MMA = MUFU = ~1030 clk per unit: 0.72 of 2.25
PFLOP/s) and LP-FA4's MXFP8 forward on GB300 (2.85 PFLOP/s at MMA 512 ~ MUFU 516: 0.57 of 5 PFLOP/s)."""
CORRECTION_INSTRUCTIONS = 0
"""ASSUMED issue slots the correction warps take from the softmax's sub-partitions per unit: 0 (its rescale,
~0.85 x (2 LDTM + 32 FMUL + 2 STTM) per 32 columns, fits the softmax warps' MUFU stalls; an upper bound would
add ~150 at H128)."""


@dataclasses.dataclass(frozen=True)
class AttentionPrediction:
    flops: float
    t_mma: float  # clocks per unit
    t_mufu: float
    t_issue: float
    clocks_busiest_cta: float  # the busiest CTA's units, at 100% efficiency
    seconds: float

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12

    @property
    def bound(self) -> str:
        """What limits a unit: "mma", "mufu" or "issue"."""
        best = max(self.t_mma, self.t_mufu, self.t_issue)
        return "mma" if best == self.t_mma else ("mufu" if best == self.t_mufu else "issue")


def unit_clocks(head_dim: int, gpu: Gpu, softmax_instructions: int) -> tuple[float, float, float]:
    """(t_mma, t_mufu, t_issue) of one unit (module docstring)."""
    t_mma = 4 * TILE_M * TILE_N * head_dim / FP8_FLOP_PER_CLK_PER_SM
    t_mufu = TILE_M * (TILE_N + 1) / MUFU_EX2_PER_CLK[gpu.name]
    return t_mma, t_mufu, float(softmax_instructions + CORRECTION_INSTRUCTIONS)


def item_units(q_len: int, kv_len: int, causal: bool) -> list[tuple[int, int]]:
    """(units, masked units) of each item (Q tile pair) of one (sequence, head), in the kernel's item order: a
    unit is masked where its KV tile holds a key past kv_len or (causal) past the Q tile's first row
    (attention_mask.tile_needs_mask)."""
    pairs = -(-q_len // ITEM_ROWS)
    out = []
    for m in range(pairs):
        n = -(-kv_len // TILE_N)
        if causal:
            n = min(n, (min((m + 1) * ITEM_ROWS, q_len) - 1) // TILE_N + 1)
        masked = 0
        for s in range(2):
            first_row = m * ITEM_ROWS + s * TILE_M
            masked += sum((j + 1) * TILE_N > kv_len or (causal and (j + 1) * TILE_N > first_row + 1) for j in range(n))
        out.append((2 * n, masked))
    return out[::-1] if causal else out


def predict_fwd(
    config: AttentionFwdSm100Config,
    shape: tuple[int, int, int, tuple[int, ...]],
    gpu: Gpu,
    softmax_instructions: tuple[int, int],
) -> AttentionPrediction:
    """shape = (heads, kv_heads, batch, lengths): `batch` sequences of the given lengths (query = key length;
    dense: all equal). softmax_instructions: (unmasked, masked) per tile and warp (the compiled SASS).
    Packed variants walk the items longest first, dense ones in the kernel's order."""
    heads, _, _, lengths = shape
    t_mma, t_mufu, t_plain = unit_clocks(config.head_dim, gpu, softmax_instructions[0])
    t_masked = unit_clocks(config.head_dim, gpu, softmax_instructions[1])[2]
    plain, masked = max(t_mma, t_mufu, t_plain), max(t_mma, t_mufu, t_masked)
    per_seq = [[(u - k) * plain + k * masked for u, k in item_units(n, n, config.causal)] for n in lengths]
    if config.packed:
        items = sorted((c for costs in per_seq for c in costs for _ in range(heads)), reverse=True)
    elif config.causal:  # longest pairs first across every (batch, head)
        depth = max(len(c) for c in per_seq)
        items = [c[i] for i in range(depth) for c in per_seq for _ in range(heads) if i < len(c)]
    else:
        items = [x for c in per_seq for _ in range(heads) for x in c]
    ctas = min(len(items), gpu.sms)
    busiest = max(sum(items[c::ctas]) for c in range(ctas))
    seconds = busiest / EFFICIENCY[gpu.name] / (gpu.clock_ghz * 1e9)
    flops = sum(4.0 * n * n * config.head_dim * heads * (0.5 if config.causal else 1.0) for n in lengths)
    return AttentionPrediction(flops, t_mma, t_mufu, t_plain, busiest, seconds)


JAGGED_LENGTHS = tuple(int(round(512 + (16384 - 512) * i / 63)) for i in range(64))
"""64 sequences spread evenly over [512, 16384] (the seed's jagged U[512, 16384] shape, deterministic)."""
TABLE_SHAPES = {
    "dense": (16, 16, 4, (4096,) * 4),
    "packed": (4, 4, 64, JAGGED_LENGTHS),
}
"""(heads, kv_heads, batch, lengths) of the resource table's predictions: N16 H B4 T4k (dense, broadcast_q),
the jagged 64 x U[512, 16384] N4 (packed)."""
GPUS = (B200, GB300)


def table_shape(config: AttentionFwdSm100Config) -> tuple[int, int, int, tuple[int, ...]]:
    return TABLE_SHAPES["packed" if config.packed else "dense"]


def describe(p: AttentionPrediction) -> str:
    return f"{p.tflops:.0f} ({p.bound})"
