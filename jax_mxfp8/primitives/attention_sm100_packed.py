"""Packed jagged sequences on the Blackwell attention kernels (layer 5): split addressing, in XLA.

  chunk_starts(lens)                            (S + 1,) int32: each sequence's first 128-row scale chunk
  packed_tables(cu_q, cu_k, *, causal, n_chunks_q, n_chunks_k) -> PackedSequenceTables   the kernels' tables
  pack_operand(x, cu, chunk0, *, max_len, n_chunks, orientations)   the producer: compact E4M3 data, square
                                                blocks restarting at every sequence start, padded scales
  emulate_packed_fwd_sm100(...), emulate_packed_bwd_sm100(...)      the kernels' arithmetic on them

Layout (S sequences of lengths L_s, packed back to back, cu = (0, L_0, L_0 + L_1, ...)):
  data   (1, Ttot, heads, H) E4M3, compact: sequence s in rows cu[s] .. cu[s + 1] - 1 (no padding)
  scales the operand's orientations (attention_sm100_operands.py) per sequence, padded to whole 128-row
         chunks: sequence s owns chunks chunk0[s] .. chunk0[s] + ceil(L_s / 128) - 1 ("hd": the chunk axis is the
         rows; "seq": the K-block axis, 4 blocks of 32 positions per chunk); n_chunks (static) >= chunk0[S]
The kernels address data by cu and scales by chunk0 ("split addressing"). The 32x32 blocks restart at every
sequence start and a partial last block is scaled from its valid rows only (the contract's jagged rule): the
producer quantizes each sequence's window with zeros after its end. The kernels' TMA boxes for a sequence are
bounded at its end (ragged boxes: rows past it read as zero, never the next sequence's bytes, which could hold
NaN), so every sequence is computed exactly as alone: the emulations run each sequence as a batch row of the
dense emulation on its own window (zeros after its length) and put the rows back.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_mxfp8.primitives.attention_bwd_sm100_emulation import emulate_bwd_sm100
from jax_mxfp8.primitives.attention_packed import query_work, sequence_table, tile_work
from jax_mxfp8.primitives.attention_sm100_emulation import emulate_fwd_sm100
from jax_mxfp8.primitives.attention_sm100_operands import (
    ORIENTATIONS,
    TILE,
    Sm100Operand,
    orientation_scales,
    quantize_square,
)

_CHUNK_AXIS = {"hd": 2, "seq": 3}  # in (B, heads, a, b, 512) blocked scales


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def chunk_starts(lens: jax.Array) -> jax.Array:
    """(S,) sequence lengths -> (S + 1,) int32 first scale chunk of each sequence (and the total)."""
    n = -(-lens.astype(jnp.int32) // TILE)
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(n).astype(jnp.int32)])


ITEM_ROWS = 2 * TILE
"""Query rows of one work item of the forward kernel (two 128-row Q tiles)."""


class PackedSequenceTables(NamedTuple):
    """The packed-sequence encoding of the Blackwell attention kernels (int32; docs/interfaces.md "sm100
    attention"). Rows 0-3 of seqs and the work lists are the Hopper kernels' (primitives/attention_packed.py):
    a sequence's first 128-row tile of the aligned packed layout is its first scale chunk here, because both
    give every sequence ceil(L / 128) tiles in packed order; rows 4-5 locate its compact data."""

    seqs: jax.Array  # (6, S) first Q chunk, first K / V chunk, query length, key length, first query row, first key row
    work: jax.Array  # (2, n_chunks_q) forward: (sequence, 256-row query pair), the most KV tiles first; (-1, 0)
    query_tiles: jax.Array  # (2, n_chunks_q) pre-pass: item n = query chunk n, (sequence, tile in it) or (-1, 0)
    key_tiles: jax.Array  # (2, n_chunks_k) backward: item n = key chunk n, (sequence, tile in it) or (-1, 0)


def packed_tables(cu_q: jax.Array, cu_k: jax.Array, *, causal: bool, n_chunks_q: int, n_chunks_k: int):
    """The one host function of the Blackwell kernels' packed tables (forward, pre-pass and backward) for S
    sequences with query / key offsets cu_q, cu_k (S + 1,) int32 (cu[0] = 0, ascending) and n_chunks_q /
    n_chunks_k (static) >= chunk_starts(lengths)[S]: the scale operands' chunk counts. Returns
    PackedSequenceTables; the kernels decode an item with kernels/common/packed_sequences.packed_item."""
    q_len = (cu_q[1:] - cu_q[:-1]).astype(jnp.int32)
    kv_len = (cu_k[1:] - cu_k[:-1]).astype(jnp.int32)
    q_start, kv_start = chunk_starts(q_len)[:-1] * TILE, chunk_starts(kv_len)[:-1] * TILE
    rows = jnp.stack([cu_q[:-1], cu_k[:-1]]).astype(jnp.int32)
    seqs = jnp.concatenate([sequence_table(q_len, kv_len, q_start, kv_start), rows])
    q_rows = n_chunks_q * TILE
    return PackedSequenceTables(
        seqs=seqs,
        work=query_work(q_len, kv_len, q_start, causal=causal, q_rows=q_rows, item_rows=ITEM_ROWS),
        query_tiles=tile_work(q_len, q_start, q_rows),
        key_tiles=tile_work(kv_len, kv_start, n_chunks_k * TILE),
    )


def _window_rows(cu: jax.Array, width: int, total: int) -> tuple[jax.Array, jax.Array]:
    """(S, width) row index of each sequence's window position in the packed rows (clipped) and its validity."""
    pos = jnp.arange(width, dtype=jnp.int32)[None, :]
    valid = pos < (cu[1:] - cu[:-1])[:, None]
    return jnp.clip(cu[:-1, None] + pos, 0, total - 1), valid


def windows(x: jax.Array, cu: jax.Array, width: int) -> jax.Array:
    """(1, Ttot, ...) packed rows -> (S, width, ...): sequence s's rows from position 0, zeros after its end."""
    idx, valid = _window_rows(cu, width, x.shape[1])
    w = x[0][idx]
    return jnp.where(valid.reshape(valid.shape + (1,) * (w.ndim - 2)), w, jnp.zeros((), x.dtype))


def unwindows(w: jax.Array, cu: jax.Array, total: int, axis: int = 1) -> jax.Array:
    """windows' inverse along `axis` (the window axis of w (S, ...)): (1, ..., Ttot, ...), rows outside every
    sequence zero."""
    w = jnp.moveaxis(w, axis, 1)
    idx, valid = _window_rows(cu, w.shape[1], total)
    idx = jnp.where(valid, idx, total)  # out of range: dropped
    flat = w.reshape((-1,) + w.shape[2:])
    out = jnp.zeros((total,) + w.shape[2:], w.dtype).at[idx.reshape(-1)].set(flat, mode="drop")
    return jnp.moveaxis(out[None], 1, axis)


def _chunks(sf: jax.Array, cu: jax.Array, chunk0: jax.Array, width_chunks: int, axis: int) -> jax.Array:
    """(1, heads, ...) packed blocked scales -> (S, heads, ...): each sequence's own chunks from its first, zero
    bytes after them (the kernel never reads them: it skips key and query tiles past a sequence's end)."""
    c = jnp.arange(width_chunks, dtype=jnp.int32)[None, :]
    own = c < -(-(cu[1:] - cu[:-1]) // TILE)[:, None]  # (S, w)
    idx = jnp.clip(chunk0[:-1, None] + c, 0, sf.shape[axis] - 1)
    taken = jnp.moveaxis(jnp.take(sf[0], idx, axis=axis - 1), axis - 1, 0)  # the chunk axis became (S, w)
    own = own.reshape(own.shape[:1] + (1,) * (axis - 1) + own.shape[1:] + (1,) * (taken.ndim - axis - 1))
    return jnp.where(own, taken, jnp.zeros((), sf.dtype))


def pack_operand(
    x: jax.Array,
    cu: jax.Array,
    chunk0: jax.Array,
    *,
    max_len: int,
    n_chunks: int,
    orientations: tuple[str, ...] = ORIENTATIONS,
    scale_rounding: str = "up",
) -> Sm100Operand:
    """The producer on packed input x (1, Ttot, heads, H) float with sequence offsets cu (S + 1,), scale chunk
    offsets chunk0 = chunk_starts(lengths), max_len >= every length (static), n_chunks >= chunk0[S] (static).
    Returns the packed Sm100Operand (module docstring)."""
    width = _round_up(max_len, TILE)
    mx = quantize_square(windows(x, cu, width), scale_rounding)  # blocks restart at every sequence start
    data = unwindows(mx.data, cu, x.shape[1])
    square = mx.scale.transpose(0, 2, 1, 3)  # (S, heads, width/32, H/32)
    nch = -(-(cu[1:] - cu[:-1]) // TILE)
    sf = {}
    for o in orientations:
        per_seq = orientation_scales(square, o)  # (S, heads, ...) with width/128 chunks on the chunk axis
        ax = _CHUNK_AXIS[o]
        c = jnp.arange(per_seq.shape[ax], dtype=jnp.int32)[None, :]
        dest = jnp.where(c < nch[:, None], chunk0[:-1, None] + c, n_chunks)  # (S, w): dropped past each own
        moved = jnp.moveaxis(per_seq, ax, 1)  # (S, w, heads, ...)
        shape = (n_chunks,) + moved.shape[2:]
        flat = moved.reshape((-1,) + shape[1:])
        packed = jnp.zeros(shape, moved.dtype).at[dest.reshape(-1)].set(flat, mode="drop")
        sf[o] = jnp.moveaxis(packed, 0, ax - 1)[None]
    return Sm100Operand(data=data, sf_hd=sf.get("hd"), sf_seq=sf.get("seq"))


def window_operand(op: Sm100Operand, cu: jax.Array, chunk0: jax.Array, *, max_len: int) -> Sm100Operand:
    """A packed operand -> the dense (S, width, heads, H) operand of its sequences' windows (what each
    sequence's CTAs read through the ragged boxes: its rows, zeros after; its own scale chunks)."""
    width = _round_up(max_len, TILE)
    w = width // TILE

    def sf(x, o):
        return None if x is None else _chunks(x, cu, chunk0, w, _CHUNK_AXIS[o])

    return Sm100Operand(windows(op.data, cu, width), sf(op.sf_hd, "hd"), sf(op.sf_seq, "seq"))


def _lens(cu_q: jax.Array, cu_k: jax.Array) -> jax.Array:
    return jnp.stack([cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]]).astype(jnp.int32)


def emulate_packed_fwd_sm100(q, k, v, cu_q, cu_k, chunk_q, chunk_k, *, max_len_q, max_len_k, **kw):
    """The packed forward: q (1, Tq, N, H), k, v (1, Tk, K, H) packed operands (q: "hd" scales, k: "hd", v:
    "seq"); kw as emulate_fwd_sm100. Returns o (1, Tq, N, H) float32 and lse (1, N, Tq) (0 / -inf outside
    every sequence)."""
    wq = functools.partial(window_operand, cu=cu_q, chunk0=chunk_q, max_len=max_len_q)
    wk = functools.partial(window_operand, cu=cu_k, chunk0=chunk_k, max_len=max_len_k)
    o, lse = emulate_fwd_sm100(wq(q), wk(k), wk(v), _lens(cu_q, cu_k), **kw)
    total = q.data.shape[1]
    lse_packed = unwindows(lse, cu_q, total, axis=2)  # (1, N, Tq), zeros outside: set those to -inf
    inside = unwindows(jnp.ones(lse.shape, bool), cu_q, total, axis=2)
    return unwindows(o, cu_q, total), jnp.where(inside, lse_packed, -jnp.inf)


def emulate_packed_bwd_sm100(q, k, v, do, lse, delta, cu_q, cu_k, chunk_q, chunk_k, *, max_len_q, max_len_k, **kw):
    """The packed backward: packed operands (q, do with both orientations, k with both, v "hd"), lse and delta
    (1, N, Tq); kw as emulate_bwd_sm100. Returns dq (1, Tq, N, H), dk, dv (1, Tk, K, H) float32."""
    wq = functools.partial(window_operand, cu=cu_q, chunk0=chunk_q, max_len=max_len_q)
    wk = functools.partial(window_operand, cu=cu_k, chunk0=chunk_k, max_len=max_len_k)
    width = _round_up(max_len_q, TILE)

    def rows(x):  # (1, N, Tq) -> (S, N, width)
        return jnp.swapaxes(windows(jnp.swapaxes(x, 1, 2), cu_q, width), 1, 2)

    lse_w = jnp.where(rows(jnp.ones(lse.shape, bool)), rows(lse), -jnp.inf)
    dq, dk, dv = emulate_bwd_sm100(wq(q), wk(k), wk(v), wq(do), lse_w, rows(delta), _lens(cu_q, cu_k), **kw)
    tq, tk = q.data.shape[1], k.data.shape[1]
    return unwindows(dq, cu_q, tq), unwindows(dk, cu_k, tk), unwindows(dv, cu_k, tk)
