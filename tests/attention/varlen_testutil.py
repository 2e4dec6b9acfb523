"""Packed jagged inputs and the dense-kernel route on the padded batch, for the varlen kernel tests."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jax_mxfp8
from jax_mxfp8.reference.varlen import seq_lengths, to_packed, to_padded


def packed_inputs(rng, lengths_q, lengths_k, n, n_kv, h, slack=5):
    """Packed bf16 q (T_q, N, H), k, v (T_k, K, H) with `slack` rows after the last sequence (rows in no
    sequence), and the (B + 1,) offsets."""
    tq, tk = sum(lengths_q) + slack, sum(lengths_k) + slack
    q = jnp.asarray(rng.standard_normal((tq, n, h)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((tk, n_kv, h)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((tk, n_kv, h)) * 2.0, jnp.bfloat16)
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(lengths_q)]), jnp.int32)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(lengths_k)]), jnp.int32)
    return q, k, v, cu_q, cu_k


def dense_kernel_on_padded(case, q, k, v, cu_q, cu_k, implementation="cuda"):
    """dot_product_attention's kernel path (implementation "cuda", or "emulated" on a CPU) on the padded batch
    with lengths, back to packed rows: the route varlen_attention took before the packed kernel."""
    max_q, max_k = max(case["lq"]), max(case["lk"])
    lq, lk = seq_lengths(cu_q, max_q), seq_lengths(cu_k, max_k)
    pad_q, pad_k = -(-max_q // 32) * 32, -(-max_k // 32) * 32
    out = jax_mxfp8.dot_product_attention(
        to_padded(q, cu_q, lq, pad_q),
        to_padded(k, cu_k, lk, pad_k),
        to_padded(v, cu_k, lk, pad_k),
        is_causal=case["causal"],
        query_seq_lengths=lq,
        key_value_seq_lengths=lk,
        implementation=implementation,
        config=jax_mxfp8.AttentionConfig(p_scale=case.get("p_scale", "const")),
    )
    return to_packed(out, cu_q, lq, q.shape[0])
