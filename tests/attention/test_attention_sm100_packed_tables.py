"""The Blackwell attention kernels' packed-sequence tables (primitives/attention_sm100_packed.packed_tables) on
CPU, against brute-force enumerations: rows 0-3 of seqs are the Hopper kernels' sequence table
(primitives/attention_packed.sequence_table over the aligned packed layout), rows 4-5 the compact data's first
rows; the forward's work list holds every 256-row query pair once, longest first, then padding; the query-
and key-tile lists name, for every scale chunk, its sequence and tile (or -1 past the last sequence)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.primitives.attention_packed import sequence_table
from jax_mxfp8.primitives.attention_sm100_packed import chunk_starts, packed_tables
from jax_mxfp8.reference.varlen import aligned_starts

Q_LENS = np.array([1, 255, 0, 256, 257, 600, 90], np.int32)


def _case(seed: int):
    kv_lens = np.random.default_rng(seed).integers(0, 700, Q_LENS.shape).astype(np.int32)
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(Q_LENS)]), jnp.int32)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(kv_lens)]), jnp.int32)
    return kv_lens, cu_q, cu_k


def _chunks(lens) -> int:
    return int(np.sum(-(-lens // 128)))


def _tiles(pair: int, q_len: int, kv_len: int, causal: bool) -> int:
    """KV tiles a pair visits, from the mask itself: tiles holding a key some valid row of the pair sees."""
    rows = range(pair * 256, min(pair * 256 + 256, q_len))
    keys = [k for k in range(kv_len) if any((not causal) or k <= r for r in rows)] if rows else []
    return (max(keys) // 128 + 1) if keys else 0


def test_seqs_is_the_hopper_table_plus_the_compact_rows():
    kv_lens, cu_q, cu_k = _case(3)
    t = packed_tables(cu_q, cu_k, causal=False, n_chunks_q=_chunks(Q_LENS), n_chunks_k=_chunks(kv_lens))
    seqs = np.asarray(t.seqs)
    q_start, k_start = aligned_starts(jnp.asarray(Q_LENS), 128), aligned_starts(jnp.asarray(kv_lens), 128)
    hopper = np.asarray(sequence_table(jnp.asarray(Q_LENS), jnp.asarray(kv_lens), q_start, k_start))
    np.testing.assert_array_equal(seqs[:4], hopper)
    np.testing.assert_array_equal(seqs[0], np.asarray(chunk_starts(jnp.asarray(Q_LENS)))[:-1])  # = Q scale chunks
    np.testing.assert_array_equal(seqs[4], np.asarray(cu_q)[:-1])
    np.testing.assert_array_equal(seqs[5], np.asarray(cu_k)[:-1])


@pytest.mark.parametrize("causal", [False, True])
def test_forward_work_is_every_pair_once_longest_first(causal):
    kv_lens, cu_q, cu_k = _case(7)
    n_q = _chunks(Q_LENS) + 2  # scale operands may hold spare chunks: padding items
    work = np.asarray(packed_tables(cu_q, cu_k, causal=causal, n_chunks_q=n_q, n_chunks_k=_chunks(kv_lens)).work)
    assert work.shape == (2, n_q)
    want = {(s, m) for s, n in enumerate(Q_LENS) for m in range(-(-int(n) // 256))}
    live = [(int(s), int(m)) for s, m in work.T if s >= 0]
    assert sorted(live) == sorted(want)  # every pair exactly once
    assert all(s < 0 for s in work[0, len(live) :]) and not work[1, len(live) :].any()  # (-1, 0) padding last
    costs = [_tiles(m, int(Q_LENS[s]), int(kv_lens[s]), causal) for s, m in live]
    assert costs == sorted(costs, reverse=True)


@pytest.mark.parametrize("side", ["query", "key"])
def test_tile_lists_name_every_chunk(side):
    kv_lens, cu_q, cu_k = _case(11)
    lens = Q_LENS if side == "query" else kv_lens
    n = _chunks(lens) + 3
    t = packed_tables(cu_q, cu_k, causal=True, n_chunks_q=n, n_chunks_k=n)
    got = np.asarray(t.query_tiles if side == "query" else t.key_tiles)
    want = [(s, c) for s, length in enumerate(lens) for c in range(-(-int(length) // 128))]
    want += [(-1, 0)] * (n - len(want))
    assert [tuple(map(int, item)) for item in got.T] == want
