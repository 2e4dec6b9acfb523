"""Layer 7: Flax NNX and Linen modules with MXFP8 GEMMs and attention, a per-layer precision policy, and
adapters for stock Flax modules."""

from jax_mxfp8.flax import linen_modules as linen
from jax_mxfp8.flax.adapters import attention_fn, dot_general
from jax_mxfp8.flax.nnx_modules import MXMLP, MXAttention, MXLinear, MXRMSNorm, TransformerBlock, use_quantized_gather
from jax_mxfp8.flax.policy import BF16, MXFP8, LayerPrecision, PrecisionPolicy

__all__ = [
    "BF16",
    "MXFP8",
    "LayerPrecision",
    "MXAttention",
    "MXLinear",
    "MXMLP",
    "MXRMSNorm",
    "PrecisionPolicy",
    "TransformerBlock",
    "attention_fn",
    "dot_general",
    "linen",
    "use_quantized_gather",
]
