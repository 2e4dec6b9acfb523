"""dot_product_attention: MXFP8 scaled dot-product attention with jax.nn's layout and masks, and its custom_vjp.

The custom_vjp's residuals are the quantized operands (MXArrays: 1 byte per element plus scales), the
output O and the LSE; the T x S matrix is recomputed tile by tile in the backward and never stored.
The forward and the residuals are ops/attention_core.py's; the backward (mx_attention_bwd) runs the Hopper
backward kernel where a variant covers the call (ops/attention_bwd_kernel.py), on compute capability 10.x the
Blackwell one (ops/attention_bwd_sm100.py), else the XLA reference
(attention_core.reference_backward); the argument checks are ops/attention_checks.py's.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.ops import attention_compat as compat
from jax_mxfp8.ops.attention_bwd_kernel import backward_variant, kernel_backward
from jax_mxfp8.ops.attention_bwd_sm100 import sm100_backward_variant, sm100_kernel_backward
from jax_mxfp8.ops.attention_checks import (
    check_bias_or_mask,
    check_config,
    check_implementation,
    check_qkv_operand,
    check_qkv_shapes,
    check_scale,
    check_seq_lengths,
    output_dtype,
)
from jax_mxfp8.ops.attention_core import (
    BLACKWELL,
    AttentionStatic,
    choose_implementation,
    kernel_arch,
    kernel_unsupported,
    mx_attention_fwd,
    reference_backward,
)
from jax_mxfp8.ops.cotangents import remat_safe
from jax_mxfp8.ops.no_second_order import guard_bwd, guard_fwd
from jax_mxfp8.ops.scope import named_op


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mx_attention(static: AttentionStatic, q, k, v, bias, mask, q_len, kv_len):
    return mx_attention_fwd(static, q, k, v, bias, mask, q_len, kv_len)[0]


def mx_attention_bwd(static: AttentionStatic, res, cts):
    """The custom_vjp bwd on mx_attention_fwd's residuals: the backward kernel when the forward ran the kernel
    path and a backward variant covers the call (ops/attention_bwd_kernel.py), else the XLA reference.
    Returns the cotangents of (q, k, v, bias, mask, q_len, kv_len). After the Blackwell forward the Blackwell
    backward where a variant covers the call (ops/attention_bwd_sm100.py)."""
    if static.kernel_path and static.arch == BLACKWELL:
        if sm100_backward_variant(static, res[1].shape[-1]) is not None:
            return sm100_kernel_backward(static, res, cts)
        return reference_backward(static, res, cts)
    if static.kernel_path:
        o = res[1]  # (B, T, N, H)
        variant, _ = backward_variant(static, o.shape[-1])
        if variant is not None:
            return kernel_backward(static, variant, res, cts)
    return reference_backward(static, res, cts)


# grad of grad would be silently zero (quantized residuals): raise instead (ops/no_second_order.py)
# FP8 residuals (the quantized operands) travel as bits: jax.checkpoint would NaN E4M3's top binade
_mx_attention.defvjp(
    *remat_safe(
        guard_fwd(mx_attention_fwd, "dot_product_attention", argnums=(1, 2, 3, 4)),
        guard_bwd(mx_attention_bwd, "dot_product_attention"),
    )
)

# Eager calls would dispatch the tiled scan op by op; one compiled program per static signature is far
# faster, and inside an outer jit this inner jit is simply inlined.
_mx_attention_jit = jax.jit(_mx_attention, static_argnums=(0,))


@named_op("dot_product_attention")
def dot_product_attention(
    query: jax.Array | MXArray,
    key: jax.Array | MXArray,
    value: jax.Array | MXArray,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: jax.Array | None = None,
    key_value_seq_lengths: jax.Array | None = None,
    implementation: str | None = None,
    config: AttentionConfig | None = None,
    return_residual: bool | str = False,
    local_window_size: int | tuple[int, int] | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """MXFP8 scaled dot-product attention with jax.nn.dot_product_attention's layout and masks.

    softmax(scale * Q^ K^T + bias) V^ per head, with Q, K, V, P and (in the backward) dO and dS quantized to
    MXFP8 as docs/numerics.md specifies (options in `config`).

    Args:
      query: (B, T, N, H) or (T, N, H) float32/bfloat16/float16, or an MXArray of that shape blocked within
        (T, H). T must be a multiple of 32; H a multiple of 32 up to 256.
      key: (B, S, K, H) (or (S, K, H)); N must be a multiple of K (GQA; K == 1 is MQA). S a multiple of 32.
      value: same shape as key.
      bias: optional float array broadcastable to (B, N, T, S) (rank <= 4, leading axes added), added to the
        scaled logits; it receives a gradient. An entry of -inf masks its logit (as a False mask entry
        does: a row whose bias is -inf at every key is fully masked, below); +inf or NaN makes its row NaN.
      mask: optional bool array broadcastable to (B, N, T, S); True = attend.
      scale: softmax scale tau (a Python number); default 1 / sqrt(H).
      is_causal: query t attends key s <= t (top-left aligned, like jax.nn).
      query_seq_lengths, key_value_seq_lengths: optional (B,) int arrays in [0, T] / [0, S]; positions past
        them are padding: zeroed before quantization (so padding never changes a valid row's block scale)
        and masked. Concrete lengths outside that range raise ValueError; traced ones (under jit) act as
        the nearest length in it (< 0 as 0, > T as T).
      implementation: None (the Hopper kernel where it runs and covers the arguments, else the XLA
        reference), "xla" (the reference, runs anywhere), "emulated" (the kernel path with the kernel's
        arithmetic emulated in XLA: any machine, slow, for tests) or "cuda" (the kernel, or RuntimeError /
        ValueError saying why not). On the kernel path the backward runs the backward kernel where a
        variant covers the call (ops/attention_bwd_kernel.py), else the XLA reference. See
        choose_implementation and kernel_unsupported.
      config: AttentionConfig (default AttentionConfig()).
      return_residual: True: also return jax.nn's residual, the log-sum-exp (B, T, N) (or (T, N)) in the
        output's dtype with its gradient stopped; "lse": our float32 (B, N, T) LSE, differentiable.
      local_window_size: (left, right) or w = (w, w): query t attends keys t - left .. t + right, as in
        jax.nn (XLA reference only). See jax_mxfp8/ops/attention_compat.py.

    Returns:
      The output, shaped like query, in the inputs' dtype (bfloat16 if all three are MXArrays). Query rows
      with no valid key (fully masked) are 0 (jax.nn's XLA path: the mean of V) and their LSE -inf. With
      return_residual, (output, residual) as above.

    Gradients flow to query, key, value and bias (not to MXArray inputs, which are constants), under the
    straight-through rule: quantization is treated as identity and the backward GEMMs are MXFP8 too.
    """
    check_implementation(implementation)
    compat.check_return_residual(return_residual)
    call = prepare_call(
        query, key, value, bias, mask, scale=scale, is_causal=is_causal, query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths, implementation=implementation, config=config,
        local_window_size=local_window_size,
    )  # fmt: skip
    if call.static is None:  # nothing to compute, on any implementation (docs/numerics.md "Zero-size inputs")
        return _results(*call.empty, call.unbatched, return_residual)
    out, lse = _mx_attention_jit(call.static, *call.args)
    return _results(out, lse, call.unbatched, return_residual)


@dataclasses.dataclass(frozen=True)
class PreparedCall:
    """One checked dot_product_attention call: its static (None when B == 0), the custom_vjp's operands (q, k,
    v, bias, mask, q_len, kv_len; batched), whether the caller's inputs were rank 3, and for B == 0 the (out,
    lse) of the empty call."""

    static: AttentionStatic | None
    args: tuple
    unbatched: bool
    empty: tuple | None = None


def prepare_call(
    query, key, value, bias=None, mask=None, *, scale=None, is_causal=False, query_seq_lengths=None,
    key_value_seq_lengths=None, implementation=None, config=None, local_window_size=None,
) -> PreparedCall:  # fmt: skip
    """dot_product_attention's argument checks and implementation choice (its arguments, without
    return_residual): what it and dot_product_attention_vjp's kernel route run."""
    check_implementation(implementation)
    window = compat.check_window(local_window_size)
    config = check_config(config, is_causal)

    q, unbatched = check_qkv_operand(query, "query")
    k, k_unb = check_qkv_operand(key, "key")
    v, v_unb = check_qkv_operand(value, "value")
    if not (unbatched == k_unb == v_unb):
        raise ValueError(f"query, key and value must all be rank 4 or all rank 3; got {q.shape}, {k.shape}, {v.shape}")
    b, t, n, h, s, n_kv = check_qkv_shapes(q, k, v)
    if t % BLOCK_SIZE or t == 0:
        raise ValueError(f"query sequence length T={t} (axis 1) must be a positive multiple of {BLOCK_SIZE}")
    if s % BLOCK_SIZE or s == 0:
        raise ValueError(f"key sequence length S={s} (axis 1) must be a positive multiple of {BLOCK_SIZE}")
    out_dtype = output_dtype([("query", q), ("key", k), ("value", v)])
    full = (b, n, t, s)
    bias = check_bias_or_mask(bias, "bias", full, is_mask=False)
    mask = check_bias_or_mask(mask, "mask", full, is_mask=True)
    if window is not None:
        mask = compat.with_window(mask, window, t, s)
    q_len = check_seq_lengths(query_seq_lengths, "query_seq_lengths", b, t, "axis 1 of query")
    kv_len = check_seq_lengths(key_value_seq_lengths, "key_value_seq_lengths", b, s, "axis 1 of key")
    why_not = kernel_unsupported(
        config,
        head_dim=h,
        is_causal=bool(is_causal),
        has_bias=bias is not None,
        has_mask=mask is not None,
        out_dtype=out_dtype,
        mx_inputs=[(nm, x) for nm, x in (("query", q), ("key", k), ("value", v)) if isinstance(x, MXArray)],
    )
    why_not = compat.KERNEL_NO_WINDOW if window is not None else why_not
    args = (q, k, v, bias, mask, q_len, kv_len)
    if b == 0:
        check_scale(scale, h)
        empty = (jnp.zeros((0, t, n, h), out_dtype), jnp.zeros((0, n, t), jnp.float32))
        return PreparedCall(None, args, unbatched, empty)
    static = AttentionStatic(
        config=config,
        scale=check_scale(scale, h),
        is_causal=bool(is_causal),
        is_mx=tuple(isinstance(x, MXArray) for x in (q, k, v)),
        out_dtype=out_dtype,
        group=n // n_kv,
        impl=choose_implementation(implementation, why_not),
        arch=kernel_arch(),
    )
    return PreparedCall(static, args, unbatched)


def _results(out, lse, unbatched: bool, return_residual):
    """dot_product_attention's return value from o (B, T, N, H) and the float32 LSE (B, N, T)."""
    if unbatched:
        out, lse = out[0], lse[0]
    if not return_residual:
        return out
    return (out, lse) if return_residual == "lse" else (out, compat.jax_nn_residual(lse, out.dtype))
