"""Quantize and dequantize variants: one frozen config per compiled kernel.

Supported by the kernels (everything else goes to the XLA reference):
  quantize: 2-D (M, K) row-major bfloat16 / float32 input, M and K multiples of 32;
            modes "rowcol" (row blocks along K AND column blocks along M, one pass), "row", "col",
            "square" (32x32); elements float8_e4m3fn / float8_e5m2; scale_rounding "up" / "floor";
            round-to-nearest-even only (no stochastic rounding).
  dequantize: 2-D (M, K) float8_e4m3fn / float8_e5m2 data with "row" (along K), "col" (along M) or
            "square" scales, to bfloat16 / float32.
Both kernels are arch-neutral (kernels/common/quantize.py); kernels/sm90/ and kernels/sm100/ name them.
"""

from __future__ import annotations

import dataclasses
import itertools

from jax_mxfp8.kernels.registry.base import (
    DEQUANTIZE_BLOCKS,
    DEQUANTIZE_OUT_DTYPES,
    DTYPE_CODE,
    ELEM_DTYPES,
    IN_DTYPES,
    MODE_CODE,
    QUANTIZE_MODES,
    ROUNDING_CODE,
    SCALE_ROUNDINGS,
    SHORT,
    KernelConfig,
    every_arch,
)


