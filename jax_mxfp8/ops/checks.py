"""Argument checks shared by the public ops and the Flax modules (ValueError naming the argument)."""

from __future__ import annotations

import math
import operator

import jax
import numpy as np

from jax_mxfp8.formats.elements import BLOCK_SIZE


def concrete_value(x) -> np.ndarray | None:
    """x as a NumPy array when it is concrete (not traced), else None."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def check_length_values(x, name: str, bound: int, axis: str) -> None:
    """ValueError naming `name` when concrete sequence lengths fall outside [0, bound], bound the size of
    the sequence axis they describe (`axis`, e.g. "axis 1 of key"). Traced lengths cannot be checked: the
    ops then treat a length below 0 as 0 and one above `bound` as `bound` (docs/numerics.md, "Padding and
    jagged sequences")."""
    c = concrete_value(x)
    if c is None:
        return
    if np.any(c < 0):
        raise ValueError(f"{name}={c.tolist()} must be non-negative")
    if np.any(c > bound):
        raise ValueError(
            f"{name}={c.tolist()} exceeds the sequence length {bound} ({axis}); lengths must lie in [0, {bound}]"
        )


def check_eps(eps, name: str = "eps") -> float:
    """eps as a Python float; ValueError naming `name` unless a concrete finite number > 0."""
    if isinstance(eps, (str, bytes)):
        raise ValueError(f"{name}={eps!r} must be a positive finite number")
    try:
        value = float(eps)
    except (TypeError, ValueError, jax.errors.ConcretizationTypeError) as e:
        raise ValueError(f"{name}={eps!r} must be a concrete positive finite number (it is static)") from e
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={eps!r} must be a positive finite number (a zero row would give NaN)")
    return value


def check_rank(x, min_rank: int, name: str) -> None:
    if np.ndim(x) < min_rank:
        raise ValueError(f"{name} must have rank >= {min_rank}; got shape {np.shape(x)}")


def check_features(value, name: str, *, multiple_of_block: bool = False) -> int:
    """A layer size as a Python int; ValueError naming `name` unless positive (and a multiple of 32)."""
    try:
        n = operator.index(value)
    except TypeError as e:
        raise ValueError(f"{name}={value!r} must be a positive int") from e
    if n <= 0:
        raise ValueError(f"{name}={n} must be a positive int")
    if multiple_of_block and n % BLOCK_SIZE:
        raise ValueError(
            f"{name}={n} must be a multiple of the MX block size {BLOCK_SIZE} for MXFP8 GEMMs (it is the "
            "contracted axis); use a multiple of 32 or a bf16 LayerPrecision for this layer"
        )
    return n
