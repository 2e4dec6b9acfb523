"""Zero cotangents for the non-differentiable inputs of custom_vjp ops (MXArrays, keys, None)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def zero_cotangent(tree):
    """A zero cotangent for every leaf of `tree`: float0 for integer/key leaves, zeros otherwise."""

    def leaf(x):
        dtype = x.dtype
        if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
            return jnp.zeros_like(x)
        return np.zeros(np.shape(x), dtype=jax.dtypes.float0)

    return jax.tree_util.tree_map(leaf, tree)
