"""custom_vjp boundaries: zero cotangents for non-differentiable inputs (MXArrays, keys, None), and FP8
residuals that survive rematerialization.

jax.checkpoint (remat) inserts x = reduce_precision(x, finfo(x.dtype)) on every floating-point residual it
saves (jax/_src/ad_checkpoint.py, against XLA excess precision). For float8_e4m3fn that is
reduce_precision(exponent_bits=4, mantissa_bits=3), an IEEE-style rounding with an infinity in the top
binade, which E4M3FN uses for finite values: every element in 256..448 comes back NaN (NaN losses
under everything_saveable / save_anything_except_these_names). Residuals that hold FP8 arrays
go through `to_residuals` (uint8 bit patterns, not floating point, so remat leaves them alone) and come
back with `from_residuals`; `remat_safe(fwd, bwd)` wraps a custom_vjp's rules that way.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def zero_cotangent(tree):
    """A zero cotangent for every leaf of `tree`: float0 for integer/key leaves, zeros otherwise."""

    def leaf(x):
        dtype = x.dtype
        if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
            return jnp.zeros_like(x)
        return np.zeros(np.shape(x), dtype=jax.dtypes.float0)

    return jax.tree_util.tree_map(leaf, tree)


@jax.tree_util.register_pytree_node_class
class FP8Bits:
    """An FP8 array carried as its uint8 bit pattern (the pytree child) plus its dtype (static)."""

    def __init__(self, bits: jax.Array, dtype):
        self.bits, self.dtype = bits, np.dtype(dtype)

    def tree_flatten(self):
        return (self.bits,), self.dtype

    @classmethod
    def tree_unflatten(cls, dtype, children):
        return cls(children[0], dtype)


def _is_fp8(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and np.dtype(x.dtype).itemsize == 1


def to_residuals(tree):
    """`tree` with every FP8 array leaf (e.g. MXArray data) replaced by FP8Bits (a bitcast, no copy)."""
    return jax.tree_util.tree_map(
        lambda x: FP8Bits(lax.bitcast_convert_type(x, jnp.uint8), x.dtype) if _is_fp8(x) else x, tree
    )


def from_residuals(tree):
    """Inverse of to_residuals (a no-op on trees without FP8Bits)."""
    return jax.tree_util.tree_map(
        lambda x: lax.bitcast_convert_type(x.bits, x.dtype) if isinstance(x, FP8Bits) else x,
        tree,
        is_leaf=lambda x: isinstance(x, FP8Bits),
    )


def remat_safe(fwd, bwd):
    """A custom_vjp's (fwd, bwd) rules with the residuals' FP8 arrays carried as uint8 bits in between.

    fwd(*args) -> (out, res) and bwd(*nondiff, res, g) as for custom_vjp.defvjp; the wrapped pair has the
    same signatures, and the rules themselves see the residuals unchanged."""

    @functools.wraps(fwd)
    def fwd_bits(*args):
        out, res = fwd(*args)
        return out, to_residuals(res)

    @functools.wraps(bwd)
    def bwd_bits(*args):
        *nondiff, res, g = args
        return bwd(*nondiff, from_residuals(res), g)

    return fwd_bits, bwd_bits
