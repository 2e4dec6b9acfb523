"""Distributed helpers: FSDP with quantized all-gather, context-parallel (ring) attention."""

from jax_mxfp8.parallel.fsdp import gather_quantized
from jax_mxfp8.parallel.ring_attention import ring_attention

__all__ = ["gather_quantized", "ring_attention"]
