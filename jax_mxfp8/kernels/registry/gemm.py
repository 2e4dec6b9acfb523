"""Hopper MX GEMM variants (kernels/sm90/mx_gemm.py): FP8 wgmma with per-128-K promotion, sm_90a only.

The kernel computes c (G, M, N) = sum_kt sa[g, kt, m] sb[g, kt, n] (a[g, m, kt] . b[g, n, kt]) (+ bias[n])
on the aligned operands of docs/coord GEMM_INTERFACE.md ("way (b)" of DESIGN.md section 2): a (G, M, Kp),
b (G, N, Kp) FP8 K-major, sa (G, Kp/128, M), sb (G, Kp/128, N) float32, Kp a multiple of 128.
"""

from __future__ import annotations

import dataclasses
import itertools

from jax_mxfp8.kernels.registry.base import DTYPE_CODE, ELEM_DTYPES, SHORT, KernelConfig

GEMM_OUT_DTYPES = ("bfloat16", "float32")
GEMM_K_TILE = 128
"""K elements per promotion: one float32 scale pair per 128 K (the aligned operands' granularity)."""
GEMM_ALIGN = 16
"""M and N must be multiples of this (TMA: 16-byte global strides of the float32 scales; paired stores)."""


@dataclasses.dataclass(frozen=True)
class MXGemmConfig(KernelConfig):
    """One compiled MX GEMM (kernels/sm90/mx_gemm.py).

    Attributes:
      a_dtype, b_dtype: "float8_e4m3fn" or "float8_e5m2" (wgmma takes any mix).
      out_dtype: "bfloat16" or "float32" (one RN cast of the float32 result).
      has_bias: adds bias (N,) float32 to the float32 result before the cast.
      tile_m: rows per CTA tile (two consumer warpgroups of 64 rows each): 128.
      tile_n: columns per CTA tile: 128 or 192 (256 does not fit: the temporary and the main float32
        accumulators take 2 * tile_m * tile_n / 256 registers per consumer thread).
      stages: shared-memory ring depth (A, B, sa, sb of one 128-K tile per stage).
      pingpong: the two consumer warpgroups take turns issuing each K tile's wgmmas (named barriers), so
        that one promotes on the CUDA cores while the other's wgmmas run (False: both issue at once, the
        tensor core interleaves them, and both promote while it idles). Measured no faster on the H200
        (docs/perf-notes.md "Hopper MX GEMM"): off in production.
      handoff: pingpong only: how many of a K tile's 4 wgmmas must have completed before a consumer
        passes the turn (one commit group per wgmma, wait_group(4 - handoff)). 0: right after issuing
        them (the first pingpong: the tensor core interleaves both warpgroups' wgmmas and they drift back
        into lockstep); 1-4: the warpgroups' K tiles alternate on the tensor core, each one's promotion
        overlapping the other's wgmmas. Measured no faster than production (docs/perf-notes.md).
      overlap: two temporary accumulators per consumer: K tile kt + 1's wgmmas are issued before K tile
        kt is promoted (wait_group(1)), so the tensor core does not drain between K tiles (tile_n 128
        only: three accumulator-sized register tensors). Not with pingpong or early_scales. +11% over
        128 x 128 without it, equal to the production 128 x 192 (docs/perf-notes.md): tunings only.
      preload_scales: the promoted K tile's row and column scales are loaded from shared memory before the
        next wgmmas are issued (DeepGEMM's order), so the promotion after the wait does not stall on their
        latency (tile_n // 4 + 2 more live registers across the wgmmas; spills at tile_n 192 and with
        overlap, not at 128 x 128 lockstep). Not with early_scales.
      diagnostic: "" for real kernels; benchmark-only variants that skip work and produce WRONG outputs
        (MX_GEMM_DIAGNOSTICS, never tested for numerics): "row_scale_only" (one FFMA by the row scale
        per element, no column scales loaded).
      early_scales: the K tile's scale products sa[m] * sb[n] are made while its wgmmas run, so that only
        the FFMAs follow the wait (one more accumulator-sized register tensor: tile_n 128 only, 192
        spills). Measured slower on the H200 (docs/perf-notes.md): tunings only.
      unroll_stages: the consumer's K loop is unrolled by `stages` (one ring lap per iteration, stage
        indices trace-time constants), each work tile starting at stage 0; the k_tiles % stages tiles left
        over run in a plain loop. Cuts the descriptor / barrier / address instructions of each K tile.
        Lockstep, pingpong or handoff loops (not overlap).
      uniform_desc: the wgmma operand descriptors are built from the warpgroup's first thread marked
        warp-uniform (they are the same for all its threads), so ptxas keeps them in uniform registers.
      split_n: each K tile's wgmmas in two column halves (m64 n{tile_n / 2}) into two half-width
        temporaries, both issued at once, half 0 promoted while half 1's wgmmas run (the registers of
        main + tmp, as lockstep). Its own K tile: lockstep only (no pingpong, overlap, early_scales,
        preload_scales, diagnostic); with unroll_stages, unrolled by the ring as the lockstep loop.
      cluster_m: CTAs per cluster along M (1 or 2); with 2, the pair shares each B tile: each CTA loads
        half of it by TMA multicast into both (halves B's L2 -> SM traffic).
      group_m: rasterization: consecutive work tiles walk group_m M tiles before the next N tile (L2 reuse).
      max_ctas: persistent grid size bound (the H200's 132 SMs: one CTA per SM).
      tune: 0 for the production variant of its key; > 0 for tunings built only for benchmarks.
    """

    op = "mx_gemm"
    kernels = {"sm_90a": "jax_mxfp8.kernels.sm90.mx_gemm:make_kernel"}  # wgmma: Hopper only
    key_fields = ("a_dtype", "b_dtype", "out_dtype", "has_bias")
    codes = {"a_dtype": DTYPE_CODE, "b_dtype": DTYPE_CODE, "out_dtype": DTYPE_CODE}

    a_dtype: str = "float8_e4m3fn"
    b_dtype: str = "float8_e4m3fn"
    out_dtype: str = "bfloat16"
    has_bias: bool = False
    tile_m: int = 128
    tile_n: int = 128
    stages: int = 6
    pingpong: bool = False
    handoff: int = 0
    overlap: bool = False
    preload_scales: bool = False
    diagnostic: str = ""
    early_scales: bool = False
    unroll_stages: bool = False
    uniform_desc: bool = False
    split_n: bool = False
    cluster_m: int = 1
    group_m: int = 8
    max_ctas: int = 132
    tune: int = 0

    def __post_init__(self):
        for field in ("a_dtype", "b_dtype"):
            if getattr(self, field) not in ELEM_DTYPES:
                raise ValueError(f"{field}={getattr(self, field)!r} not in {ELEM_DTYPES}")
        if self.out_dtype not in GEMM_OUT_DTYPES:
            raise ValueError(f"out_dtype={self.out_dtype!r} not in {GEMM_OUT_DTYPES}")
        if self.tile_m != 128:
            raise ValueError(f"tile_m={self.tile_m} must be 128 (two 64-row consumer warpgroups)")
        if self.tile_n not in (128, 192):
            raise ValueError(f"tile_n={self.tile_n} not in (128, 192)")
        if not 2 <= self.stages <= 8:
            raise ValueError(f"stages={self.stages} not in [2, 8]")
        if not 0 <= self.handoff <= GEMM_K_TILE // 32:
            raise ValueError(f"handoff={self.handoff} not in [0, {GEMM_K_TILE // 32}]")
        if self.handoff and not self.pingpong:
            raise ValueError(f"handoff={self.handoff} needs pingpong=True")
        if self.overlap and (self.tile_n != 128 or self.pingpong or self.early_scales):
            raise ValueError("overlap needs tile_n=128, no pingpong, no early_scales")
        if self.diagnostic not in ("", "row_scale_only"):
            raise ValueError(f"diagnostic={self.diagnostic!r} not in ('', 'row_scale_only')")
        if self.diagnostic and (self.tune == 0 or self.overlap or self.early_scales or self.preload_scales):
            raise ValueError("a diagnostic is a tuning (tune > 0) of the lockstep loop")
        if self.unroll_stages and self.overlap:
            raise ValueError("unroll_stages and overlap exclude each other (overlap has its own K loop)")
        if self.split_n and (self.pingpong or self.overlap or self.early_scales or self.preload_scales
                             or self.diagnostic):  # fmt: skip
            raise ValueError("split_n has its own K loop: no pingpong, overlap, early/preload scales")
        if self.preload_scales and self.early_scales:
            raise ValueError("preload_scales and early_scales exclude each other")
        if self.early_scales and self.tile_n != 128:
            raise ValueError("early_scales needs tile_n=128 (three accumulator-sized tensors per thread)")
        if self.cluster_m not in (1, 2):
            raise ValueError(f"cluster_m={self.cluster_m} not in (1, 2)")
        if self.group_m < 1 or self.max_ctas < 1:
            raise ValueError("group_m and max_ctas must be >= 1")
        if self.smem_bytes > 227 * 1024:
            raise ValueError(f"{self.stages} stages of tile_n={self.tile_n} need {self.smem_bytes} B of shared memory")

    @property
    def smem_bytes(self) -> int:
        """Shared memory of the ring (A, B, sa, sb per stage) plus its barriers."""
        k = GEMM_K_TILE
        return self.stages * (self.tile_m * k + self.tile_n * k + 4 * (self.tile_m + self.tile_n)) + 1024

    @property
    def name(self) -> str:
        base = f"mx_gemm_{SHORT[self.a_dtype]}_{SHORT[self.b_dtype]}_{SHORT[self.out_dtype]}"
        base += "_bias" if self.has_bias else ""
        return f"{base}_t{self.tune}" if self.tune else base


