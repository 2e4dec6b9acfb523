"""jax_mxfp8: MXFP8 block-scaled attention, GEMM and fused-quantization ops for JAX and Flax.

Public API: MXArray, quantize, dequantize, mx_dot_general, rms_norm_quantize,
dot_product_attention, varlen_attention, broadcast_query_attention; opt-in MX gradients of K and V:
jax_mxfp8.ops.attention_grads (dot_product_attention_vjp, varlen_attention_vjp).
"""

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.formats import MXArray, random_hadamard
from jax_mxfp8.ops.attention import dot_product_attention
from jax_mxfp8.ops.broadcast_attention import broadcast_query_attention
from jax_mxfp8.ops.mx_dot_general import mx_dot_general
from jax_mxfp8.ops.quantize import dequantize, quantize
from jax_mxfp8.ops.rms_norm_quantize import rms_norm_quantize
from jax_mxfp8.ops.varlen_attention import varlen_attention

__version__ = "0.1.0"

__all__ = [
    "AttentionConfig",
    "MXArray",
    "MXDotConfig",
    "broadcast_query_attention",
    "dequantize",
    "dot_product_attention",
    "mx_dot_general",
    "quantize",
    "random_hadamard",
    "rms_norm_quantize",
    "varlen_attention",
]
