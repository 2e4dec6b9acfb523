"""Causal and length masking of the Blackwell attention kernels' score tiles (sm_100f, traced inside CuTe DSL
kernels): one thread holds one row of a 128 x 128 tile in registers.

Keys and queries are counted from the sequence's start; a logit (query q, key k) is visible when q < q_len,
k < kv_len and, causal, k <= q (top-left aligned, as the reference's Masking). Only tiles that straddle a
boundary run the per-element selects, decided per warp.

Forward (the softmax warps: thread = query row, 128 keys of KV tile j):
  tile_needs_mask(j, kv_len, first_row, causal)   KV tile j holds an invisible key for some row >= first_row
  key_limit(j, kv_len, row, causal)               keys k of tile j are visible iff k < limit (limit may be
                                                  <= 0 or >= 128)
  mask_row(values, limit)                         values[k] = -inf where k >= limit
Backward (the compute warps' S^T, transposed: thread = key row of key tile n, queries of query tile m):
  step_needs_mask(m, n, q_len, kv_len, causal)    the step (query tile m, key tile n) has an invisible logit:
                                                  the causal diagonal tile, or a tile crossing q_len or kv_len
  mask_queries(values, q0, lo, hi)                values[j] (query q0 + j) = -inf outside [lo, hi), the key
                                                  row's visible queries (lo = the key causal, else 0; hi = q_len,
                                                  0 for a key past kv_len)
"""

from __future__ import annotations

import cutlass
from cutlass import Boolean, Float32, Int32

from jax_mxfp8.kernels.sm100.attention_geometry import TILE
from jax_mxfp8.kernels.sm100.float32_ops import select_f32


def tile_needs_mask(j: Int32, kv_len: Int32, first_row: Int32, causal: bool) -> Boolean:
    """Whether KV tile j has a key >= kv_len or (causal) a key > first_row (the tile's rows start there)."""
    need = (j + 1) * TILE > kv_len
    if cutlass.const_expr(causal):
        need = need | ((j + 1) * TILE > first_row + 1)
    return need


def key_limit(j: Int32, kv_len: Int32, row: Int32, causal: bool) -> Int32:
    """Keys k (0 .. 127) of tile j visible to `row` are exactly k < the returned limit."""
    limit = kv_len - j * TILE
    if cutlass.const_expr(causal):
        limit = cutlass.min(limit, row + 1 - j * TILE)
    return limit


def mask_row(values: list[Float32], limit: Int32) -> list[Float32]:
    """values with -inf at every k >= limit."""
    neg_inf = -Float32.inf
    return [Float32(cutlass.select_(Int32(k) < limit, v, neg_inf)) for k, v in enumerate(values)]


def step_needs_mask(m: Int32, n: Int32, q_len: Int32, kv_len: Int32, causal: bool) -> Boolean:
    """Whether the backward's step (query tile m, key tile n) has any invisible logit."""
    edge = (m + 1) * TILE > q_len
    edge = edge | ((n + 1) * TILE > kv_len)
    if causal:
        edge = edge | (m == n)
    return edge


def mask_queries(values: list[Float32], q0: Int32, lo: Int32, hi: Int32) -> list[Float32]:
    """values with -inf where query q0 + j is outside [lo, hi) (one key row's visible queries)."""
    out = []
    for j in range(len(values)):
        q = q0 + j
        out.append(select_f32((q >= lo) & (q < hi), values[j], Float32(float("-inf"))))
    return out
