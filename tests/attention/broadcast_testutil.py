"""Inputs and jitted calls of broadcast_query_attention and of its definition (varlen_attention on the query
tiled once per key/value sequence), for the broadcast tests. Nothing here computes an expected value."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8 as mx
from jax_mxfp8.ops.broadcast_attention import broadcast_query_attention

LK = (70, 33, 128)  # key/value sequence lengths (B = 3): partial blocks, a full tile
TQ, N, NK, H = 40, 2, 1, 64


def broadcast_inputs(rng, dtype=jnp.float32):
    """q (TQ, N, H); packed k, v (sum(LK) + 3, NK, H) (3 rows in no sequence); do (B, TQ, N, H); cu_k (B + 1,)."""
    tk = sum(LK) + 3
    q = jnp.asarray(rng.standard_normal((TQ, N, H)), dtype)
    k = jnp.asarray(rng.standard_normal((tk, NK, H)), dtype)
    v = jnp.asarray(rng.standard_normal((tk, NK, H)), dtype)
    do = jnp.asarray(rng.standard_normal((len(LK), TQ, N, H)), dtype)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(LK)]), jnp.int32)
    return q, k, v, do, cu_k


@functools.cache
def broadcast_fwd_bwd(impl: str, causal: bool):
    """jit: (q, k, v, do, cu_k) -> (o (B, TQ, N, H), dq, dk, dv) of broadcast_query_attention."""

    def run(q, k, v, do, cu_k):
        f = lambda q, k, v: broadcast_query_attention(
            q, k, v, cu_k, max_seqlen_k=max(LK), is_causal=causal, implementation=impl
        )
        o, vjp = jax.vjp(f, q, k, v)
        return (o, *vjp(do))

    return jax.jit(run)


@functools.cache
def tiled_query_fwd_bwd(impl: str, causal: bool):
    """jit: the contract's definition, varlen_attention on the query tiled once per key/value sequence ->
    (o (B, TQ, N, H), dq of each copy (B, TQ, N, H), dk, dv)."""

    def run(q, k, v, do, cu_k):
        b = cu_k.shape[0] - 1
        cu_q = jnp.arange(b + 1, dtype=jnp.int32) * TQ
        f = lambda qt, k, v: mx.varlen_attention(
            qt, k, v, cu_q, cu_k, max_seqlen_q=TQ, max_seqlen_k=max(LK), is_causal=causal, implementation=impl
        )
        o, vjp = jax.vjp(f, jnp.tile(q, (b, 1, 1)), k, v)
        dqt, dk, dv = vjp(do.reshape(b * TQ, N, H))
        return o.reshape(b, TQ, N, H), dqt.reshape(b, TQ, N, H), dk, dv

    return jax.jit(run)
