"""The block view of an array: every blocked axis n reshaped to (n // 32, 32), and back.

quantize reduces over the 32s (one scale per block); dequantize broadcasts a scale over them. On a mesh
with Explicit axes (jax.make_mesh's default) a reshape must name its output sharding: the outer part of
a blocked axis keeps the axis's sharding, the 32 elements of a block are local.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jax_mxfp8.formats.elements import BLOCK_SIZE


def split_shape(shape: Sequence[int], axes: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape with every blocked axis n split into (n // 32, 32), and the positions of the 32s."""
    split, inner = [], []
    for i, d in enumerate(shape):
        if i in axes:
            split += [d // BLOCK_SIZE, BLOCK_SIZE]
            inner.append(len(split) - 1)
        else:
            split.append(d)
    return tuple(split), tuple(inner)


def _explicit(x: jax.Array):
    """x's NamedSharding when its mesh has Explicit axes (jax.make_mesh's default), else None."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    axis_types = getattr(getattr(sharding, "mesh", None), "axis_types", ())
    return sharding if any(t == jax.sharding.AxisType.Explicit for t in axis_types) else None


def split_blocks(x: jax.Array, split: tuple[int, ...], axes: Sequence[int]) -> jax.Array:
    """x.reshape(split) (every blocked axis n -> (n // 32, 32)). On an Explicit-axis mesh the output
    sharding must be named: the outer part keeps the axis's sharding, the 32 block elements are local."""
    sharding = _explicit(x)
    if sharding is None:
        return x.reshape(split)
    spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
    out = []
    for i, s in enumerate(spec):
        out += [s, None] if i in axes else [s]
    return jnp.reshape(x, split, out_sharding=sharding.update(spec=jax.sharding.PartitionSpec(*out)))


def merge_blocks(y: jax.Array, shape: Sequence[int], like: jax.Array) -> jax.Array:
    """Inverse of split_blocks (or dropping the size-1 block axes of a scale): `like`'s sharding."""
    sharding = _explicit(like)
    if sharding is None:
        return y.reshape(shape)
    return jnp.reshape(y, tuple(shape), out_sharding=sharding)