@dataclasses.dataclass(frozen=True)
class QuantizeConfig(KernelConfig):
    """One-pass MX quantize of a 2-D (M, K) array.

    Attributes:
      in_dtype: "bfloat16" or "float32".
      mode: "rowcol" (both orientations from one read), "row" (blocks along K), "col" (blocks along M)
        or "square" (32x32 blocks).
      elem_dtype: "float8_e4m3fn" or "float8_e5m2".
      scale_rounding: "up" (cvt.rp ue8m0 rule, default) or "floor" (OCP v1.0).
      warps_per_cta: warps per CTA; each warp owns a 32-row x (rows_per_thread * 16/sizeof(in)) tile.
      rows_per_thread: rows each lane holds (16: two half-warps split the 32 rows of a tile; 8: four
        quarter-warps); smaller means fewer registers and shorter contiguous row segments.
      row_scale_store: "byte" (v1: each lane stores single scale bytes of the rows it is responsible
        for, so each 32-byte sector of the row-scale array is written in 4-byte pieces by 8 warps) or
        "smem" (v2, production for "rowcol" and "row": a CTA owns a strip of 32 rows x warps_per_cta *
        tiles_per_warp tiles along K, stages the strip's row-scale bytes in shared memory and stores them
        as whole 8-byte words after a barrier: strip_bytes = warps * tiles_per_warp * tile_cols / 32 per
        row, 32 = one whole sector for the production variants).
      tiles_per_warp: with row_scale_store="smem", tiles per warp in the CTA's strip (at step i the
        warps take adjacent tiles); 1 otherwise (each warp quantizes one tile).
      min_ctas_per_sm: 0, or the CTAs per SM that ptxas must fit (a register cap of
        65536 / (min_ctas_per_sm * 32 * warps_per_cta) per thread).
      tune: 0 for the production variant of these parameters; > 0 for the comparison schedules
        (TUNING_VARIANTS, benchmarks only).
    """

    op = "quantize"
    kernels = every_arch("quantize_kernel")
    key_fields = ("in_dtype", "mode", "elem_dtype", "scale_rounding")
    codes = {"in_dtype": DTYPE_CODE, "mode": MODE_CODE, "elem_dtype": DTYPE_CODE, "scale_rounding": ROUNDING_CODE}

    in_dtype: str = "bfloat16"
    mode: str = "rowcol"
    elem_dtype: str = "float8_e4m3fn"
    scale_rounding: str = "up"
    warps_per_cta: int = 4
    rows_per_thread: int = 16
    row_scale_store: str = "byte"
    tiles_per_warp: int = 1
    min_ctas_per_sm: int = 0
    tune: int = 0

    def __post_init__(self):
        if self.tiles_per_warp < 1 or (self.tiles_per_warp > 1 and self.row_scale_store != "smem"):
            raise ValueError(f"tiles_per_warp={self.tiles_per_warp}: >= 1, and > 1 only with row_scale_store='smem'")
        if self.rows_per_thread not in (8, 16):
            raise ValueError(f"rows_per_thread={self.rows_per_thread} not in (8, 16)")
        if self.row_scale_store not in ("byte", "smem"):
            raise ValueError(f"row_scale_store={self.row_scale_store!r} not in ('byte', 'smem')")
        if self.row_scale_store == "smem":
            strip = self.warps_per_cta * self.tiles_per_warp * self.rows_per_thread * (16 // self.in_bytes) // 32
            if strip % 8 or self.mode not in ("rowcol", "row"):
                raise ValueError(f"row_scale_store='smem' needs mode rowcol/row and 8 | strip bytes, got {self}")
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype={self.in_dtype!r} not in {IN_DTYPES}")
        if self.mode not in QUANTIZE_MODES:
            raise ValueError(f"mode={self.mode!r} not in {QUANTIZE_MODES}")
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding={self.scale_rounding!r} not in {SCALE_ROUNDINGS}")

    @property
    def in_bytes(self) -> int:
        return 2 if self.in_dtype == "bfloat16" else 4

    @property
    def name(self) -> str:
        base = f"quantize_{self.mode}_{SHORT[self.in_dtype]}_{SHORT[self.elem_dtype]}_{self.scale_rounding}"
        return f"{base}_t{self.tune}" if self.tune else base


@dataclasses.dataclass(frozen=True)
class DequantizeConfig(KernelConfig):
    """MX dequantize of 2-D (M, K) FP8 data with row / col / square E8M0 scales.

    Attributes:
      elem_dtype: "float8_e4m3fn" or "float8_e5m2".
      block: "row" (scale (M, K/32)), "col" (scale (M/32, K)) or "square" (scale (M/32, K/32)).
      out_dtype: "bfloat16", "float32" or "float16" (finite values saturate to the dtype's largest).
      threads_per_cta: threads per CTA; each thread converts 16 consecutive elements of one row.
    """

    op = "dequantize"
    kernels = every_arch("dequantize_kernel")
    key_fields = ("elem_dtype", "block", "out_dtype")
    codes = {"elem_dtype": DTYPE_CODE, "block": MODE_CODE, "out_dtype": DTYPE_CODE}

    elem_dtype: str = "float8_e4m3fn"
    block: str = "row"
    out_dtype: str = "bfloat16"
    threads_per_cta: int = 256

    def __post_init__(self):
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.block not in DEQUANTIZE_BLOCKS:
            raise ValueError(f"block={self.block!r} not in {DEQUANTIZE_BLOCKS}")
        if self.out_dtype not in DEQUANTIZE_OUT_DTYPES:
            raise ValueError(f"out_dtype={self.out_dtype!r} not in {DEQUANTIZE_OUT_DTYPES}")

    @property
    def name(self) -> str:
        return f"dequantize_{self.block}_{SHORT[self.elem_dtype]}_{SHORT[self.out_dtype]}"


def _production_quantize(in_dtype: str, mode: str, elem_dtype: str, scale_rounding: str) -> QuantizeConfig:
    """v2 for the modes with row blocks along K: row scales staged in shared memory, stored as whole
    32-byte sectors (2 tiles per warp for bf16, 4 for f32, 4 warps; the bf16 row+col kernel capped at
    168 registers like v1); v1 otherwise."""
    kw = {}
    if mode in ("rowcol", "row"):
        kw = dict(row_scale_store="smem", tiles_per_warp=2 if in_dtype == "bfloat16" else 4)
        if (in_dtype, mode) == ("bfloat16", "rowcol"):
            kw["min_ctas_per_sm"] = 3  # keep v1's 3 CTAs (12 warps) per SM: <= 168 registers
    return QuantizeConfig(in_dtype=in_dtype, mode=mode, elem_dtype=elem_dtype, scale_rounding=scale_rounding, **kw)


QUANTIZE_VARIANTS: tuple[QuantizeConfig, ...] = tuple(
    _production_quantize(i, m, e, r)
    for i, m, e, r in itertools.product(IN_DTYPES, QUANTIZE_MODES, ELEM_DTYPES, SCALE_ROUNDINGS)
)
TUNING_VARIANTS: tuple[QuantizeConfig, ...] = (
    QuantizeConfig(tune=1),
    QuantizeConfig(row_scale_store="smem", tiles_per_warp=1, min_ctas_per_sm=3, tune=2),
)
"""The two comparison schedules of the bf16 row+col kernel (benchmarks/quantize.py; built with
`tools/build_library.py --with-tunes`), bit-exact to production: tune 1, v1 (row-scale bytes stored from the
registers): what staging the row scales bought; tune 2, staged with half production's strip (16-byte pieces per
row): the strip width. docs/perf/removed-variants.md: the measurements, and the schedules no longer built."""
DEQUANTIZE_VARIANTS: tuple[DequantizeConfig, ...] = tuple(
    DequantizeConfig(elem_dtype=e, block=b, out_dtype=o)
    for e, b, o in itertools.product(ELEM_DTYPES, DEQUANTIZE_BLOCKS, DEQUANTIZE_OUT_DTYPES)
)
