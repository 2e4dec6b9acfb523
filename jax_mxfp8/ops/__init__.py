"""Layer 6: public ops: argument checks, implementation choice (None | "xla" | "cuda") and custom_vjp."""

from jax_mxfp8.ops.attention import dot_product_attention
from jax_mxfp8.ops.varlen_attention import varlen_attention

__all__ = ["dot_product_attention", "varlen_attention"]
