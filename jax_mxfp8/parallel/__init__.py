"""Distributed helpers: FSDP with quantized all-gather, context-parallel (ring) attention."""

from jax_mxfp8.parallel.fsdp import gather_quantized

__all__ = ["gather_quantized"]
