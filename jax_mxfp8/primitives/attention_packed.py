"""Packed jagged sequences on the Hopper attention kernel (layer 5): the work list and its emulation.

  sequence_table(q_len, kv_len, q_start, kv_start) -> seqs (4, S)   the packed kernels' sequence encoding
  packed_tables(q_len, kv_len, q_start, kv_start, *, causal, q_rows) -> (seqs (4, S), work (2, W))
  query_work(q_len, kv_len, q_start, *, causal, q_rows, item_rows) -> work (2, q_rows / 128)   the forward's
                                        items (query tiles, or Blackwell's 256-row pairs), longest first
  tile_work(lengths, starts, rows) -> work (2, rows / 128)   item n = 128-row tile n (the backward's key tiles)
  key_tile_work(q_len, kv_len, kv_start, rows) -> work (2, rows / 128)   the causal backward's: longest first
  emulate_packed_fwd(ops, *, causal, p_scale, p_rounding) -> (o (1, N, Tp, H), lse (1, N, Tp))
  sequence_windows(x, first_tile, n_tiles, axis) -> each sequence's tiles as a batch row (the emulations')

Every sequence starts on a 128-row tile of the aligned packed layout (ops/varlen_kernel.py). The packed
kernel variants read one encoding (kernels/common/packed_sequences.py packed_item): the per-sequence table seqs
and a work list of (sequence, tile inside it) items; the forward runs one CTA per query-tile item, longest
first, the backward one per key tile of the layout, in key-tile order (causal: longest first). The Blackwell
kernels read the same tables (primitives/attention_sm100_packed.py adds two rows to seqs for their compact data).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_mxfp8.primitives.attention_emulation import emulate_fwd
from jax_mxfp8.primitives.attention_layout import TILE_M, TILE_N
from jax_mxfp8.primitives.attention_operands import AlignedOperands
from jax_mxfp8.reference.varlen import aligned_owner


def sequence_table(q_len: jax.Array, kv_len: jax.Array, q_start: jax.Array, kv_start: jax.Array) -> jax.Array:
    """seqs (4, S) int32: per sequence its first query tile, first KV tile (128-row tiles of the aligned
    packed layout), query length and KV length."""
    q_len, kv_len = q_len.astype(jnp.int32), kv_len.astype(jnp.int32)
    return jnp.stack([q_start // TILE_M, kv_start // TILE_N, q_len, kv_len]).astype(jnp.int32)


def tile_work(lengths: jax.Array, starts: jax.Array, rows: int) -> jax.Array:
    """Work list (2, rows / 128) int32 over the 128-row tiles of an aligned packed layout of `rows` rows: item
    n is tile n, (its sequence, tile inside the sequence), or (-1, 0) for a tile holding no row of any
    sequence. The backward's list over the key tiles (lengths, starts: the KV lengths and first rows)."""
    tiles = jnp.arange(rows // TILE_N, dtype=jnp.int32)
    seq = aligned_owner(starts, tiles * TILE_N)
    first = (starts[seq] // TILE_N).astype(jnp.int32)
    live = (tiles >= first) & (tiles * TILE_N < starts[seq] + lengths[seq])
    return jnp.stack([jnp.where(live, seq, -1), jnp.where(live, tiles - first, 0)]).astype(jnp.int32)


def key_tile_work(q_len: jax.Array, kv_len: jax.Array, kv_start: jax.Array, rows: int) -> jax.Array:
    """The causal backward's work list (2, rows / 128) int32 over the key tiles of an aligned packed layout of
    `rows` key rows: tile_work's items sorted by the query tiles (64 rows) a tile visits, the most first (a
    CTA's work; kernels/sm90/tile_scheduler.py launches items in list order), ties in key-tile order. Key tile
    t of a sequence (top-left causal) visits its query tiles 2 t .. ceil(q_len / 64) - 1; a padding item comes
    after every live one as (-1, its key tile in the layout), the tile whose dk, dv rows it zeroes."""
    work = tile_work(kv_len, kv_start, rows)
    seq, tile = work[0], work[1]
    live = seq >= 0
    s = jnp.maximum(seq, 0)
    cost = jnp.where(live, jnp.maximum(-(-q_len.astype(jnp.int32)[s] // 64) - 2 * tile, 0), -1)
    order = jnp.argsort(-cost, stable=True)
    tiles = jnp.arange(rows // TILE_N, dtype=jnp.int32)
    return jnp.stack([seq[order], jnp.where(live, tile, tiles)[order]]).astype(jnp.int32)


def query_work(
    q_len: jax.Array, kv_len: jax.Array, q_start: jax.Array, *, causal: bool, q_rows: int, item_rows: int = TILE_M
) -> jax.Array:
    """The forward's work list (2, q_rows / 128) int32 for sequences laid out from rows q_start (multiples of
    128) in q_rows query rows: one item (sequence, i) per item_rows-row block i of a sequence (item_rows = 128:
    its query tiles; 256: the Blackwell kernel's tile pairs) holding a row of it, the most KV tiles first (a
    CTA's work; the GPU starts CTAs in grid order, so the long ones do not trail), then (-1, 0) items that do
    nothing. A causal item visits the KV tiles up to its last row."""
    per = item_rows // TILE_M
    tiles = jnp.arange(q_rows // TILE_M, dtype=jnp.int32)
    b = jnp.clip(jnp.searchsorted(q_start // TILE_M, tiles, side="right").astype(jnp.int32) - 1, 0, q_len.shape[0] - 1)
    m = tiles - q_start[b] // TILE_M  # the item's first query tile inside its sequence
    live = (m >= 0) & (m % per == 0) & (m * TILE_M < q_len[b])
    item = m // per
    n_kv = -(-kv_len[b] // TILE_N)
    if causal:
        last_row = jnp.minimum((item + 1) * item_rows, q_len[b]) - 1
        n_kv = jnp.minimum(n_kv, last_row // TILE_N + 1)
    cost = jnp.where(live, n_kv, -1)
    order = jnp.argsort(-cost, stable=True)
    return jnp.stack([jnp.where(live, b, -1)[order], jnp.where(live, item, 0)[order]]).astype(jnp.int32)


def packed_tables(
    q_len: jax.Array, kv_len: jax.Array, q_start: jax.Array, kv_start: jax.Array, *, causal: bool, q_rows: int
) -> tuple[jax.Array, jax.Array]:
    """The packed kernel's int32 tables for S sequences laid out from rows q_start / kv_start (multiples of 128)
    in operands of q_rows query rows.

    Returns seqs (4, S) = (first query tile, first KV tile, query length, KV length) and work (2, q_rows/128):
    one item (sequence, query tile) per query tile holding rows of a sequence, the longest first
    (query_work), then (-1, 0) items that do nothing.
    """
    q_len, kv_len = q_len.astype(jnp.int32), kv_len.astype(jnp.int32)
    seqs = sequence_table(q_len, kv_len, q_start, kv_start)
    return seqs, query_work(q_len, kv_len, q_start, causal=causal, q_rows=q_rows)


def sequence_windows(x: jax.Array, first_tile: jax.Array, n_tiles: jax.Array, axis: int) -> jax.Array:
    """(1, ..., L, ...) aligned operand -> (S, ..., L, ...): sequence s's tiles first_tile[s] .. + n_tiles[s]
    along `axis` from position 0, zeros after them (so that no other sequence's bytes reach the emulation)."""
    length = x.shape[axis]
    pos = jnp.arange(length, dtype=jnp.int32)
    idx = jnp.clip(first_tile[:, None] * TILE_N + pos[None, :], 0, length - 1)  # (S, L)
    valid = pos[None, :] < n_tiles[:, None] * TILE_N
    moved = jnp.moveaxis(x[0], axis - 1, 0)[idx]  # (S, L, ...)
    moved = jnp.where(valid.reshape(valid.shape + (1,) * (moved.ndim - 2)), moved, jnp.zeros((), x.dtype))
    return jnp.moveaxis(moved, 1, axis)


def emulate_packed_fwd(
    ops: AlignedOperands, *, causal: bool, p_scale: str = "const", p_rounding: str = "up"
) -> tuple[jax.Array, jax.Array]:
    """The packed kernel's arithmetic in XLA: emulate_fwd on each sequence's own tiles (ops.lens = seqs).
    Returns o (1, N, Tp, H) and lse (1, N, Tp), 0 / -inf on rows in no sequence's query tiles."""
    seqs = ops.lens
    qt0, kt0, q_len, kv_len = seqs[0], seqs[1], seqs[2], seqs[3]
    nq, nk = -(-q_len // TILE_M), -(-kv_len // TILE_N)
    hg = ops.q.shape[-1] // 32
    win_q = functools.partial(sequence_windows, first_tile=qt0, n_tiles=nq)
    win_k = functools.partial(sequence_windows, first_tile=kt0, n_tiles=nk)
    # scale factors: per 32 rows (qs, ks) and per (tile, 32 columns) (vs, vi); windows in tile units
    qs = sequence_windows(jnp.repeat(ops.qs, 32, axis=-1), qt0, nq, 2)[..., ::32]
    ks = sequence_windows(jnp.repeat(ops.ks, 32, axis=-1), kt0, nk, 2)[..., ::32]
    nt = ops.vs.shape[-1] // hg

    def tile_factors(f):
        per_key = jnp.repeat(f.reshape(1, f.shape[1], nt, hg), TILE_N, axis=2).reshape(1, f.shape[1], nt * TILE_N * hg)
        per_key = per_key.reshape(1, f.shape[1], nt * TILE_N, hg)
        w = sequence_windows(per_key, kt0, nk, 2)[:, :, ::TILE_N]
        return jnp.where(w == 0, 1.0, w).reshape(w.shape[0], w.shape[1], -1)

    seq_ops = AlignedOperands(
        q=win_q(ops.q, axis=2),
        k=win_k(ops.k, axis=2),
        vt=win_k(ops.vt, axis=3),
        qs=qs,
        ks=ks,
        vs=tile_factors(ops.vs),
        vi=tile_factors(ops.vi),
        lens=jnp.stack([q_len, kv_len]),
    )
    o, lse = emulate_fwd(seq_ops, causal=causal, t=ops.q.shape[2], p_scale=p_scale, p_rounding=p_rounding)
    rows = jnp.arange(ops.q.shape[2], dtype=jnp.int32)
    tile = rows // TILE_M
    b = jnp.clip(jnp.searchsorted(qt0, tile, side="right").astype(jnp.int32) - 1, 0, qt0.shape[0] - 1)
    i = rows - qt0[b] * TILE_M
    live = (i >= 0) & (i < nq[b] * TILE_M)
    ic = jnp.clip(i, 0, ops.q.shape[2] - 1)
    o = jnp.where(live[None, :, None], o[b, :, ic].transpose(1, 0, 2), 0.0)[None]
    lse = jnp.where(live[None, :], lse[b, :, ic].T, -jnp.inf)[None]
    return o, lse