# Production: the fastest of the H200 runs (docs/perf-notes.md "Session 4"): tune 26's config, 128x192,
# cluster pair, K loop unrolled by a 4-stage ring, warp-uniform descriptors (bit-identical to tune 10, the
# previous production; +0.4-5.3% in round A, +4-12% in round B, same process).
_PRODUCTION = dict(tile_n=192, stages=4, pingpong=False, cluster_m=2, unroll_stages=True, uniform_desc=True)

MX_GEMM_VARIANTS: tuple[MXGemmConfig, ...] = tuple(
    MXGemmConfig(a_dtype=a, b_dtype=b, out_dtype=o, has_bias=bias, **_PRODUCTION)
    for a, b, o, bias in itertools.product(ELEM_DTYPES, ELEM_DTYPES, GEMM_OUT_DTYPES, (False, True))
)
"""Every (a, b, out, bias) combination at the production tiling."""

MX_GEMM_TUNINGS: tuple[MXGemmConfig, ...] = (
    MXGemmConfig(tile_n=128, stages=6, pingpong=False, tune=1),  # the first version
    MXGemmConfig(tile_n=128, stages=6, pingpong=True, tune=2),
    MXGemmConfig(tile_n=192, stages=5, pingpong=False, tune=3),
    MXGemmConfig(tile_n=192, stages=5, pingpong=True, tune=4),
    MXGemmConfig(tile_n=128, stages=6, pingpong=False, cluster_m=2, tune=5),
    MXGemmConfig(tile_n=192, stages=5, pingpong=True, cluster_m=2, tune=6),
    MXGemmConfig(tile_n=128, stages=6, early_scales=True, cluster_m=2, tune=7),
    MXGemmConfig(tile_n=128, stages=6, early_scales=True, pingpong=True, tune=8),
    MXGemmConfig(tile_n=128, stages=6, early_scales=True, tune=9),
    # the previous production config (until session 4) under a tuning name, timed next to production
    MXGemmConfig(tile_n=192, stages=5, pingpong=False, cluster_m=2, tune=10),
    MXGemmConfig(tile_n=192, stages=5, pingpong=True, handoff=2, cluster_m=2, tune=11),
    MXGemmConfig(tile_n=192, stages=5, pingpong=True, handoff=4, cluster_m=2, tune=12),
    MXGemmConfig(tile_n=128, stages=6, pingpong=True, handoff=3, cluster_m=2, tune=13),
    MXGemmConfig(tile_n=192, stages=5, pingpong=True, handoff=3, tune=14),
    MXGemmConfig(tile_n=128, stages=6, pingpong=True, handoff=3, early_scales=True, cluster_m=2, tune=15),
    MXGemmConfig(tile_n=192, stages=5, pingpong=True, handoff=3, cluster_m=2, tune=16),
    MXGemmConfig(tile_n=128, stages=6, overlap=True, tune=17),
    MXGemmConfig(tile_n=128, stages=6, overlap=True, cluster_m=2, tune=18),
    # coordinator run 1 (session 4): 850 / 807 / 832, slower than production
    MXGemmConfig(tile_n=128, stages=6, preload_scales=True, cluster_m=2, tune=19),
    # a diagnostic of production's loop (WRONG outputs; coordinator run 1: +18.5% over production)
    MXGemmConfig(tile_n=192, stages=5, cluster_m=2, diagnostic="row_scale_only", tune=20),
    # production with the K loop unrolled by the ring (stages 5: K % 640 tiles left over; stages 4: none
    # at K a multiple of 512); tune 23 = tune 21 on 8 CTAs (several work tiles per CTA in the tests)
    MXGemmConfig(tile_n=192, stages=5, cluster_m=2, unroll_stages=True, tune=21),
    MXGemmConfig(tile_n=192, stages=4, cluster_m=2, unroll_stages=True, tune=22),
    MXGemmConfig(tile_n=192, stages=5, cluster_m=2, unroll_stages=True, max_ctas=8, tune=23),
    MXGemmConfig(tile_n=192, stages=5, cluster_m=2, uniform_desc=True, tune=24),
    MXGemmConfig(tile_n=192, stages=5, cluster_m=2, unroll_stages=True, uniform_desc=True, tune=25),
    MXGemmConfig(tile_n=192, stages=4, cluster_m=2, unroll_stages=True, uniform_desc=True, tune=26),
    # half of the promotion under the tensor core: two n96 halves per K tile, half 0 promoted while
    # half 1's wgmmas run
    MXGemmConfig(tile_n=192, stages=5, cluster_m=2, split_n=True, uniform_desc=True, tune=27),
    MXGemmConfig(tile_n=192, stages=4, cluster_m=2, split_n=True, uniform_desc=True, unroll_stages=True, tune=28),
)
"""Benchmark-only tunings of the e4m3 x e4m3 -> bf16 kernel (benchmarks/mx_gemm_kernel.py); those with a
`diagnostic` (MX_GEMM_DIAGNOSTICS) have wrong outputs on purpose and are excluded from the numerics tests."""

MX_GEMM_DIAGNOSTICS: tuple[MXGemmConfig, ...] = tuple(v for v in MX_GEMM_TUNINGS if v.diagnostic)
