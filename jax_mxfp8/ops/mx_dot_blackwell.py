"""The Blackwell (compute capability 10.x) path of `mx_dot_general`: jax.nn.scaled_dot_general.

On Blackwell, cuDNN's block-scaled GEMM (tcgen05 with hardware per-32 E8M0 scales) runs the contract's
GEMM directly, and jax.nn.scaled_dot_general with three "mxfp8" configs is the contract's numerics: the
same quantization (blocks of 32 along the contracting axis, scale 2^ceil(log2(amax / 448)), E4M3 round to
nearest; bit-identical, tests/quantize/test_formats_jaxnn.py) in the forward and both backward GEMMs (G along N for
the lhs gradient, along M for the rhs gradient). So mx_dot_general hands such calls to it; our own kernels
run on Blackwell only where they add something jax.nn does not have (a fused epilogue).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.gemm import MXDotConfig

_E4M3 = np.dtype(jnp.float8_e4m3fn)


def cudnn_unsupported(config: MXDotConfig, *, sizes: tuple[int, int, int, int], prequantized: bool) -> str | None:
    """Why jax.nn.scaled_dot_general does not run this call with the contract's numerics (None when it does).

    Args:
      config: the call's MXDotConfig.
      sizes: (G, M, N, K) of the flattened GEMM.
      prequantized: whether the caller passed lhs_quantized / rhs_quantized (jax.nn quantizes itself).
    """
    if config.dtype != _E4M3 or config.grad_dtype != _E4M3:
        return "jax.nn's mxfp8 config uses float8_e4m3fn operands and gradients"
    if config.scale_rounding != "up":
        return "jax.nn's mxfp8 config rounds scales up (scale_rounding='up')"
    if config.grad_rounding != "nearest" or config.hadamard_seed is not None or config.weight_grad != "mxfp8":
        return "stochastic rounding, Hadamard transforms and the bf16 weight gradient run in the XLA reference"
    if prequantized:
        return "pre-quantized operands (jax.nn.scaled_dot_general quantizes its own inputs)"
    _, m, n, k = sizes
    if m % 32 or n % 32 or k % 32:
        return f"M, N and K must be multiples of 32 for jax.nn's block-scaled backward GEMMs, got {(m, n, k)}"
    return None


def cudnn_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, out_dtype) -> jax.Array:
    """lax.dot_general's result through jax.nn.scaled_dot_general with mxfp8 configs (differentiable)."""
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    return jax.nn.scaled_dot_general(
        lhs, rhs, dimension_numbers, preferred_element_type=out_dtype, configs=[cfg, cfg, cfg]
    )
