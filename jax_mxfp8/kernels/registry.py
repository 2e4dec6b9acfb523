"""The ahead-of-time kernel variants: one frozen config per compiled kernel.

Pure Python (no CuTe DSL import), so the primitives layer, the build tool and the tests all read the
same list. `tools/build_kernels.py` compiles every variant in `VARIANTS` for every arch in `ARCHS`;
`csrc/` looks a variant up by the fields below (the generated table `kernels_table.inc` carries them as
integers, see `*_code` properties), so adding a variant here is the only change needed to ship it.

Supported by the kernels (everything else goes to the XLA reference):
  quantize: 2-D (M, K) row-major bfloat16 / float32 input, M and K multiples of 32;
            modes "rowcol" (row blocks along K AND column blocks along M, one pass), "row", "col",
            "square" (32x32); elements float8_e4m3fn / float8_e5m2; scale_rounding "up" / "floor";
            round-to-nearest-even only (no stochastic rounding).
  dequantize: 2-D (M, K) float8_e4m3fn / float8_e5m2 data with "row" (along K), "col" (along M) or
            "square" scales, to bfloat16 / float32.
"""

from __future__ import annotations

import dataclasses
import itertools

ARCHS = ("sm_90a", "sm_100a")
"""Targets every variant is compiled for. Blackwell (sm_100a) cubins are built and inspected, not run."""

ARCH_MAJOR = {"sm_90a": 9, "sm_100a": 10}

IN_DTYPES = ("bfloat16", "float32")
ELEM_DTYPES = ("float8_e4m3fn", "float8_e5m2")
SCALE_ROUNDINGS = ("up", "floor")
QUANTIZE_MODES = ("rowcol", "row", "col", "square")
DEQUANTIZE_BLOCKS = ("row", "col", "square")

# Integer codes shared with csrc/common.h (keep in sync; the build writes them into the table).
DTYPE_CODE = {"bfloat16": 0, "float32": 1, "float8_e4m3fn": 2, "float8_e5m2": 3}
MODE_CODE = {"rowcol": 0, "row": 1, "col": 2, "square": 3}
ROUNDING_CODE = {"up": 0, "floor": 1}

_SHORT = {"bfloat16": "bf16", "float32": "f32", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
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
      l2_prefetch: 0, or 128 / 256 for the loads' L2::<n>B prefetch hint.
      row_scale_store: "byte" (each lane stores single scale bytes of the rows it is responsible for) or
        "transpose" (the scale bytes of a row are gathered into one lane by shuffles and stored as one
        word: R/4 x nb shuffles instead of R byte stores per lane).
      tune: 0 for the production variant of these parameters; > 0 for alternative tunings built only
        for benchmarks (selected through the FFI attribute `tune`).
    """

    in_dtype: str = "bfloat16"
    mode: str = "rowcol"
    elem_dtype: str = "float8_e4m3fn"
    scale_rounding: str = "up"
    warps_per_cta: int = 4
    rows_per_thread: int = 16
    l2_prefetch: int = 0
    row_scale_store: str = "byte"
    tune: int = 0

    def __post_init__(self):
        if self.rows_per_thread not in (8, 16):
            raise ValueError(f"rows_per_thread={self.rows_per_thread} not in (8, 16)")
        if self.row_scale_store not in ("byte", "transpose"):
            raise ValueError(f"row_scale_store={self.row_scale_store!r} not in ('byte', 'transpose')")
        if self.l2_prefetch not in (0, 128, 256):
            raise ValueError(f"l2_prefetch={self.l2_prefetch} not in (0, 128, 256)")
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype={self.in_dtype!r} not in {IN_DTYPES}")
        if self.mode not in QUANTIZE_MODES:
            raise ValueError(f"mode={self.mode!r} not in {QUANTIZE_MODES}")
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding={self.scale_rounding!r} not in {SCALE_ROUNDINGS}")

    @property
    def name(self) -> str:
        base = f"quantize_{self.mode}_{_SHORT[self.in_dtype]}_{_SHORT[self.elem_dtype]}_{self.scale_rounding}"
        return f"{base}_t{self.tune}" if self.tune else base

    @property
    def op(self) -> str:
        return "quantize"


@dataclasses.dataclass(frozen=True)
class DequantizeConfig:
    """MX dequantize of 2-D (M, K) FP8 data with row / col / square E8M0 scales.

    Attributes:
      elem_dtype: "float8_e4m3fn" or "float8_e5m2".
      block: "row" (scale (M, K/32)), "col" (scale (M/32, K)) or "square" (scale (M/32, K/32)).
      out_dtype: "bfloat16" or "float32".
      threads_per_cta: threads per CTA; each thread converts 16 consecutive elements of one row.
    """

    elem_dtype: str = "float8_e4m3fn"
    block: str = "row"
    out_dtype: str = "bfloat16"
    threads_per_cta: int = 256

    def __post_init__(self):
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.block not in DEQUANTIZE_BLOCKS:
            raise ValueError(f"block={self.block!r} not in {DEQUANTIZE_BLOCKS}")
        if self.out_dtype not in IN_DTYPES:
            raise ValueError(f"out_dtype={self.out_dtype!r} not in {IN_DTYPES}")

    @property
    def name(self) -> str:
        return f"dequantize_{self.block}_{_SHORT[self.elem_dtype]}_{_SHORT[self.out_dtype]}"

    @property
    def op(self) -> str:
        return "dequantize"


QUANTIZE_VARIANTS: tuple[QuantizeConfig, ...] = tuple(
    QuantizeConfig(in_dtype=i, mode=m, elem_dtype=e, scale_rounding=r)
    for i, m, e, r in itertools.product(IN_DTYPES, QUANTIZE_MODES, ELEM_DTYPES, SCALE_ROUNDINGS)
)
# Alternative tunings of the bf16 row+col kernel, built for benchmarks/quantize.py (tune > 0).
TUNING_VARIANTS: tuple[QuantizeConfig, ...] = (
    QuantizeConfig(row_scale_store="transpose", tune=1),
    QuantizeConfig(rows_per_thread=8, tune=2),
    QuantizeConfig(rows_per_thread=8, row_scale_store="transpose", tune=3),
    QuantizeConfig(row_scale_store="transpose", warps_per_cta=8, tune=4),
)
DEQUANTIZE_VARIANTS: tuple[DequantizeConfig, ...] = tuple(
    DequantizeConfig(elem_dtype=e, block=b, out_dtype=o)
    for e, b, o in itertools.product(ELEM_DTYPES, DEQUANTIZE_BLOCKS, IN_DTYPES)
)
VARIANTS = QUANTIZE_VARIANTS + TUNING_VARIANTS + DEQUANTIZE_VARIANTS


def find_quantize(in_dtype: str, mode: str, elem_dtype: str, scale_rounding: str) -> QuantizeConfig | None:
    """The registered (production) quantize variant for these parameters, or None when no kernel covers them."""
    for v in QUANTIZE_VARIANTS:
        if (v.in_dtype, v.mode, v.elem_dtype, v.scale_rounding) == (in_dtype, mode, elem_dtype, scale_rounding):
            return v
    return None


def find_dequantize(elem_dtype: str, block: str, out_dtype: str) -> DequantizeConfig | None:
    """The registered dequantize variant for these parameters, or None."""
    for v in DEQUANTIZE_VARIANTS:
        if (v.elem_dtype, v.block, v.out_dtype) == (elem_dtype, block, out_dtype):
            return v
    return None
