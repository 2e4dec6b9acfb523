"""Distributed helpers: FSDP with quantized all-gather, context-parallel (ring) attention."""

from jax_mxfp8.parallel.fsdp import fsdp_mx_dot, gather_quantized
from jax_mxfp8.parallel.ring_attention import ring_attention

__all__ = ["fsdp_mx_dot", "gather_quantized", "ring_attention"]
