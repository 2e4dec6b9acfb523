"""Hopper MX GEMM variants with a quantize epilogue (kernels/sm90/mx_gemm_epilogue.py), sm_90a only.

The mainloop is the MX GEMM's (registry/gemm.py, MXGemmConfig: same fields, same production tiling); the
epilogue writes the output as MX row blocks along N instead of (or besides) a bf16 / f32 C:

  y   = acc (+ bias[n])                      float32: the promoted accumulator, one IEEE add of the bias
  z   = gelu_tanh(y) if activation == "gelu" else y      (float32, jax.nn.gelu's default tanh form)
  q, s = quantize(z, axis=-1)                E4M3 data (G, M, N) + uint8 E8M0 scales (G, M, N/32), the
                                             contract's default rule (scale_rounding "up", RNE, saturating)
  pre = bf16(y)  when store_pre              the pre-activation output a GELU backward needs
  qc, sc = align128(quantize(z, axis=-2))    store_col: the COLUMN orientation (blocks of 32 along M, one
                                             exponent per 128 M), written transposed: E4M3 (G, N, Mp) +
                                             float32 run scales (G, Mp/128, N), Mp = M rounded up to 128;
                                             exactly gemm_operands' "col" output of z (the operand a
                                             wgrad GEMM contracting over M takes)

"Reference output" of the contract: z, the float32 value before any bfloat16 rounding; (q, s) are bit for
bit jax_mxfp8.quantize(z). For activation "" z is the kernel's float32 accumulator (+ bias) itself, so the
bits equal quantize(the plain MX GEMM's float32 output); the GELU's tanh is the hardware tanh.approx.f32
(not XLA's), so with "gelu" the elements agree with quantize(jax.nn.gelu(y)) only up to FP8 rounding
ties of a ~2^-11 relative difference (docs/numerics.md "Quantize epilogues").
"""

from __future__ import annotations

import dataclasses
import itertools

from jax_mxfp8.kernels.registry.base import DTYPE_CODE, SHORT
from jax_mxfp8.kernels.registry.gemm import _PRODUCTION, MXGemmConfig

EPILOGUE_ACTIVATIONS = ("", "gelu")
ACTIVATION_CODE = {"": 0, "gelu": 1}
MX_EPILOGUE_ELEM = "float8_e4m3fn"
"""The element dtype of the quantized output (the forward GEMMs' operand dtype)."""


@dataclasses.dataclass(frozen=True)
class MXGemmEpilogueConfig(MXGemmConfig):
    """One compiled MX GEMM with the MX quantize epilogue (kernels/sm90/mx_gemm_epilogue.py).

    Attributes (besides MXGemmConfig's, which keep their meaning):
      activation: "" or "gelu" (tanh form, float32, applied after the bias and before the quantization).
      store_pre: also write the pre-activation y = acc (+ bias) in out_dtype (bfloat16): the residual of the
        GELU backward, or (activation "") the high-precision output the next GEMM's backward needs.
      out_dtype: the dtype of the pre-activation output (bfloat16); unused when not store_pre.
      paired_stores: lanes q and q ^ 1 of a quad swap 16-bit halves (one shfl.bfly) so that each lane
        stores 4 contiguous FP8 bytes (two 32-bit stores per block and row instead of four 16-bit ones;
        the quad writes 16 contiguous bytes per instruction, like the bf16 epilogue). Production; False
        (tune 1, the comparison schedule) stores four 16-bit pieces per block and row.
      store_col: also write z's column orientation (blocks of 32 along M, aligned to one exponent per 128
        M: the CTA tile's 128 rows), transposed (K-major for the next wgrad GEMM): the column amax crosses
        the tile's 8 consumer warps through shared memory, the FP8 tile is transposed through shared
        memory (kernels/sm90/mx_gemm_epilogue.py). Needs store_pre (the training forward, which also keeps
        pre) and M a multiple of 32 (the handler checks it).
    The quantized output is always E4M3 with scale_rounding "up" (MX_EPILOGUE_ELEM), blocks of 32 along N
    (N must be a multiple of 32; the handler checks it).
    """

    op = "mx_gemm_mx"
    kernels = {"sm_90a": "jax_mxfp8.kernels.sm90.mx_gemm_epilogue:make_kernel"}
    key_fields = ("a_dtype", "b_dtype", "has_bias", "activation", "store_pre", "store_col")
    codes = {"a_dtype": DTYPE_CODE, "b_dtype": DTYPE_CODE, "activation": ACTIVATION_CODE}

    activation: str = ""
    store_pre: bool = False
    paired_stores: bool = False
    store_col: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.activation not in EPILOGUE_ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} not in {EPILOGUE_ACTIVATIONS}")
        if self.out_dtype != "bfloat16":
            raise ValueError(f"out_dtype={self.out_dtype!r}: the pre-activation output is bfloat16")
        if self.tile_n % 32:
            raise ValueError(f"the MX epilogue needs tile_n a multiple of 32 (got {self.tile_n})")
        if self.store_col and (not self.store_pre or self.tile_m != 128 or (self.tile_n * 8) % 256):
            raise ValueError("store_col needs store_pre, tile_m 128 (one 128-row run per tile), tile_n * 8 % 256 == 0")

    @property
    def name(self) -> str:
        base = f"mx_gemm_mx_{SHORT[self.a_dtype]}_{SHORT[self.b_dtype]}"
        base += "_bias" if self.has_bias else ""
        base += f"_{self.activation}" if self.activation else ""
        base += "_pre" if self.store_pre else ""
        base += "_col" if self.store_col else ""
        return f"{base}_t{self.tune}" if self.tune else base


MX_GEMM_EPILOGUE_COL_VARIANTS: tuple[MXGemmEpilogueConfig, ...] = tuple(
    MXGemmEpilogueConfig(
        has_bias=bias, activation=act, store_pre=True, store_col=True, paired_stores=True, **_PRODUCTION
    )
    for bias, act in itertools.product((False, True), EPILOGUE_ACTIVATIONS)
)
"""store_col (row + column orientations, with pre): {no bias, bias} x {identity, gelu}, production tiling."""

MX_GEMM_EPILOGUE_VARIANTS: tuple[MXGemmEpilogueConfig, ...] = (
    tuple(
        MXGemmEpilogueConfig(has_bias=bias, activation=act, store_pre=pre, paired_stores=True, **_PRODUCTION)
        for bias, act, pre in itertools.product((False, True), EPILOGUE_ACTIVATIONS, (False, True))
    )
    + MX_GEMM_EPILOGUE_COL_VARIANTS
    + (MXGemmEpilogueConfig(paired_stores=False, tune=1, **_PRODUCTION),)
)
"""E4M3 x E4M3 (the forward GEMM) at the production tiling: {no bias, bias} x {identity, gelu} x {pre or not};
all with paired_stores (on the H200 1.01 / 0.96 / 1.05x the plain GEMM, vs 0.98 / 0.89 / 1.05 with 16-bit
stores; docs/perf/gemm.md); the four store_col variants; then the comparison schedule
t1 (built with --with-tunes): 16-bit stores (identity, no bias)."""
