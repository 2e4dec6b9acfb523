"""Fused RMSNorm + MX quantize variants.

Supported by the kernel (everything else goes to the XLA reference): 2-D (M, D) row-major bfloat16 / float32
input, float32 weight (D,), float32 eps; y = x * rsqrt(mean(x^2) + eps) * w in x's dtype AND quantize(y) in row
blocks along D; D a multiple of 32 and at most max_threads * chunks * (16 / sizeof(x)) (32768 for bf16, 16384
for f32); elements float8_e4m3fn / float8_e5m2; scale_rounding "up" / "floor". The kernel is arch-neutral
(kernels/common/rms_norm_quantize.py); kernels/sm90/ and kernels/sm100/ name it. On Blackwell a second family of
variants (RMSNormQuantizeBlockedConfig, sm_100f) writes the scales in the 128x4 blocked layout the sm100 MX
GEMM reads (formats/blocked_scales.py): the RMSNorm -> QKV / MLP hand-off without a re-layout pass.
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
    every_arch,
)


@dataclasses.dataclass(frozen=True)
class RMSNormQuantizeConfig(KernelConfig):
    """Fused RMSNorm + MX quantize of a 2-D (M, D) array (row blocks along D).

    Attributes:
      in_dtype: "bfloat16" or "float32" (x and y); the weight is always float32 (the primitive casts it,
        exactly, as the reference's weight.astype(float32) does).
      elem_dtype: "float8_e4m3fn" or "float8_e5m2".
      scale_rounding: "up" or "floor".
      chunks: 16-byte vectors of x each thread holds in registers (compile-time bound); one CTA per row
        with T = roundup32(ceil(D / (V * chunks))) threads, V = 16 / sizeof(x).
      max_threads: the CTA size bound (the largest supported D is max_threads * chunks * V).
    """

    op = "rms_norm_quantize"
    kernels = every_arch("rms_norm_quantize_kernel")
    key_fields = ("in_dtype", "elem_dtype", "scale_rounding")
    codes = {"in_dtype": DTYPE_CODE, "elem_dtype": DTYPE_CODE, "scale_rounding": ROUNDING_CODE}

    in_dtype: str = "bfloat16"
    elem_dtype: str = "float8_e4m3fn"
    scale_rounding: str = "up"
    chunks: int = 8
    max_threads: int = 512
    tune: int = 0

    def __post_init__(self):
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype={self.in_dtype!r} not in {IN_DTYPES}")
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding={self.scale_rounding!r} not in {SCALE_ROUNDINGS}")
        if self.max_threads % 32 or not 32 <= self.max_threads <= 1024:
            raise ValueError(f"max_threads={self.max_threads} must be a multiple of 32 in [32, 1024]")

    @property
    def vec(self) -> int:
        return 8 if self.in_dtype == "bfloat16" else 4

    @property
    def max_d(self) -> int:
        return self.max_threads * self.chunks * self.vec

    @property
    def max_cols(self) -> int:
        return self.max_d

    @property
    def name(self) -> str:
        base = f"rms_norm_quantize_{SHORT[self.in_dtype]}_{SHORT[self.elem_dtype]}_{self.scale_rounding}"
        return f"{base}_t{self.tune}" if self.tune else base


RMS_NORM_QUANTIZE_VARIANTS: tuple[RMSNormQuantizeConfig, ...] = tuple(
    RMSNormQuantizeConfig(in_dtype=i, elem_dtype=e, scale_rounding=r)
    for i, e, r in itertools.product(IN_DTYPES, ELEM_DTYPES, SCALE_ROUNDINGS)
)


@dataclasses.dataclass(frozen=True)
class RMSNormQuantizeBlockedConfig(RMSNormQuantizeConfig):
    """RMSNormQuantizeConfig whose scales go to the 128x4 blocked layout (Blackwell, sm_100f): x viewed as
    (G, R, D) (the handler: G the leading axes but the last, R the last but one), scale (G, ceil(R/128),
    ceil(D/128), 512) uint8, padding bytes 0 (the handler zero-fills the buffer, the kernel writes every
    real byte). Same fields and numerics as RMSNormQuantizeConfig."""

    kernels = {"sm_100f": "jax_mxfp8.kernels.sm100.quantize:rms_norm_quantize_kernel"}
    table_fields = ("blocked_scales",)

    @property
    def blocked_scales(self) -> bool:
        """True: the table field the handler checks the target against (jax_mxfp8_rms_norm_quantize_blocked)."""
        return True

    @property
    def name(self) -> str:
        base = f"rms_norm_quantize_blocked_{SHORT[self.in_dtype]}_{SHORT[self.elem_dtype]}_{self.scale_rounding}"
        return f"{base}_t{self.tune}" if self.tune else base


RMS_NORM_QUANTIZE_BLOCKED_VARIANTS: tuple[RMSNormQuantizeBlockedConfig, ...] = tuple(
    RMSNormQuantizeBlockedConfig(in_dtype=i, elem_dtype="float8_e4m3fn", scale_rounding=r)
    for i, r in itertools.product(IN_DTYPES, SCALE_ROUNDINGS)
)
"""{bf16, f32} x e4m3 (the sm100 GEMM's operand dtype) x {up, floor}."""
