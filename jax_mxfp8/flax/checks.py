"""Argument checks of the Flax layer's config objects and modules (ValueError naming the argument)."""

from __future__ import annotations

from collections.abc import Iterable

import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.attention import AttentionConfig


def check_bool(value, name: str) -> bool:
    """value as a Python bool; ValueError naming `name` unless it is a bool or a NumPy bool (never truthiness:
    "no", 0, 1, None and arrays are refused)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r} must be a bool (True or False), got {type(value).__name__}")
    return bool(value)


def patterns(value, name: str) -> tuple[str, ...]:
    """Layer-name glob patterns as a tuple. A str is ONE pattern ("lm_head" -> ("lm_head",), never its
    characters); otherwise an iterable of non-empty str. ValueError naming `name` for anything else."""
    if isinstance(value, str):
        value = (value,)
    elif isinstance(value, bytes) or not isinstance(value, Iterable):
        raise ValueError(f"{name}={value!r} must be a str pattern or a sequence of str patterns")
    out = tuple(value)
    for i, p in enumerate(out):
        if not isinstance(p, str) or not p:
            raise ValueError(f"{name}[{i}]={p!r} must be a non-empty str")
    return out


def check_attention_config(value, name: str = "attention_config") -> AttentionConfig | None:
    """value if it is an AttentionConfig or None, else a ValueError naming `name`."""
    if value is not None and not isinstance(value, AttentionConfig):
        raise ValueError(f"{name} must be an AttentionConfig or None; got {type(value).__name__}")
    return value


def check_input(x, module: str, rank: int | None = None) -> None:
    """ValueError naming the module and its argument x unless x is a floating-point array, of rank `rank`
    when given (an attention layer's (B, T, D) or (T_total, D)), else of rank >= 1.

    The modules check x themselves so that a bad x is refused alike under every precision (the BF16 path
    would otherwise compute with an integer x) and the message names the module's argument, not the
    `lhs` of the GEMM it reaches first."""
    shape = np.shape(x)
    if rank is not None and len(shape) != rank:
        layout = "(B, T, D) for dense attention" if rank == 3 else "(T_total, D) for packed sequences"
        raise ValueError(f"{module}: x must be {layout}; got shape {shape}")
    if len(shape) < 1:
        raise ValueError(f"{module}: x must have rank >= 1 (..., features); got shape {shape}")
    dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{module}: x has dtype {dtype}; pass a floating-point x (float32, bfloat16 or float16)")
