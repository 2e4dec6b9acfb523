"""Public MXFP8 attention over packed jagged sequences (the layout recommender models use).

On the Hopper kernel (implementation "cuda", or None on sm_90) the FP8 data stays packed: ops/varlen_kernel.py.
The XLA path gathers each sequence into a row of a padded (B, max_seqlen) batch (blocks restart at each
sequence start; zeros past its end), runs the dense custom_vjp op with per-row sequence lengths, and
gathers the rows back. It spends compute on that padding: B * ceil32(max_seqlen_q) * ceil(max_seqlen_k /
kv_tile) * kv_tile logits per head, against sum_b Lq_b * Lk_b useful ones (docs/attention-reference.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.ops.attention import dot_product_attention
from jax_mxfp8.ops.attention_checks import (
    check_concrete_offsets,
    check_config,
    check_cu_seqlens,
    check_head_dim,
    check_implementation,
    check_max_seqlen,
    check_offsets_traced,
    check_packed_operand,
    check_scale,
    output_dtype,
)
from jax_mxfp8.ops.attention_core import AttentionStatic, choose_implementation, kernel_unsupported
from jax_mxfp8.ops.scope import named_op
from jax_mxfp8.ops.varlen_kernel import VarlenStatic, packed_kernel_attention
from jax_mxfp8.reference.attention_tiling import round_up
from jax_mxfp8.reference.varlen import sanitize_offsets, seq_lengths, to_packed, to_padded


def _padded(x, cu, lengths, padded_len: int):
    if isinstance(x, MXArray):
        x = x.natural()
        return MXArray(
            data=to_padded(x.data, cu, lengths, padded_len),
            scale=to_padded(x.scale, cu, lengths, padded_len),
            axes=x.axes,
            block=x.block,
        )
    return to_padded(x, cu, lengths, padded_len)


@named_op("varlen_attention")
def varlen_attention(
    q: jax.Array | MXArray,
    k: jax.Array | MXArray,
    v: jax.Array | MXArray,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float | None = None,
    is_causal: bool = False,
    implementation: str | None = None,
    config: AttentionConfig | None = None,
    check_offsets: bool = False,
) -> jax.Array:
    """MXFP8 attention over packed jagged sequences.

    Sequence b holds packed rows cu_seqlens_q[b] : cu_seqlens_q[b + 1] of q and cu_seqlens_k[b] :
    cu_seqlens_k[b + 1] of k and v, and attends only within itself. MX blocks along the sequence restart at
    each sequence start and a partial last block's scale comes from its valid rows only, so a sequence's
    output and gradients do not depend on any other sequence (bit for bit). Sequence lengths need not be
    multiples of 32.

    Args:
      q: (T_total_q, N, H) float32/bfloat16/float16, or an MXArray blocked along H only (row, axis -1).
      k, v: (T_total_k, K, H), N a multiple of K; H a multiple of 32 up to 256.
      cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 non-decreasing offsets within [0, T_total] (cu[0] is
        usually 0). Concrete offsets are checked (ValueError). Traced offsets (under jit) cannot be: they
        are clamped to [0, T_total] and made non-decreasing (reference/varlen.py sanitize_offsets: an
        offset past T_total ends its sequence there, a negative one starts it at row 0, one below its
        predecessor is raised to it), so rows outside the packed arrays never act as keys or queries and
        sequences never overlap; valid offsets are unchanged. check_offsets=True checks them instead.
      max_seqlen_q, max_seqlen_k: static Python ints >= every sequence length (checked when the offsets
        are concrete; under jit a longer sequence is truncated to them).
      scale: softmax scale; default 1 / sqrt(H).
      is_causal: within each sequence, query i attends key j <= i (top-left aligned as in
        dot_product_attention; flash-attn's varlen API aligns bottom-right when lengths differ).
      implementation: None, "xla", "emulated" or "cuda", as for dot_product_attention ("emulated": the
        packed kernel path with the kernel calls emulated in XLA). "cuda" runs the packed Hopper
        kernel path (ops/varlen_kernel.py: FP8 operands in packed order, each sequence starting on a
        128-row tile, no padding to max_seqlen; its backward on the packed backward kernel where a variant
        covers the config, p_scale "const" with dq_accum "fp32", else on the dense kernel over the padded
        batch); "xla" gathers the sequences into a padded batch with lengths and runs the reference.
      config: AttentionConfig (default AttentionConfig()).
      check_offsets: the checked mode for traced offsets: the checks of concrete offsets become
        jax.experimental.checkify checks (non-decreasing, within [0, T_total], no sequence longer than
        max_seqlen). Wrap the computation: `err, out = checkify.checkify(jax.jit(f))(...)`, then
        `err.throw()`; without checkify.checkify around it, jit refuses to lower the checks.

    Returns:
      (T_total_q, N, H) in the inputs' dtype; packed rows outside every sequence are 0.
    """
    check_implementation(implementation)
    q, k, v = check_packed_operand(q, "q"), check_packed_operand(k, "k"), check_packed_operand(v, "v")
    if k.shape != v.shape:
        raise ValueError(f"v must have k's shape {k.shape}; got {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k has head_dim {k.shape[-1]} but q has {q.shape[-1]}")
    check_head_dim(q.shape[-1], "q")
    cu_q, cu_k = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q"), check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k")
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_q {cu_q.shape} and cu_seqlens_k {cu_k.shape} must describe the same B")
    max_q, max_k = check_max_seqlen(max_seqlen_q, "max_seqlen_q"), check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    check_concrete_offsets(cu_seqlens_q, max_q, q.shape[0], "cu_seqlens_q", "max_seqlen_q")
    check_concrete_offsets(cu_seqlens_k, max_k, k.shape[0], "cu_seqlens_k", "max_seqlen_k")
    if check_offsets:
        check_offsets_traced(cu_q, max_q, q.shape[0], "cu_seqlens_q", "max_seqlen_q")
        check_offsets_traced(cu_k, max_k, k.shape[0], "cu_seqlens_k", "max_seqlen_k")
    # what traced offsets get (the docstring): rows outside [0, T_total) never act, sequences never overlap
    cu_q, cu_k = sanitize_offsets(cu_q, q.shape[0]), sanitize_offsets(cu_k, k.shape[0])

    config = check_config(config, is_causal)
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"q ({q.shape[1]}) and k ({k.shape[1]}) must have at least one head (axis 1)")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads, not a multiple of k's {k.shape[1]} heads")
    operands = [("q", q), ("k", k), ("v", v)]
    for name, x in operands:
        if not isinstance(x, MXArray) and (not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 2):
            raise ValueError(f"{name} has dtype {x.dtype}; pass float32, bfloat16 or float16 (or an MXArray)")
    why_not = kernel_unsupported(
        config,
        head_dim=q.shape[-1],
        is_causal=bool(is_causal),
        has_bias=False,
        has_mask=False,
        out_dtype=output_dtype(operands),
        mx_inputs=[(nm, x) for nm, x in operands if isinstance(x, MXArray)],
    )
    if q.shape[0] == 0 or k.shape[0] == 0:  # no query rows, or no key in any sequence: O = 0 (documented)
        check_scale(scale, q.shape[-1])
        return jnp.zeros(q.shape, output_dtype(operands))
    path = choose_implementation(implementation, why_not, op="varlen_attention")
    if path != "xla":
        st = VarlenStatic(
            dense=AttentionStatic(
                config=config,
                scale=check_scale(scale, q.shape[-1]),
                is_causal=bool(is_causal),
                is_mx=(False, False, False),
                out_dtype=output_dtype(operands),
                group=q.shape[1] // k.shape[1],
                impl=path,
            ),
            max_q=max_q,
            max_k=max_k,
            total_q=q.shape[0],
            total_k=k.shape[0],
        )
        return _packed_jit(st, q, k, v, cu_q, cu_k)
    return _varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale, bool(is_causal), config, "xla")


_packed_jit = jax.jit(packed_kernel_attention, static_argnums=(0,))


@functools.partial(jax.jit, static_argnums=(5, 6, 7, 8, 9, 10))
def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale, is_causal, config, implementation):
    """Gather to (B, ceil32(max_seqlen), ...) rows, run the dense op with lengths, gather back."""
    len_q, len_k = seq_lengths(cu_q, max_q), seq_lengths(cu_k, max_k)
    lq, lk = round_up(max_q, BLOCK_SIZE), round_up(max_k, BLOCK_SIZE)
    out = dot_product_attention(
        _padded(q, cu_q, len_q, lq),
        _padded(k, cu_k, len_k, lk),
        _padded(v, cu_k, len_k, lk),
        scale=scale,
        is_causal=is_causal,
        query_seq_lengths=len_q,
        key_value_seq_lengths=len_k,
        config=config,
        implementation=implementation,
    )
    return to_packed(out, cu_q, len_q, q.shape[0])
