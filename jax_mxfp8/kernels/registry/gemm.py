"""Hopper MX GEMM variants (kernels/sm90/mx_gemm.py): FP8 wgmma with per-128-K promotion, sm_90a only.

The kernel computes c (G, M, N) = sum_kt sa[g, kt, m] sb[g, kt, n] (a[g, m, kt] . b[g, n, kt]) (+ bias[n])
on the aligned operands (docs/interfaces.md, docs/numerics.md): a (G, M, Kp), b (G, N, Kp) FP8 K-major,
sa (G, Kp/128, M), sb (G, Kp/128, N) float32, Kp a multiple of 128.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers

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
        accumulators take 2 * tile_m * tile_n / 256 registers per consumer thread). A key field: each
        (dtypes, bias) key has two production tilings (PRODUCTION_TILINGS), chosen per shape by
        mx_gemm_tile_n; a lookup that does not name it gets 192.
      stages: shared-memory ring depth (A, B, sa, sb of one 128-K tile per stage).
      unroll_stages: the consumer's K loop is unrolled by `stages` (one ring lap per iteration, stage
        indices trace-time constants), each work tile starting at stage 0; the k_tiles % stages tiles left
        over run in a plain loop. Cuts the descriptor / barrier / address instructions of each K tile.
      uniform_desc: the wgmma operand descriptors are built from the warpgroup's first thread marked
        warp-uniform (they are the same for all its threads), so ptxas keeps them in uniform registers.
      cluster_m: CTAs per cluster along M (1 or 2); with 2, the pair shares each B tile: each CTA loads
        half of it by TMA multicast into both (halves B's L2 -> SM traffic).
      group_m: rasterization: consecutive work tiles walk group_m M tiles before the next N tile (L2 reuse).
      max_ctas: persistent grid size bound (the H200's 132 SMs: one CTA per SM).
      tune: 0 for the production variant of its key; > 0 for the comparison schedules (MX_GEMM_TUNINGS).
    """

    op = "mx_gemm"
    kernels = {"sm_90a": "jax_mxfp8.kernels.sm90.mx_gemm:make_kernel"}  # wgmma: Hopper only
    key_fields = ("a_dtype", "b_dtype", "out_dtype", "has_bias", "tile_n")
    codes = {"a_dtype": DTYPE_CODE, "b_dtype": DTYPE_CODE, "out_dtype": DTYPE_CODE}

    a_dtype: str = "float8_e4m3fn"
    b_dtype: str = "float8_e4m3fn"
    out_dtype: str = "bfloat16"
    has_bias: bool = False
    tile_m: int = 128
    tile_n: int = 192
    stages: int = 4
    unroll_stages: bool = False
    uniform_desc: bool = False
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
        if self.tune:
            return f"{base}_t{self.tune}"
        return base if self.tile_n == PRODUCTION_TILE_NS[0] else f"{base}_n{self.tile_n}"


_PRODUCTION = dict(tile_n=192, stages=4, cluster_m=2, unroll_stages=True, uniform_desc=True)
"""The 128x192 production tiling: a cluster pair sharing B by multicast, the K loop unrolled by a 4-stage ring,
warp-uniform operand descriptors (docs/perf/removed-variants.md has the measurements). Also the quantize
epilogue's tiling (registry/gemm_epilogue.py)."""

PRODUCTION_TILINGS: dict[int, dict] = {
    192: _PRODUCTION,
    128: dict(tile_n=128, stages=6, cluster_m=2, unroll_stages=True, uniform_desc=True),
}
"""tile_n -> the production schedule of that tile width. Both have the same features (cluster pair, unrolled
ring, uniform descriptors) and the same per-element operations in the same K order, so they return the same
bits; 128x128 takes 6 stages (as many as fit in 227 KiB: 6 x 33 KiB) and half the accumulator registers.
Which one a call runs is a choice by shape (mx_gemm_tile_n), not a tuning."""

PRODUCTION_TILE_NS: tuple[int, ...] = tuple(PRODUCTION_TILINGS)
"""The production tile widths, preferred first (a tie in mx_gemm_tile_n's estimate goes to the first)."""

MX_GEMM_VARIANTS: tuple[MXGemmConfig, ...] = tuple(
    MXGemmConfig(a_dtype=a, b_dtype=b, out_dtype=o, has_bias=bias, **PRODUCTION_TILINGS[tile_n])
    for tile_n, a, b, o, bias in itertools.product(
        PRODUCTION_TILE_NS, ELEM_DTYPES, ELEM_DTYPES, GEMM_OUT_DTYPES, (False, True)
    )
)
"""Every (a, b, out, bias) combination at each production tiling: names without a suffix are 128x192, names
ending in _n128 are 128x128 (e.g. mx_gemm_e4m3_e4m3_bf16_n128)."""


def mx_gemm_tile_n(m: int, n: int, g: int = 1) -> int:
    """The production tile width (192 or 128) with the smaller estimated time for c (G, M, N).

    The estimate of a tiling: the persistent grid runs max_ctas / cluster_m clusters; a work item is one
    cluster tile (cluster_m * 128 rows x tile_n columns); the G * ceil(M / (cluster_m * 128)) *
    ceil(N / tile_n) items run in ceil(items / clusters) waves, each as long as one item's padded area
    (cluster_m * 128 * tile_n; both tilings run the same K tiles per item, so K scales both alike and does
    not enter). Estimated time = waves x area: it charges the columns past N of the last N tile (N = 1024 is
    5.33 tiles of 192 but 8 of 128) and the idle clusters of the last wave. It assumes both tilings reach
    the same throughput per unit of area on a full wave. Ties go to 192 (PRODUCTION_TILE_NS order).
    E.g. (M, N) = (32768, 1024): 192 -> 768 items, 12 waves x 256*192; 128 -> 1024 items, 16 waves x
    256*128: 128 (2048 vs 2304 in units of 256 rows x 1 column).
    """
    for name, value in (("m", m), ("n", n), ("g", g)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"mx_gemm_tile_n: {name}={value!r} must be a positive integer")

    def estimate(tile_n: int) -> int:
        c = MXGemmConfig(**PRODUCTION_TILINGS[tile_n])
        span = c.cluster_m * c.tile_m  # rows of one work item
        items = g * math.ceil(m / span) * math.ceil(n / tile_n)
        return math.ceil(items / (c.max_ctas // c.cluster_m)) * span * tile_n

    return min(PRODUCTION_TILE_NS, key=estimate)  # min keeps the first of equal estimates


MX_GEMM_TUNINGS: tuple[MXGemmConfig, ...] = (
    MXGemmConfig(tile_n=128, stages=6, tune=1),
    MXGemmConfig(tile_n=192, stages=5, cluster_m=2, tune=10),
)
"""The two comparison schedules of the e4m3 x e4m3 -> bf16 kernel (benchmarks/mx_gemm_kernel.py; built with
`tools/build_library.py --with-tunes`), both bit-identical to production: tune 1, the first kernel (128x128, no
cluster, 6 stages, rolled K loop): what the 128x192 tile and the cluster pair bought; tune 10, the previous production
(128x192, cluster pair, 5 stages, rolled K loop): what unrolling the ring and uniform descriptors bought."""
