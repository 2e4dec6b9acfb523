"""Public MXFP8 attention of ONE query sequence against B key/value sequences.

The recommender's case: one candidate's query rows attend each of B user histories. The semantics are
those of varlen_attention (or dot_product_attention with lengths) on the query tiled B times, without the
caller tiling it: the query is quantized once (its MX blocks are the same in every copy, since the blocks
of a sequence restart at its start) and its FP8 MXArrays are broadcast over the batch; its gradient is the
sum of the B per-sequence gradients, accumulated in float32 and rounded once to the input dtype.

  broadcast_query_attention(query (Tq, N, H), key, value, cu_seqlens_k=None, *, max_seqlen_k=None,
                            key_value_seq_lengths=None, ...) -> (B, Tq, N, H)

On the kernel path the forward and backward kernels' `broadcast_q` variants (kernels/registry: the
production schedules with the Q coordinate at batch 0) read the one query row for every KV sequence: the
producer pass re-encodes the query once (1, N, Tp, H) and the backward's pre-pass dequantizes it once; the
backward kernel adds every sequence's dQ into one float32 dq (1, N, Tp, H) (its float32 reductions, in the
atomics' order: docs/numerics.md "broadcast_query_attention"), so no per-sequence dq is written or summed.
The dQ modes (AttentionConfig dq_accum="fp16" or deterministic=True) have no broadcast_q backward variant:
their backward is the XLA reference on the broadcast residuals, dq per sequence summed over B in float32
(the deterministic ordering is per batch row, and a float16 accumulator holding dQ 2^e summed over B
sequences would overflow B times sooner). On the XLA path the broadcast FP8 query feeds the reference's
dequantize-and-GEMM fusions.
On compute capability 10.x the backward is the sm100 kernel's with q of batch 1 (ops/attention_bwd_sm100.py;
dQ summed over the batch in float32 in the kernel), for dq_accum "fp32" without deterministic.
Packed key/value sequences run on the padded batch (B, ceil32(max_seqlen_k)), as varlen_attention's XLA
route does (the packed kernel has no broadcast_q variant).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import check_float32_range
from jax_mxfp8.ops import attention_bwd_kernel as kernel_bwd
from jax_mxfp8.ops.attention import mx_attention_bwd
from jax_mxfp8.ops.attention_bwd_sm100 import sm100_backward_variant, sm100_kernel_backward
from jax_mxfp8.ops.attention_checks import (
    check_concrete_offsets,
    check_config,
    check_cu_seqlens,
    check_head_dim,
    check_implementation,
    check_max_seqlen,
    check_scale,
    check_seq_lengths,
    output_dtype,
)
from jax_mxfp8.ops.attention_core import (
    BLACKWELL,
    AttentionStatic,
    choose_implementation,
    forward_from_quants,
    fwd_kernel,
    kernel_arch,
    kernel_unsupported,
    quantize_operands,
)
from jax_mxfp8.ops.cotangents import remat_safe
from jax_mxfp8.ops.no_second_order import guard_bwd, guard_fwd
from jax_mxfp8.ops.scope import named_op
from jax_mxfp8.reference.attention_tiling import round_up
from jax_mxfp8.reference.varlen import sanitize_offsets, seq_lengths, to_packed, to_padded

OP = "broadcast_query_attention"


def _broadcast_mx(x: MXArray, b: int) -> MXArray:
    """A batch-1 MXArray (batch axis 0, as every residual layout has) broadcast to batch b (FP8 bytes only)."""
    grow = lambda a: jnp.broadcast_to(a, (b,) + a.shape[1:])
    return MXArray(grow(x.data), grow(x.scale), x.axes, x.block)


def _broadcast_quants(quants: dict[str, MXArray], b: int) -> dict[str, MXArray]:
    return {key: _broadcast_mx(x, b) if key[0] == "q" and isinstance(x, MXArray) else x for key, x in quants.items()}


def _fwd(static: AttentionStatic, q1, k, v, q_len, kv_len):
    """q1 (1, Tp, N, H); k, v (B, S, K, H); q_len (B,) (all Tq), kv_len (B,) or None -> o (B, Tp, N, H)."""
    quants = quantize_operands(static, q1, k, v, q_len[:1], kv_len)  # the query once, at batch 1
    if static.kernel_path:  # the broadcast_q kernel variant reads the one query row for every batch row
        o, lse = fwd_kernel(static, quants, q_len, kv_len, broadcast_q=True)
    else:
        bq = _broadcast_quants(quants, k.shape[0])
        (o, lse), _ = forward_from_quants(static, bq, None, None, q_len, kv_len)
    return o, (quants, o, lse, q_len, kv_len)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _broadcast_attention(static: AttentionStatic, q1, k, v, q_len, kv_len):
    return _fwd(static, q1, k, v, q_len, kv_len)[0]


def _bwd(static: AttentionStatic, res, do):
    """dot_product_attention's backward: the broadcast_q backward kernel where one covers the call (dq
    (1, Tp, N, H), summed over the batch in float32 in the kernel, cast once), else the reference in float32
    on the broadcast residuals (dq (B, Tp, N, H), summed over the batch here, then cast)."""
    quants, o, lse, q_len, kv_len = res
    f32 = dataclasses.replace(static, out_dtype=np.dtype(np.float32))  # out_dtype only casts the cotangents
    cts = (do, jnp.zeros_like(lse))
    variant = None
    sm100 = sm100_backward_variant(static, o.shape[-1], broadcast_q=True)
    if sm100 is not None:  # the sm100 backward with q of batch 1: dq summed over the batch in float32, cast once
        res_kernel = (quants, o, lse, None, None, q_len, kv_len)
        dq, dk, dv, *_ = sm100_kernel_backward(static, res_kernel, cts, broadcast_q=True)
        return dq, dk, dv, None, None
    if static.kernel_path and static.arch != BLACKWELL:
        variant, _ = kernel_bwd.backward_variant(static, o.shape[-1], broadcast_q=True)
    if variant is not None:  # dq comes summed (float32 in the kernel): the output dtype directly, one rounding
        res_kernel = (quants, o, lse, None, None, q_len, kv_len)
        dq, dk, dv, *_ = kernel_bwd.kernel_backward(static, variant, res_kernel, cts, broadcast_q=True)
    else:
        res_dense = (_broadcast_quants(quants, o.shape[0]), o, lse, None, None, q_len, kv_len)
        dq, dk, dv, *_ = mx_attention_bwd(f32, res_dense, cts)
        dq = jnp.sum(dq, axis=0, keepdims=True)
    out = static.out_dtype
    return dq.astype(out), dk.astype(out), dv.astype(out), None, None


_broadcast_attention.defvjp(*remat_safe(guard_fwd(_fwd, OP, argnums=(1, 2, 3)), guard_bwd(_bwd, OP)))
_broadcast_jit = jax.jit(_broadcast_attention, static_argnums=(0,))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _pad_rows(x, cu, lengths, padded_len: int, total: int):
    """Packed (T_total, ...) -> (B, padded_len, ...) rows (to_padded). Its VJP is the gather to_packed, the
    exact transpose (every packed row lands in at most one padded position), not autodiff's scatter-add
    (atomics on the GPU)."""
    return to_padded(x, cu, lengths, padded_len)


def _pad_rows_fwd(x, cu, lengths, padded_len, total):
    return to_padded(x, cu, lengths, padded_len), (cu, lengths)


def _pad_rows_bwd(padded_len, total, res, g):
    cu, lengths = res
    return to_packed(g, cu, lengths, total), None, None


_pad_rows.defvjp(_pad_rows_fwd, _pad_rows_bwd)


def _check_float(x, name: str, rank: int) -> jax.Array:
    if isinstance(x, MXArray):
        raise ValueError(f"{name} must be a float array; broadcast_query_attention takes no MXArrays")
    check_float32_range(x, name)
    x = jnp.asarray(x)
    if x.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}; got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 2:
        raise ValueError(f"{name} has dtype {x.dtype}; pass float32, bfloat16 or float16")
    return x


def _checked_kv(k, v, cu_seqlens_k, max_seqlen_k, key_value_seq_lengths):
    """The checked key/value: (k, v, cu, max_k, kv_len). Padded: k, v (B, S, K, H), kv_len (B,) or None,
    cu and max_k None. Packed: k, v (T_total_k, K, H), cu (B + 1,) int32 (sanitized as varlen_attention's:
    traced offsets never reach outside the rows), max_k an int, kv_len None."""
    if cu_seqlens_k is None:
        if max_seqlen_k is not None:
            raise ValueError("max_seqlen_k is for packed key/value (with cu_seqlens_k); got padded (B, S, K, H)")
        k, v = _check_float(k, "key", 4), _check_float(v, "value", 4)
        s = k.shape[1]
        if s % BLOCK_SIZE or s == 0:
            raise ValueError(f"key sequence length S={s} (axis 1) must be a positive multiple of {BLOCK_SIZE}")
        kv_len = check_seq_lengths(key_value_seq_lengths, "key_value_seq_lengths", k.shape[0], s, "axis 1 of key")
        return k, v, None, None, kv_len
    if key_value_seq_lengths is not None:
        raise ValueError("key_value_seq_lengths is for padded key/value; packed ones take cu_seqlens_k")
    if max_seqlen_k is None:
        raise ValueError("packed key/value (cu_seqlens_k given) need max_seqlen_k")
    k, v = _check_float(k, "key", 3), _check_float(v, "value", 3)
    cu = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k")
    max_k = check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    check_concrete_offsets(cu_seqlens_k, max_k, k.shape[0], "cu_seqlens_k", "max_seqlen_k")
    return k, v, sanitize_offsets(cu, k.shape[0]), max_k, None


def _padded_kv(k, v, cu, max_k: int):
    """Packed (T_total_k, K, H) key/value -> the padded (B, ceil32(max_k), K, H) batch and its (B,) lengths."""
    kv_len = seq_lengths(cu, max_k)
    pk, total = round_up(max_k, BLOCK_SIZE), k.shape[0]
    return _pad_rows(k, cu, kv_len, pk, total), _pad_rows(v, cu, kv_len, pk, total), kv_len


@named_op(OP)
def broadcast_query_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    cu_seqlens_k: jax.Array | None = None,
    *,
    max_seqlen_k: int | None = None,
    key_value_seq_lengths: jax.Array | None = None,
    scale: float | None = None,
    is_causal: bool = False,
    implementation: str | None = None,
    config=None,
) -> jax.Array:
    """MXFP8 attention of one query sequence against each of B key/value sequences, without tiling the query.

    Equals varlen_attention (and dot_product_attention with lengths) on the query tiled B times, one copy
    per key/value sequence: the output and dK, dV bit for bit; dQ is the sum over the B sequences of their
    float32 query gradients, rounded once to the input dtype (tiling and letting autodiff sum the copies'
    rounded gradients differs from it only by that rounding).

    Args:
      query: (Tq, N, H) float32/bfloat16/float16, one sequence (any Tq; padded to a multiple of 32
        internally, the padding rows masked). H a multiple of 32 up to 256.
      key, value: the B key/value sequences, either padded (B, S, K, H) (S a multiple of 32) with optional
        key_value_seq_lengths (B,) in [0, S] (concrete ones outside raise ValueError; traced ones act as
        the nearest length in it, as dot_product_attention's), or packed (T_total_k, K, H) with
        cu_seqlens_k (B + 1,) and max_seqlen_k (as varlen_attention's; traced offsets are sanitized the
        same way). N a multiple of K.
      scale: softmax scale; default 1 / sqrt(H).
      is_causal: query row i attends key j <= i of every sequence (top-left aligned).
      implementation: None, "xla", "emulated" or "cuda", as for dot_product_attention; the kernel path
        runs the dense kernels on the padded batch (module docstring: what is still per sequence).
      config: AttentionConfig (default AttentionConfig()).

    Returns:
      (B, Tq, N, H) in the inputs' dtype: row b is the query's attention over key/value sequence b (0 where
      that sequence is empty). Gradients flow to query (summed over b), key and value. B = 0, Tq = 0 or
      packed key/value with no rows give that result without running anything, on every implementation.
    """
    check_implementation(implementation)
    config = check_config(config, is_causal)
    q = _check_float(query, "query", 3)
    k, v, cu, max_k, kv_len = _checked_kv(key, value, cu_seqlens_k, max_seqlen_k, key_value_seq_lengths)
    if k.shape != v.shape:
        raise ValueError(f"value must have key's shape {k.shape}; got {v.shape}")
    tq, n, h = q.shape
    b = k.shape[0] if cu is None else cu.shape[0] - 1
    n_kv = k.shape[-2]
    check_head_dim(h, "query")
    if k.shape[-1] != h:
        raise ValueError(f"key has head_dim {k.shape[-1]} but query has {h}")
    if n == 0 or n_kv == 0:
        raise ValueError(f"query ({n}) and key ({n_kv}) must have at least one head")
    if n % n_kv:
        raise ValueError(f"query has {n} heads, not a multiple of key's {n_kv} heads")
    out_dtype = output_dtype([("query", q), ("key", k), ("value", v)])
    why_not = kernel_unsupported(
        config, head_dim=h, is_causal=bool(is_causal), has_bias=False, has_mask=False, out_dtype=out_dtype,
        mx_inputs=[],
    )  # fmt: skip
    if b == 0 or tq == 0 or k.shape[0] == 0:
        # nothing to compute (no sequence, no query row, or packed key/value without a row: every sequence
        # empty, its output 0): the result on every implementation (docs/numerics.md "Zero-size inputs")
        check_scale(scale, h)
        return jnp.zeros((b, tq, n, h), out_dtype)
    static = AttentionStatic(
        config=config,
        scale=check_scale(scale, h),
        is_causal=bool(is_causal),
        is_mx=(False, False, False),
        out_dtype=out_dtype,
        group=n // n_kv,
        impl=choose_implementation(implementation, why_not, op=OP),
        arch=kernel_arch(),
    )
    if cu is not None:
        k, v, kv_len = _padded_kv(k, v, cu, max_k)
    tp = round_up(tq, BLOCK_SIZE)
    q1 = jnp.pad(q, [(0, tp - tq), (0, 0), (0, 0)])[None]
    q_len = jnp.full((b,), tq, jnp.int32)
    return _broadcast_jit(static, q1, k, v, q_len, kv_len)[:, :tq]
