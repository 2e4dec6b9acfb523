"""Variants of the GEMM operand producer (kernels/common/gemm_operands.py): quantize + align128 in one pass.

Supported by the kernel (everything else goes to the XLA reference): x (G, R, C) row-major bfloat16 /
float32, R and C multiples of 32 (not necessarily of 128); orientations "row" (contract along C), "col"
(contract along R, written transposed) or "both" (one read); elements float8_e4m3fn / float8_e5m2;
scale_rounding "up" / "floor"; round to nearest even. Built for sm_90a only: it feeds the Hopper MX GEMM (the
kernel is arch-neutral, kernels/common/gemm_operands.py); the Blackwell GEMM's producer is its blocked-scale
subclass (registry/blocked_operands.py, kernels/sm100/blocked_operands.py).
"""

from __future__ import annotations

import dataclasses
import itertools

from jax_mxfp8.kernels.registry.base import (
    DTYPE_CODE,
    ELEM_DTYPES,
    IN_DTYPES,
    ROUNDING_CODE,
    SCALE_ROUNDINGS,
    SHORT,
    KernelConfig,
)

ORIENTATIONS = ("row", "col", "both")
ORIENTATION_CODE = {"row": 0, "col": 1, "both": 2}


@dataclasses.dataclass(frozen=True)
class GemmOperandsConfig(KernelConfig):
    """MX quantize (formats.quantize numerics) followed by align128 (reference/gemm_align.py), one pass over x.

    Attributes:
      in_dtype: "bfloat16" or "float32".
      orientations: "row" -> data (G, R, Cp) and scale (G, Cp/128, R); "col" -> data (G, C, Rp) and scale
        (G, Rp/128, C) (x^T quantized along R); "both" -> the four, from one read of x.
      elem_dtype: "float8_e4m3fn" or "float8_e5m2".
      scale_rounding: "up" or "floor".
      min_ctas_per_sm: 0, or the CTAs (of 128 threads) per SM that ptxas must fit (register cap).
      tune: 0 for the production variant; > 0 for alternatives built only for benchmarks/gemm_operands.py.
    """

    op = "gemm_operands"
    kernels = {"sm_90a": "jax_mxfp8.kernels.sm90.quantize:gemm_operands_kernel"}
    key_fields = ("in_dtype", "orientations", "elem_dtype", "scale_rounding")
    codes = {
        "in_dtype": DTYPE_CODE,
        "orientations": ORIENTATION_CODE,
        "elem_dtype": DTYPE_CODE,
        "scale_rounding": ROUNDING_CODE,
    }

    in_dtype: str = "bfloat16"
    orientations: str = "both"
    elem_dtype: str = "float8_e4m3fn"
    scale_rounding: str = "up"
    min_ctas_per_sm: int = 0
    tune: int = 0

    def __post_init__(self):
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype={self.in_dtype!r} not in {IN_DTYPES}")
        if self.orientations not in ORIENTATIONS:
            raise ValueError(f"orientations={self.orientations!r} not in {ORIENTATIONS}")
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding={self.scale_rounding!r} not in {SCALE_ROUNDINGS}")

    @property
    def name(self) -> str:
        dtypes = f"{SHORT[self.in_dtype]}_{SHORT[self.elem_dtype]}"
        base = f"gemm_operands_{self.orientations}_{dtypes}_{self.scale_rounding}"
        return f"{base}_t{self.tune}" if self.tune else base


GEMM_OPERANDS_VARIANTS: tuple[GemmOperandsConfig, ...] = tuple(
    GemmOperandsConfig(in_dtype=i, orientations=o, elem_dtype=e, scale_rounding=r)
    for i, o, e, r in itertools.product(IN_DTYPES, ORIENTATIONS, ELEM_DTYPES, SCALE_ROUNDINGS)
)
# The comparison schedule of the bf16 "both" kernel (built with --with-tunes; ptxas gives the production one 143
# registers: 3 CTAs of 128 threads per SM): t1 = 4 CTAs per SM (<= 128 registers, with spills; measured 2-5%
# slower on the H200). Persistent CTAs with a cp.async shared-memory pipeline measured 0.62-0.64 of copy
# bandwidth against 0.74-0.80 and are not built (docs/perf/removed-variants.md).
GEMM_OPERANDS_TUNINGS: tuple[GemmOperandsConfig, ...] = (GemmOperandsConfig(min_ctas_per_sm=4, tune=1),)
