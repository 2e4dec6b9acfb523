"""Hopper MX GEMM variants (kernels/sm90/mx_gemm.py): FP8 wgmma with per-128-K promotion, sm_90a only.

The kernel computes c (G, M, N) = sum_kt sa[g, kt, m] sb[g, kt, n] (a[g, m, kt] . b[g, n, kt]) (+ bias[n])
on the aligned operands (docs/interfaces.md, docs/numerics.md): a (G, M, Kp), b (G, N, Kp) FP8 K-major,
sa (G, Kp/128, M), sb (G, Kp/128, N) float32, Kp a multiple of 128.
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
    key_fields = ("a_dtype", "b_dtype", "out_dtype", "has_bias")
    codes = {"a_dtype": DTYPE_CODE, "b_dtype": DTYPE_CODE, "out_dtype": DTYPE_CODE}

    a_dtype: str = "float8_e4m3fn"
    b_dtype: str = "float8_e4m3fn"
    out_dtype: str = "bfloat16"
    has_bias: bool = False
    tile_m: int = 128
    tile_n: int = 128
    stages: int = 6
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
        return f"{base}_t{self.tune}" if self.tune else base


_PRODUCTION = dict(tile_n=192, stages=4, cluster_m=2, unroll_stages=True, uniform_desc=True)
"""Production: 128x192 tiles, a cluster pair sharing B by multicast, the K loop unrolled by a 4-stage ring,
warp-uniform operand descriptors (docs/perf/removed-variants.md has the measurements)."""

MX_GEMM_VARIANTS: tuple[MXGemmConfig, ...] = tuple(
    MXGemmConfig(a_dtype=a, b_dtype=b, out_dtype=o, has_bias=bias, **_PRODUCTION)
    for a, b, o, bias in itertools.product(ELEM_DTYPES, ELEM_DTYPES, GEMM_OUT_DTYPES, (False, True))
)
"""Every (a, b, out, bias) combination at the production tiling."""

MX_GEMM_TUNINGS: tuple[MXGemmConfig, ...] = (
    MXGemmConfig(tile_n=128, stages=6, tune=1),
    MXGemmConfig(tile_n=192, stages=5, cluster_m=2, tune=10),
)
"""The two comparison schedules of the e4m3 x e4m3 -> bf16 kernel (benchmarks/mx_gemm_kernel.py; built with
`tools/build_library.py --with-tunes`), both bit-identical to production: tune 1, the first kernel (128x128, no
cluster, 6 stages, rolled K loop): what the 128x192 tile and the cluster pair bought; tune 10, the previous production
(128x192, cluster pair, 5 stages, rolled K loop): what unrolling the ring and uniform descriptors bought."""
