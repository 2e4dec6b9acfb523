"""Masking of one S row held by one thread (Blackwell attention kernels, thread = query row, 128 keys of a KV
tile in registers; sm_100f, traced inside CuTe DSL kernels). Shared by the forward's softmax and the
backward's S^T recomputation.

Keys are counted from the sequence's start, rows likewise; a key is visible when key < kv_len and, causal,
key <= row (top-left aligned, as the reference's Masking). Only tiles that straddle a boundary run the
per-element selects (one ISETP + FSEL per element), decided per warp:

  tile_needs_mask(j, kv_len, first_row, causal)   KV tile j holds an invisible key for some row >= first_row
  key_limit(j, kv_len, row, causal)               keys k of tile j are visible iff k < limit (limit may be
                                                  <= 0 or >= 128)
  mask_row(values, limit)                         values[k] = -inf where k >= limit
"""

from __future__ import annotations

import cutlass
from cutlass import Boolean, Float32, Int32

from jax_mxfp8.kernels.sm100.attention_fwd_config import TILE_N


def tile_needs_mask(j: Int32, kv_len: Int32, first_row: Int32, causal: bool) -> Boolean:
    """Whether KV tile j has a key >= kv_len or (causal) a key > first_row (the tile's rows start there)."""
    need = (j + 1) * TILE_N > kv_len
    if cutlass.const_expr(causal):
        need = need | ((j + 1) * TILE_N > first_row + 1)
    return need


def key_limit(j: Int32, kv_len: Int32, row: Int32, causal: bool) -> Int32:
    """Keys k (0 .. 127) of tile j visible to `row` are exactly k < the returned limit."""
    limit = kv_len - j * TILE_N
    if cutlass.const_expr(causal):
        limit = cutlass.min(limit, row + 1 - j * TILE_N)
    return limit


def mask_row(values: list[Float32], limit: Int32) -> list[Float32]:
    """values with -inf at every k >= limit."""
    neg_inf = -Float32.inf
    return [Float32(cutlass.select_(Int32(k) < limit, v, neg_inf)) for k, v in enumerate(values)]
