"""A performance model of the Blackwell MX GEMM (kernels/sm100/mx_gemm.py). Pure Python: predictions, not
measurements -- no Blackwell GPU has run this kernel (docs/perf/blackwell.md explains every term).

  predict(config, shape, gpu, epilogue_instructions) -> Prediction     time and TFLOP/s of one call
  unfused_seconds(plain, shape, gpu, epilogue_instructions, orientations)   a bf16 GEMM, then separate
                                                                       quantize passes (the unfused path)
  B200, GB300                                                          the two targets' figures

Per CTA (one per SM; a 2-CTA pair splits a 256-row tile), per 128-K stage:
  t_mma  = 2 * 128 * tile_n * 128 / (dense FP8 peak / SMs)            the tensor core's share of the tile
  t_fill = config.tx_bytes / (L2 -> SM bytes per clock * clock)        TMA bringing A, B, SFA, SFB
  stage  = max(t_mma, t_fill)                                          (the ring hides the other one)
Per tile: mainloop = k_tiles * stage; epilogue = SASS instructions per epilogue warp and tile * CPI / clock
(the 4 epilogue warps run on the 4 schedulers at once); with two TMEM accumulator buffers a tile costs
max(mainloop, epilogue) and only the last tile's epilogue is exposed. The busiest cluster runs
ceil(tiles / clusters) tiles. HBM bound: every operand, scale and output byte moved once (the 2-CTA
rasterization keeps the reused A and B panels in L2). Time = max(compute, HBM) + launch.
"""

from __future__ import annotations

import dataclasses
import math

from jax_mxfp8.kernels.registry.gemm_sm100 import BLOCK, CTA_ROWS, K_TILE, MXGemmSm100Config

FP8_FLOP_PER_CLK_PER_SM = 16384
"""Dense FP8 (and MXFP8) tensor-core FLOP per clock per SM on sm_100: B200's published 4.5 PFLOP/s over
148 SMs at its ~1.86 GHz."""
L2_BYTES_PER_CLK_PER_SM = 64
"""ASSUMED L2 -> shared-memory fill rate per SM (TMA loads): the Ampere/Hopper figure; not published for
Blackwell and not measured here. The 128 x 128 tiles need more than this at the FP8 rate, so the model
calls them fill-bound; docs/perf/blackwell.md gives the sensitivity."""
EPILOGUE_CPI = 2.0
"""ASSUMED cycles per epilogue instruction: one epilogue warp per scheduler, so dependency latency is
hidden only by the warp's own instruction-level parallelism."""
LAUNCH_US = 3.0
"""ASSUMED fixed cost of a call: launch, TMEM allocation, ring fill, the last tile's drain."""


@dataclasses.dataclass(frozen=True)
class Gpu:
    """Published figures of one target (dense, no sparsity)."""

    name: str
    sms: int
    fp8_dense_tflops: float
    hbm_tb_per_s: float

    @property
    def clock_ghz(self) -> float:
        """The clock at which the published FP8 peak holds: peak / (SMs * FLOP per clock per SM)."""
        return self.fp8_dense_tflops * 1e12 / (self.sms * FP8_FLOP_PER_CLK_PER_SM) / 1e9


B200 = Gpu("B200", 148, 4500.0, 8.0)
"""HGX B200: 148 SMs, 4.5 PFLOP/s dense FP8, 8 TB/s HBM3e (NVIDIA's datasheet)."""
GB300 = Gpu("GB300", 160, 5000.0, 8.0)
"""GB300 (Blackwell Ultra in NVL72): 160 SMs, 5 PFLOP/s dense FP8 (360 PFLOP/s per 72 GPUs), 8 TB/s."""


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One call's predicted cost (seconds) and throughput."""

    flops: float
    t_mma_stage: float
    t_fill_stage: float
    t_mainloop_tile: float
    t_epilogue_tile: float
    tiles_per_cluster: int
    t_compute: float
    t_hbm: float
    seconds: float

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12

    @property
    def bound(self) -> str:
        """What limits the call: "mma", "fill" (L2 -> SM), "epilogue" or "hbm"."""
        if self.t_hbm >= self.t_compute:
            return "hbm"
        if self.t_epilogue_tile > self.t_mainloop_tile:
            return "epilogue"
        return "fill" if self.t_fill_stage > self.t_mma_stage else "mma"


def output_bytes_per_element(config: MXGemmSm100Config) -> float:
    """Bytes written per output element: c in out_dtype, and 1 + 1/32 per quantized orientation."""
    size = {"bfloat16": 2, "float32": 4}[config.out_dtype] if config.writes_c else 0
    orientations = {"plain": 0, "row": 1, "col": 1, "rowcol": 2}[config.epilogue]
    return size + orientations * (1 + 1 / BLOCK)


def predict(
    config: MXGemmSm100Config,
    shape: tuple[int, int, int, int],
    gpu: Gpu,
    epilogue_instructions: int,
    l2_bytes_per_clk: float = L2_BYTES_PER_CLK_PER_SM,
) -> Prediction:
    """The model (module docstring) for one call of `config` on (G, M, N, K) = shape.

    epilogue_instructions: SASS instructions one epilogue warp issues per tile (tools/check_sm100.py counts
    them in the compiled cubin); l2_bytes_per_clk: the assumed L2 -> SM fill rate (sensitivity studies)."""
    g, m, n, k = shape
    clock = gpu.clock_ghz * 1e9
    per_sm = gpu.fp8_dense_tflops * 1e12 / gpu.sms
    t_mma = 2 * CTA_ROWS * config.tile_n * K_TILE / per_sm
    t_fill = config.tx_bytes / (l2_bytes_per_clk * clock)
    k_tiles = math.ceil(k / K_TILE)
    t_main = k_tiles * max(t_mma, t_fill)
    t_epi = epilogue_instructions * EPILOGUE_CPI / clock
    tiles = g * math.ceil(m / config.tile_m) * math.ceil(n / config.tile_n)
    clusters = min(tiles, gpu.sms // config.cta_group)  # the grid: the device's SM count, given at launch
    per_cluster = math.ceil(tiles / clusters)
    t_compute = per_cluster * max(t_main, t_epi) + t_epi
    operand_bytes = g * (m + n) * k * (1 + 1 / BLOCK)
    out_bytes = g * m * n * output_bytes_per_element(config)
    t_hbm = (operand_bytes + out_bytes) / (gpu.hbm_tb_per_s * 1e12)
    seconds = max(t_compute, t_hbm) + LAUNCH_US * 1e-6
    return Prediction(2.0 * g * m * n * k, t_mma, t_fill, t_main, t_epi, per_cluster, t_compute, t_hbm, seconds)


def unfused_seconds(
    plain: MXGemmSm100Config,
    shape: tuple[int, int, int, int],
    gpu: Gpu,
    epilogue_instructions: int,
    orientations: int,
) -> float:
    """The unfused path: the plain GEMM writing bf16 (plain.out_dtype), then one quantize pass per MX
    orientation that reads it and writes E4M3 + scales at the HBM rate, each pass a launch of its own."""
    g, m, n, _ = shape
    gemm = predict(plain, shape, gpu, epilogue_instructions).seconds
    per_pass = g * m * n * (output_bytes_per_element(plain) + 1 + 1 / BLOCK) / (gpu.hbm_tb_per_s * 1e12)
    return gemm + orientations * (per_pass + LAUNCH_US * 1e-6)
