"""Variants of the Blackwell attention operand producer (kernels/sm100/attention_operands.py), sm_100f only.

Supported by the kernel (everything else goes to the XLA formulation, primitives/attention_sm100_operands.py):
x (B, L, heads, H) row-major bfloat16 / float32, L a multiple of 32, H = the variant's head_dim (64 or 128);
32x32 square blocks over (L, H) per head (AttentionConfig.qkv_blocks "square"), elements float8_e4m3fn,
scale_rounding "up" / "floor", round to nearest even. One pass over x writes the E4M3 data (x's layout), the
square scales (B, L/32, heads, H/32) and both orientations' bytes in the tcgen05 128x4 layout the sm100
attention kernels read: "hd" (B, heads, ceil(L/128), 1, 512) and "seq" (B, heads, 1, ceil(L/128), 512), the
square byte repeated over its 32 rows (docs/interfaces.md "sm100 attention"). No separate re-layout pass.
"""

from __future__ import annotations

import dataclasses
import itertools

from jax_mxfp8.kernels.registry.base import DTYPE_CODE, IN_DTYPES, ROUNDING_CODE, SCALE_ROUNDINGS, SHORT, KernelConfig

HEAD_DIMS = (64, 128)
ELEM_DTYPES = ("float8_e4m3fn",)
"""The element dtype the sm100 attention kernels read."""


@dataclasses.dataclass(frozen=True)
class AttentionOperandsSm100Config(KernelConfig):
    """Square-block MX quantize of one attention operand with the sm100 kernels' blocked scales.

    Attributes:
      in_dtype: "bfloat16" or "float32".
      head_dim: 64 or 128 (H: which 32-column blocks of a row belong to which head).
      elem_dtype: "float8_e4m3fn".
      scale_rounding: "up" or "floor".
      tune: 0 (production; no comparison schedule).
    The kernel is the blocked GEMM producer's CTA tiling (128 x 128 tiles of the (B L, heads H) view, 4 warps of
    32 rows) with square blocks instead of row / column blocks.
    """

    op = "attention_operands_sm100"
    kernels = {"sm_100f": "jax_mxfp8.kernels.sm100.attention_operands:make_kernel"}
    key_fields = ("in_dtype", "head_dim", "elem_dtype", "scale_rounding")
    codes = {"in_dtype": DTYPE_CODE, "elem_dtype": DTYPE_CODE, "scale_rounding": ROUNDING_CODE}

    in_dtype: str = "bfloat16"
    head_dim: int = 128
    elem_dtype: str = "float8_e4m3fn"
    scale_rounding: str = "up"
    tune: int = 0

    orientations = "square"  # (the GEMM producer's attribute: neither row nor column blocks)
    min_ctas_per_sm = 0

    def __post_init__(self):
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype={self.in_dtype!r} not in {IN_DTYPES}")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim={self.head_dim} not in {HEAD_DIMS}")
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding={self.scale_rounding!r} not in {SCALE_ROUNDINGS}")

    @property
    def name(self) -> str:
        base = f"attention_operands_sm100_h{self.head_dim}_{SHORT[self.in_dtype]}_{SHORT[self.elem_dtype]}"
        base += f"_{self.scale_rounding}"
        return f"{base}_t{self.tune}" if self.tune else base


ATTENTION_OPERANDS_SM100_VARIANTS: tuple[AttentionOperandsSm100Config, ...] = tuple(
    AttentionOperandsSm100Config(in_dtype=i, head_dim=h, scale_rounding=r)
    for i, h, r in itertools.product(IN_DTYPES, HEAD_DIMS, SCALE_ROUNDINGS)
)
"""{bf16, f32} x H {64, 128} x e4m3 x {up, floor}: the producer of the sm100 attention forward's operands."""
