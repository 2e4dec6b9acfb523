"""Variants of the Blackwell MX GEMM's operand producer (kernels/sm100/blocked_operands.py), sm_100f only.

Supported by the kernel (everything else goes to the XLA reference): x (G, R, C) row-major bfloat16 /
float32, R and C multiples of 32; orientations "row" (blocks along C, data in x's layout), "col" (blocks
along R, data transposed to (G, C, R)) or "both" (one read); elements float8_e4m3fn (the sm100 GEMM's
operands); scale_rounding "up" / "floor"; round to nearest even. The scales are E8M0 bytes in the 128x4
blocked layout (formats/blocked_scales.py): exactly formats.quantize's, no 128-run alignment.
"""

from __future__ import annotations

import dataclasses
import itertools

from jax_mxfp8.kernels.registry.base import IN_DTYPES, SCALE_ROUNDINGS, SHORT
from jax_mxfp8.kernels.registry.gemm_operands import GemmOperandsConfig

BLOCKED_ELEM_DTYPES = ("float8_e4m3fn",)
"""The element dtypes built: the Blackwell MX GEMM's operand dtype."""


@dataclasses.dataclass(frozen=True)
class BlockedOperandsConfig(GemmOperandsConfig):
    """MX quantize (formats.quantize numerics) with blocked scales, one pass over x (G, R, C).

    Attributes (GemmOperandsConfig's):
      in_dtype: "bfloat16" or "float32".
      orientations: "row" -> data (G, R, C) and scale (G, ceil(R/128), ceil(C/128), 512); "col" -> data
        (G, C, R) and scale (G, ceil(C/128), ceil(R/128), 512) (x^T quantized along R); "both" -> the four.
      elem_dtype: "float8_e4m3fn".
      scale_rounding: "up" or "floor".
      min_ctas_per_sm, tune: as GemmOperandsConfig's.
    """

    op = "blocked_operands"
    kernels = {"sm_100f": "jax_mxfp8.kernels.sm100.blocked_operands:make_kernel"}

    def __post_init__(self):
        super().__post_init__()
        if self.elem_dtype not in BLOCKED_ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {BLOCKED_ELEM_DTYPES}")

    @property
    def name(self) -> str:
        dtypes = f"{SHORT[self.in_dtype]}_{SHORT[self.elem_dtype]}"
        base = f"blocked_operands_{self.orientations}_{dtypes}_{self.scale_rounding}"
        return f"{base}_t{self.tune}" if self.tune else base


BLOCKED_OPERANDS_VARIANTS: tuple[BlockedOperandsConfig, ...] = tuple(
    BlockedOperandsConfig(in_dtype=i, orientations=o, elem_dtype=e, scale_rounding=r)
    for i, o, e, r in itertools.product(IN_DTYPES, ("row", "col", "both"), BLOCKED_ELEM_DTYPES, SCALE_ROUNDINGS)
)
"""{bf16, f32} x {row, col, both} x e4m3 x {up, floor}: the producers of mx_dot_general's sm100 kernel path
and of quantize(..., scale_layout="blocked") on Blackwell."""
