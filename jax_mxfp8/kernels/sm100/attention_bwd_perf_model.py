"""A performance model of the Blackwell MXFP8 attention backward (kernels/sm100/attention_bwd.py), and of
forward + backward with the built forward's model (kernels/sm100/attention_fwd_perf_model.py) as its forward
term. Pure Python: PREDICTIONS, not measurements -- no Blackwell GPU has run these kernels. The assumptions
of both are stated once in docs/perf/blackwell-attention.md section 6.

  predict_bwd(config, shape, gpu)       backward TFLOP/s of one call
  forward_config(config)                the forward variant of the same head_dim, causal, p_scale, packed
  predict_train(config, shape, gpu, forward_instructions)   forward + backward TFLOP/s: both calls' FLOPs over
                                        both times, the forward's from attention_fwd_perf_model.predict_fwd
                                        with the compiled forward variant's softmax instruction counts
  table_shape(config)                   the problem of a variant's row in the resource table
shape = (heads, kv_heads, batch, lengths), attention_fwd_perf_model's: `batch` sequences of the given
lengths (query = key length; dense: all equal).

Unit = one 128-query x 128-key tile pair of one head; per SM and unit, in SM clocks:
  t_mma   = 5 GEMMs x 2 x 128 x 128 x H / 16384 (FP8 FLOP per clock per SM)
  t_exp   = 128 x 128 / MUFU.EX2 per clock (attention_fwd_perf_model.MUFU_EX2_PER_CLK)
  t_issue = BWD_ISSUE_PER_32 warp-instructions per 32 elements / 4 schedulers
  t_unit  = max(t_mma, t_exp, t_issue) / BWD_EFFICIENCY + dQ bytes / L2_REDUCE_BYTES_PER_CLK
BWD_EFFICIENCY and L2_REDUCE_BYTES_PER_CLK are the two numbers that make the model reproduce LP-FA4's two
published GB300 backward figures (H128, non-causal: 1.82 PFLOP/s with float32 dQ, 1.98 with float16 dQ,
whose only difference is the dQ reduction traffic); everything else follows from the bound ratios. Causal:
the visited tile pairs (key tile n visits query tiles m >= n). Deterministic dQ: each head's key tiles add
into a query tile in order; the grid launches key tile by key tile across all B K heads, so about
c = min(key tiles, ceil(SMs / (B K))) key tiles of a head run at once and their ordered adds form a
wavefront of c - 1 steps: time x (steps + c - 1) / steps. Packed: the sum over sequences. Waves, launch
and tails are ignored.
"""

from __future__ import annotations

import math

from jax_mxfp8.kernels.sm100 import attention_fwd_perf_model as fwd_model
from jax_mxfp8.kernels.sm100.attention_bwd_config import AttentionBwdSm100Config
from jax_mxfp8.kernels.sm100.attention_fwd_config import AttentionFwdSm100Config, find_variant
from jax_mxfp8.kernels.sm100.attention_geometry import TILE
from jax_mxfp8.kernels.sm100.perf_model import FP8_FLOP_PER_CLK_PER_SM, GB300, Gpu

ISSUE_SLOTS = 4
BWD_ISSUE_PER_32 = 7
"""Warp-instructions per 32 elements in the backward's compute warps (P: mul, sub, min; dS: sub, mul; the P
and dS scalings and packs; the warp amax per block): the design's estimate, unmeasured."""
ANCHOR_GB300_BWD_TFLOPS = {"fp32": 1820.0, "fp16": 1980.0}
"""LP-FA4's published backward on GB300 (H128, non-causal, MHA), float32 / float16 dQ."""


Shape = tuple[int, int, int, tuple[int, ...]]
"""(heads, kv_heads, batch, lengths): attention_fwd_perf_model's problem shape."""


def _clock(gpu: Gpu) -> float:
    return gpu.clock_ghz * 1e9


def _bwd_base_clk(head_dim: int, gpu: Gpu) -> float:
    t_mma = 5 * 2 * TILE * TILE * head_dim / FP8_FLOP_PER_CLK_PER_SM
    t_exp = TILE * TILE / fwd_model.MUFU_EX2_PER_CLK[gpu.name]
    t_issue = BWD_ISSUE_PER_32 * TILE * TILE / 32 / ISSUE_SLOTS
    return max(t_mma, t_exp, t_issue)


