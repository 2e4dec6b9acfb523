"""Blocked random Hadamard transforms (RHT) for spreading outliers before MX quantization.

R = blockdiag(D_i H / sqrt(b)) with H the b x b Sylvester Hadamard matrix and D_i random +-1 diagonals.
R is orthonormal, so for a GEMM contracted over axis k, (A R)(R^T B) = A B exactly in real arithmetic:
apply `random_hadamard` with the SAME key to both operands along their contracted axes, and
`random_hadamard(..., inverse=True)` to undo it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.cache
def hadamard_matrix(size: int) -> np.ndarray:
    """The size x size Sylvester Hadamard matrix (entries +-1) as float32; size a power of two."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"block_size={size} must be a power of two")
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < size:
        h = np.block([[h, h], [h, -h]])
    return h


def _signs(key: jax.Array | int, n: int) -> jax.Array:
    if isinstance(key, int):
        key = jax.random.key(key)
    return jnp.where(jax.random.bernoulli(key, 0.5, (n,)), 1.0, -1.0).astype(jnp.float32)


def random_hadamard(
    x: jax.Array, key: jax.Array | int, *, axis: int = -1, block_size: int = 32, inverse: bool = False
) -> jax.Array:
    """Applies the blocked random Hadamard transform R along `axis`: x_axis -> x_axis @ R (or @ R^T).

    Args:
      x: array of any float dtype; x.shape[axis] must be a multiple of block_size.
      key: PRNG key or int seed; the same key gives the same R (apply it to both GEMM operands).
      axis: the axis to transform (a GEMM's contracted axis).
      block_size: Hadamard block size, a power of two (default 32, one MX block).
      inverse: apply R^T = R^-1 instead of R.

    Returns:
      The transformed array, same shape and dtype (computed in float32).
    """
    x = jnp.asarray(x)
    axis = axis % x.ndim
    n = x.shape[axis]
    if n % block_size:
        raise ValueError(f"axis {axis} of x has size {n}, not a multiple of block_size={block_size}")
    h = jnp.asarray(hadamard_matrix(block_size) / np.sqrt(block_size, dtype=np.float32))
    signs = _signs(key, n)
    xm = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    blocks = xm.reshape(*xm.shape[:-1], n // block_size, block_size)
    sb = signs.reshape(n // block_size, block_size)
    hp = jax.lax.Precision.HIGHEST
    if inverse:  # x @ R^T = (x @ H^T / sqrt(b)) * signs, H symmetric
        out = jnp.einsum("...ij,jk->...ik", blocks, h, precision=hp) * sb
    else:  # x @ R = (x * signs) @ H / sqrt(b)
        out = jnp.einsum("...ij,jk->...ik", blocks * sb, h, precision=hp)
    return jnp.moveaxis(out.reshape(xm.shape), -1, axis).astype(x.dtype)
