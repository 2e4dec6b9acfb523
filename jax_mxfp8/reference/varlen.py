"""Index maps between packed jagged sequences (T_total, ...) and padded per-sequence tiles (B, L, ...).

Gathering each sequence to the start of its own row makes MX blocks restart at every sequence start, and
the zeros written past a sequence's end make a partial last block's scale depend on its valid rows only
(zeros never raise a block amax). Nothing crosses from one sequence into another.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def sanitize_offsets(cu_seqlens: jax.Array, total: int) -> jax.Array:
    """(B + 1,) offsets clamped to [0, total] and made non-decreasing (a running maximum), int32.

    What traced offsets get (they cannot be checked at trace time): valid offsets are unchanged; an offset
    beyond T_total ends its sequence at T_total, a negative one starts it at row 0, and an offset below
    its predecessor is raised to it (that sequence is empty, the next one starts where the previous ended).
    So no row outside [0, total) is ever read as a key or query, sequences never overlap and their
    lengths sum to at most `total` (which the kernel path's aligned layout relies on).
    """
    return lax.cummax(jnp.clip(cu_seqlens.astype(jnp.int32), 0, total), axis=0)


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


def aligned_starts(lengths: jax.Array, align: int) -> jax.Array:
    """(B,) first row of each sequence when every sequence starts on a multiple of `align` rows (the
    "aligned packed" layout: packed order, each sequence padded to a multiple of `align` with zeros)."""
    sizes = -(-lengths.astype(jnp.int32) // align) * align
    return jnp.cumsum(sizes) - sizes


def aligned_rows(total: int, n_seq: int, max_len: int, align: int) -> int:
    """A static row count that holds the aligned packed layout of any n_seq sequences of total <= `total` rows
    and each <= max_len rows."""
    bound = -(-total // align) * align + n_seq * (align - 1)
    return max(align, min(-(-bound // align) * align, n_seq * -(-max_len // align) * align))


def aligned_owner(starts: jax.Array, rows: jax.Array) -> jax.Array:
    """The sequence whose aligned block holds each row (the last sequence starting at or before it; an empty
    sequence sharing its start with the next one never owns a row)."""
    return jnp.clip(jnp.searchsorted(starts, rows, side="right").astype(jnp.int32) - 1, 0, starts.shape[0] - 1)


def to_aligned(x: jax.Array, cu_seqlens: jax.Array, lengths: jax.Array, starts: jax.Array, rows: int) -> jax.Array:
    """Packed (T_total, ...) -> aligned packed (rows, ...): sequence b at rows starts[b] .. + lengths[b], zeros
    elsewhere. The same rows as to_padded's row b, moved, so MX blocks restart at every sequence start."""
    r = jnp.arange(rows, dtype=jnp.int32)
    b = aligned_owner(starts, r)
    i = r - starts[b]
    valid = (i >= 0) & (i < lengths[b])
    idx = jnp.clip(cu_seqlens.astype(jnp.int32)[b] + i, 0, max(x.shape[0] - 1, 0))
    return jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 1)), x[idx], jnp.zeros((), x.dtype))


def aligned_to_packed(y: jax.Array, cu_seqlens: jax.Array, lengths: jax.Array, starts: jax.Array, total: int):
    """Aligned packed (rows, ...) -> packed (total, ...): the inverse of to_aligned; rows in no sequence get 0."""
    cu = cu_seqlens.astype(jnp.int32)
    n_seq = lengths.shape[0]
    p = jnp.arange(total, dtype=jnp.int32)
    b = jnp.searchsorted(cu[1:], p, side="right").astype(jnp.int32)
    bc = jnp.clip(b, 0, n_seq - 1)
    i = p - cu[bc]
    valid = (b < n_seq) & (i >= 0) & (i < lengths[bc])
    out = y[jnp.clip(starts[bc] + i, 0, y.shape[0] - 1)]
    return jnp.where(valid.reshape(valid.shape + (1,) * (y.ndim - 1)), out, jnp.zeros((), y.dtype))


def aligned_to_padded(y: jax.Array, starts: jax.Array, valid_rows: jax.Array, padded_len: int, fill=0) -> jax.Array:
    """Aligned packed (rows, ...) -> (B, padded_len, ...): row i of sequence b is y[starts[b] + i] where
    i < valid_rows[b], `fill` after. With starts in units of the first axis (rows, or 32-row blocks)."""
    i = jnp.arange(padded_len, dtype=jnp.int32)
    idx = jnp.clip(starts[:, None] + i[None, :], 0, y.shape[0] - 1)
    valid = i[None, :] < valid_rows[:, None]
    return jnp.where(valid.reshape(valid.shape + (1,) * (y.ndim - 1)), y[idx], jnp.asarray(fill, y.dtype))
