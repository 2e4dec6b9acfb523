"""Layer 1b: the public options and layout types of the ops (AttentionConfig, OperandLayouts, MXDotConfig).

Frozen, hashable dataclasses that every layer above `formats` may import (reference, kernels' callers,
primitives, ops, flax, parallel); they import nothing from jax_mxfp8 but `formats`. Their integer and
bool fields follow one rule (config/fields.py).
"""
