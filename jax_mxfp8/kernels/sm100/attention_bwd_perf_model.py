"""A performance model of the Blackwell MXFP8 attention backward (kernels/sm100/attention_bwd.py) and of
forward + backward, from the design's model (docs/perf/blackwell-attention.md section 6). Pure Python:
PREDICTIONS, not measurements -- no Blackwell GPU has run these kernels.

  predict_bwd(config, problem, gpu)     backward TFLOP/s of one call
  predict_fwd(head_dim, causal, problem, gpu)   forward TFLOP/s (the design's forward model)
  predict_train(config, problem, gpu)   forward + backward: 3.5 / (1 / fwd + 2.5 / bwd)
  Problem(batch, seq, heads, kv_heads, lens)   dense (lens None) or packed jagged (lens: sequence lengths)

Unit = one 128-query x 128-key tile pair of one head; per SM and unit, in SM clocks:
  backward  t_mma  = 5 GEMMs x 2 x 128 x 128 x H / 16384 (FP8 FLOP per clock per SM)
            t_exp  = 128 x 128 / ex2 per clock (B200 16, GB300 32: FA4's figures)
            t_issue = BWD_ISSUE_PER_32 warp-instructions per 32 elements / 4 schedulers
            t_unit = max(t_mma, t_exp, t_issue) / BWD_EFFICIENCY + dQ bytes / L2_REDUCE_BYTES_PER_CLK
  forward   max(4 x 128 x 128 x H / 16384, balanced exp (MUFU vs the FMA-pipe polynomial split),
            FWD_ISSUE_PER_32 / 4 per element) / FWD_EFFICIENCY[gpu]
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

import dataclasses
import math

from jax_mxfp8.kernels.sm100.attention_bwd_config import AttentionBwdSm100Config
from jax_mxfp8.kernels.sm100.attention_geometry import TILE
from jax_mxfp8.kernels.sm100.perf_model import B200, FP8_FLOP_PER_CLK_PER_SM, GB300, Gpu

EX2_PER_CLK = {B200.name: 16, GB300.name: 32}
"""MUFU.EX2 results per clock per SM (FA4's figure; GB300 doubles the exponential throughput)."""
ISSUE_SLOTS = 4
FWD_ISSUE_PER_32 = 4
"""Warp-instructions per 32 softmax elements in the forward (FMUL2, FADD2, FMNMX3, F2FP, TMEM traffic)."""
BWD_ISSUE_PER_32 = 7
"""Warp-instructions per 32 elements in the backward's compute warps (P: mul, sub, min; dS: sub, mul; the P
and dS scalings and packs; the warp amax per block): the design's estimate, unmeasured."""
POLY_EXTRA_ISSUE = 8
"""Extra issue slots per exponential moved from MUFU to the FMA-pipe polynomial (FA4's split, forward)."""
FWD_EFFICIENCY = {B200.name: 0.645, GB300.name: 0.61}
"""The forward's achieved fraction of its bound: midpoints of the design's calibrated ranges (B200 0.57-0.72
from FA4's BF16 forward, GB300 0.57-0.65 from LP-FA4's MXFP8 forward)."""
ANCHOR_GB300_BWD_TFLOPS = {"fp32": 1820.0, "fp16": 1980.0}
"""LP-FA4's published backward on GB300 (H128, non-causal, MHA), float32 / float16 dQ."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """An attention problem: batch rows of `seq` queries and keys (dense), or packed sequences of `lens`."""

    batch: int
    seq: int
    heads: int
    kv_heads: int
    lens: tuple[int, ...] | None = None

    def sequences(self) -> tuple[int, ...]:
        return self.lens if self.lens is not None else (self.seq,) * self.batch


def _clock(gpu: Gpu) -> float:
    return gpu.clock_ghz * 1e9


def _bwd_base_clk(head_dim: int, gpu: Gpu) -> float:
    t_mma = 5 * 2 * TILE * TILE * head_dim / FP8_FLOP_PER_CLK_PER_SM
    t_exp = TILE * TILE / EX2_PER_CLK[gpu.name]
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


def _flops(problem: Problem, head_dim: int, causal: bool, factor: int) -> float:
    """Useful FLOPs: factor x 2 x T S H per head (forward 2 GEMMs: 2, backward 5: 5), causal half."""
    total = sum(s * s for s in problem.sequences()) * problem.heads * head_dim * 2 * factor
    return total / 2 if causal else total


def predict_bwd(config: AttentionBwdSm100Config, problem: Problem, gpu: Gpu) -> float:
    """Predicted backward TFLOP/s (module docstring)."""
    h = config.head_dim
    t_unit = _bwd_base_clk(h, gpu) / BWD_EFFICIENCY + _dq_bytes(config.dq_accum, h) / L2_REDUCE_BYTES_PER_CLK
    units = sum(_pairs(s, config.causal) for s in problem.sequences()) * problem.heads
    seconds = units * t_unit / gpu.sms / _clock(gpu)
    if config.deterministic:
        tiles = math.ceil(max(problem.sequences()) / TILE)
        steps = problem.heads // problem.kv_heads * (tiles if not config.causal else (tiles + 1) / 2)
        together = min(tiles, math.ceil(gpu.sms / (len(problem.sequences()) * problem.kv_heads)))
        seconds *= (steps + together - 1) / steps
    return _flops(problem, h, config.causal, 5) / seconds / 1e12


def predict_fwd(head_dim: int, causal: bool, problem: Problem, gpu: Gpu) -> float:
    """Predicted forward TFLOP/s (the design's forward model: module docstring)."""
    t_mma = 2 * 2 * TILE * TILE * head_dim / FP8_FLOP_PER_CLK_PER_SM
    exps = TILE * TILE + TILE
    t_mufu = exps / EX2_PER_CLK[gpu.name]
    t_issue = FWD_ISSUE_PER_32 * TILE * TILE / 32 / ISSUE_SLOTS
    extra = POLY_EXTRA_ISSUE * exps / 32 / ISSUE_SLOTS  # issue slots if every exponential were a polynomial
    f = min(max((t_mufu - t_issue) / (t_mufu + extra), 0.0), 1.0)  # the split that balances MUFU and issue
    t_unit = max(t_mma, t_mufu * (1 - f), t_issue + extra * f) / FWD_EFFICIENCY[gpu.name]
    units = sum(_pairs(s, causal) for s in problem.sequences()) * problem.heads
    seconds = units * t_unit / gpu.sms / _clock(gpu)
    return _flops(problem, head_dim, causal, 2) / seconds / 1e12


def predict_train(config: AttentionBwdSm100Config, problem: Problem, gpu: Gpu) -> float:
    """Forward + backward TFLOP/s: 3.5 / (1 / fwd + 2.5 / bwd) (the backward does 2.5x the forward's FLOPs)."""
    fwd = predict_fwd(config.head_dim, config.causal, problem, gpu)
    return 3.5 / (1 / fwd + 2.5 / predict_bwd(config, problem, gpu))


JAGGED_LENS = tuple(512 + i * (16384 - 512) // 63 for i in range(64))
"""The design's jagged shape, 64 sequences spread over [512, 16384] (evenly, for a deterministic table)."""


def table_problem(config: AttentionBwdSm100Config) -> Problem:
    """The problem of a variant's row in the resource table: B2 T = S = 8192 N = K = 16 dense, or the jagged
    set with N = K = 4 (packed)."""
    if config.packed:
        return Problem(batch=1, seq=sum(JAGGED_LENS), heads=4, kv_heads=4, lens=JAGGED_LENS)
    return Problem(batch=2, seq=8192, heads=16, kv_heads=16)
