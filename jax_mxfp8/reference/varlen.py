"""Index maps between packed jagged sequences (T_total, ...) and padded per-sequence tiles (B, L, ...).

Gathering each sequence to the start of its own row makes MX blocks restart at every sequence start, and
the zeros written past a sequence's end make a partial last block's scale depend on its valid rows only
(zeros never raise a block amax). Nothing crosses from one sequence into another.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def seq_lengths(cu_seqlens: jax.Array, max_len: int) -> jax.Array:
    """(B,) int32 lengths from (B + 1,) cumulative offsets, clipped to max_len (longer sequences truncate)."""
    cu = cu_seqlens.astype(jnp.int32)
    return jnp.clip(cu[1:] - cu[:-1], 0, max_len)


def to_padded(x: jax.Array, cu_seqlens: jax.Array, lengths: jax.Array, padded_len: int) -> jax.Array:
    """Packed (T_total, ...) -> (B, padded_len, ...): sequence b at row b from position 0, zeros after it."""
    cu = cu_seqlens.astype(jnp.int32)
    pos = jnp.arange(padded_len, dtype=jnp.int32)
    valid = pos[None, :] < lengths[:, None]
    idx = jnp.clip(cu[:-1, None] + pos[None, :], 0, max(x.shape[0] - 1, 0))
    out = x[idx]
    return jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 1)), out, jnp.zeros((), x.dtype))


def to_packed(y: jax.Array, cu_seqlens: jax.Array, lengths: jax.Array, total: int) -> jax.Array:
    """(B, L, ...) -> packed (total, ...): the inverse of to_padded; positions in no sequence get 0."""
    cu = cu_seqlens.astype(jnp.int32)
    n_seq, padded_len = y.shape[0], y.shape[1]
    p = jnp.arange(total, dtype=jnp.int32)
    b = jnp.searchsorted(cu[1:], p, side="right").astype(jnp.int32)  # sequence holding packed position p
    bc = jnp.clip(b, 0, n_seq - 1)
    i = p - cu[bc]
    valid = (b < n_seq) & (i >= 0) & (i < lengths[bc])
    out = y[bc, jnp.clip(i, 0, padded_len - 1)]
    return jnp.where(valid.reshape(valid.shape + (1,) * (y.ndim - 2)), out, jnp.zeros((), y.dtype))