def _dq_bytes(dq_accum: str, head_dim: int) -> int:
    return TILE * head_dim * (4 if dq_accum == "fp32" else 2)


def calibration() -> tuple[float, float]:
    """(BWD_EFFICIENCY, L2_REDUCE_BYTES_PER_CLK) solving t_unit = base / eff + dq / bw for LP-FA4's two GB300
    figures (module docstring)."""
    flops = 5 * 2 * TILE * TILE * 128
    clk = {m: _clock(GB300) * flops * GB300.sms / (t * 1e12) for m, t in ANCHOR_GB300_BWD_TFLOPS.items()}
    bw = (_dq_bytes("fp32", 128) - _dq_bytes("fp16", 128)) / (clk["fp32"] - clk["fp16"])
    eff = _bwd_base_clk(128, GB300) / (clk["fp32"] - _dq_bytes("fp32", 128) / bw)
    return eff, bw


BWD_EFFICIENCY, L2_REDUCE_BYTES_PER_CLK = calibration()


def _pairs(seq: int, causal: bool) -> int:
    """Visited (query tile, key tile) pairs of one head of one sequence."""
    n = math.ceil(seq / TILE)
    return n * (n + 1) // 2 if causal else n * n


def _flops(shape: Shape, head_dim: int, causal: bool) -> float:
    """Useful backward FLOPs: 5 GEMMs x 2 x T S H per head, causal half (2.5x the forward's 4 T S H)."""
    heads, _, _, lengths = shape
    total = sum(s * s for s in lengths) * heads * head_dim * 2 * 5
    return total / 2 if causal else total


def predict_bwd(config: AttentionBwdSm100Config, shape: Shape, gpu: Gpu) -> float:
    """Predicted backward TFLOP/s (module docstring)."""
    heads, kv_heads, _, lengths = shape
    h = config.head_dim
    t_unit = _bwd_base_clk(h, gpu) / BWD_EFFICIENCY + _dq_bytes(config.dq_accum, h) / L2_REDUCE_BYTES_PER_CLK
    units = sum(_pairs(s, config.causal) for s in lengths) * heads
    seconds = units * t_unit / gpu.sms / _clock(gpu)
    if config.deterministic:
        tiles = math.ceil(max(lengths) / TILE)
        steps = heads // kv_heads * (tiles if not config.causal else (tiles + 1) / 2)
        together = min(tiles, math.ceil(gpu.sms / (len(lengths) * kv_heads)))
        seconds *= (steps + together - 1) / steps
    return _flops(shape, h, config.causal) / seconds / 1e12


def forward_config(config: AttentionBwdSm100Config) -> AttentionFwdSm100Config:
    """The production forward variant whose residuals this backward variant takes (same key fields)."""
    return find_variant(head_dim=config.head_dim, causal=config.causal, p_scale=config.p_scale, packed=config.packed,
                        broadcast_q=False)  # fmt: skip


def predict_train(
    config: AttentionBwdSm100Config, shape: Shape, gpu: Gpu, forward_instructions: tuple[int, int]
) -> float:
    """Forward + backward TFLOP/s: both calls' FLOPs over both times; the forward's time is
    attention_fwd_perf_model.predict_fwd's for forward_config(config) at the compiled forward's softmax
    instruction counts (unmasked, masked) per tile. Equal to 3.5 / (1 / fwd + 2.5 / bwd): the backward does
    2.5x the forward's FLOPs."""
    fwd = fwd_model.predict_fwd(forward_config(config), shape, gpu, forward_instructions)
    bwd_flops = _flops(shape, config.head_dim, config.causal)
    bwd_seconds = bwd_flops / (predict_bwd(config, shape, gpu) * 1e12)
    return (fwd.flops + bwd_flops) / (fwd.seconds + bwd_seconds) / 1e12


def table_shape(config: AttentionBwdSm100Config) -> Shape:
    """The problem of a variant's row in the resource table: N = K = 16 B2 T = S = 8192 dense, or the jagged
    set of the forward's table (attention_fwd_perf_model.JAGGED_LENGTHS) with N = K = 4 (packed)."""
    if config.packed:
        return fwd_model.TABLE_SHAPES["packed"]
    return (16, 16, 2, (8192, 8192))
