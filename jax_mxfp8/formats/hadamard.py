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
    if isinstance(key, (int, np.integer)):
        key = jax.random.key(int(key))
    return jnp.where(jax.random.bernoulli(key, 0.5, (n,)), 1.0, -1.0).astype(jnp.float32)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_args(x, key, axis, block_size, inverse) -> tuple[jax.Array, int]:
    """(x as an array, axis as a non-negative int); ValueError naming the argument for anything invalid."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating) or np.dtype(x.dtype).itemsize < 2:
        raise ValueError(f"x has dtype {x.dtype}; random_hadamard takes float32, bfloat16 or float16 input")
    if x.ndim == 0:
        raise ValueError("x must have rank >= 1 (the transform runs along one axis), got a scalar")
    if not _is_int(axis) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis={axis!r} must be an int in [-{x.ndim}, {x.ndim}) for x of rank {x.ndim}")
    if not _is_int(block_size) or block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size={block_size!r} must be a power of two (an int >= 1)")
    if not isinstance(inverse, (bool, np.bool_)):
        raise ValueError(f"inverse={inverse!r} must be a bool")
    dt = getattr(key, "dtype", None)
    typed = dt is not None and jax.dtypes.issubdtype(dt, jax.dtypes.prng_key) and np.shape(key) == ()
    legacy = not typed and dt is not None and np.dtype(dt) == np.uint32 and np.shape(key) == (2,)
    if not (typed or legacy or _is_int(key)):
        raise ValueError(f"key={key!r} must be a PRNG key (jax.random.key(...)) or an int seed")
    return x, int(axis) % x.ndim


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

    Raises:
      ValueError: naming the argument: a non-float x or a scalar, axis out of range or not an int,
        block_size not a power of two or not dividing x.shape[axis], a key that is neither a PRNG key nor
        an int, a non-bool inverse.
    """
    x, axis = _check_args(x, key, axis, block_size, inverse)
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
