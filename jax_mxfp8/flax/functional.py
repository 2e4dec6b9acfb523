"""Stateless layer math shared by the NNX modules, the Linen modules and the adapters.

The modules only own parameters and pick a LayerPrecision; everything numeric happens here, once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.flax.checks import check_bool
from jax_mxfp8.flax.policy import LayerPrecision
from jax_mxfp8.formats import MXArray
from jax_mxfp8.ops.attention import dot_product_attention
from jax_mxfp8.ops.attention_checks import (
    check_bias_or_mask,
    check_concrete_offsets,
    check_cu_seqlens,
    check_max_seqlen,
)
from jax_mxfp8.ops.checks import check_rank
from jax_mxfp8.ops.mx_dot_general import mx_dot_general
from jax_mxfp8.ops.mx_dot_quantized import MXHandoff, mx_dot_general_handoff, mx_dot_general_quantized
from jax_mxfp8.ops.rms_norm_quantize import rms_norm_quantize
from jax_mxfp8.ops.varlen_attention import varlen_attention
from jax_mxfp8.parallel.fsdp import fsdp_mx_dot, fsdp_supported, gather_quantized
from jax_mxfp8.reference.attention_tiling import round_up
from jax_mxfp8.reference.rms_norm import rms_norm
from jax_mxfp8.reference.varlen import sanitize_offsets, seq_lengths, to_packed, to_padded


def linear(
    x: jax.Array,
    kernel: jax.Array,
    bias: jax.Array | None,
    precision: LayerPrecision,
    *,
    dtype=None,
    x_quantized: MXArray | MXHandoff | None = None,
    rng: jax.Array | None = None,
    hadamard_seed: int = 0,
    gather_sharding: jax.sharding.Sharding | None = None,
) -> jax.Array:
    """y = x @ kernel + bias over the last axis of x. (..., D_in) x (D_in, D_out) -> (..., D_out).

    MXFP8 GEMMs (forward and backward) when precision.gemm == "mxfp8", else BF16 operands with FP32
    accumulation whose GEMMs write bf16 when the output dtype is bf16 (bf16_linear: the bias is then added
    to the bf16-rounded product, as in stock Flax). The kernel stays in its parameter dtype; it is only
    quantized (or rounded to BF16) for the product. `dtype` is the output dtype (default: x's).
    `x_quantized` (from rms_norm_quantize) skips the forward quantization of x; an MXHandoff (from
    linear_gelu) also gives the weight gradient x's column orientation (mx_dot_general_handoff: no
    quantize pass over x in the backward either); `rng` feeds stochastic
    gradient rounding. `gather_sharding` (FSDP): quantize the kernel shard by shard and all-gather the
    MXFP8 bytes to this sharding instead of the high-precision kernel (see
    jax_mxfp8.parallel.gather_quantized).
    """
    check_rank(x, 1, "x")
    x_wgrad = None
    if isinstance(x_quantized, MXHandoff):
        x_quantized, x_wgrad = x_quantized.row, x_quantized.wgrad
    out_dtype = dtype or x.dtype
    dn = (((x.ndim - 1,), (0,)), ((), ()))
    config = precision.dot_config(hadamard_seed)
    sr = precision.grad_rounding == "stochastic"
    if precision.gemm == "mxfp8" and gather_sharding is not None and not sr and fsdp_supported(kernel.shape, config):
        # FSDP: MXFP8 gathers for the forward and the dgrad GEMM (no float32 weight all-gather at all); the
        # bias is added in float32 before the one rounding to out_dtype, as mx_dot_general(bias=) does
        y = fsdp_mx_dot(x, kernel, gather_sharding, config=config, x_quantized=x_quantized)
        return (y if bias is None else y + bias.astype(jnp.float32)).astype(out_dtype)
    if precision.gemm == "mxfp8" and x_wgrad is not None and not precision.hadamard and gather_sharding is None:
        # the previous GEMM's epilogue wrote both orientations of x: the wgrad skips its quantize pass
        return mx_dot_general_handoff(
            x, kernel, dn, preferred_element_type=out_dtype, bias=bias, config=config,
            rng=rng if sr else None, lhs_quantized=x_quantized, lhs_wgrad=x_wgrad,
        )  # fmt: skip
    if precision.gemm == "mxfp8":
        # the bias goes into the GEMM (its epilogue on the kernel path): added in float32 before the one
        # rounding to out_dtype, so the GEMM writes out_dtype instead of a float32 product to add it to
        return mx_dot_general(
            x,
            kernel,
            dn,
            preferred_element_type=out_dtype,
            bias=bias,
            config=config,
            rng=rng if precision.grad_rounding == "stochastic" else None,
            lhs_quantized=None if precision.hadamard else x_quantized,
            rhs_quantized=(
                gather_quantized(kernel, gather_sharding, axis=0)
                if gather_sharding is not None and not precision.hadamard
                else None
            ),
        )
    return bf16_linear(x, kernel, bias, np.dtype(out_dtype))


def linear_gelu(
    x: jax.Array,
    kernel: jax.Array,
    bias: jax.Array | None,
    precision: LayerPrecision,
    *,
    dtype=None,
    x_quantized: MXArray | None = None,
    rng: jax.Array | None = None,
    gather_sharding: jax.sharding.Sharding | None = None,
) -> tuple[jax.Array, MXHandoff | None]:
    """(gelu(x @ kernel + bias), its MXHandoff or None): the MLP's up projection and activation.

    (..., D_in) x (D_in, D_out) -> (..., D_out) in `dtype` (default x's). With precision.fuses_quantize
    (and no FSDP gather) the GEMM's epilogue quantizes gelu of the float32 result (+ bias) into row blocks
    along D_out (mx_dot_general_quantized), the MXArray the down projection takes as x_quantized, and
    (orientation "wgrad": only when differentiated) in column blocks along the tokens for the down
    projection's weight gradient: both in an MXHandoff, which linear takes as x_quantized. Else
    jax.nn.gelu(linear(...)) and None (the down projection quantizes it itself).
    """
    out_dtype = dtype or x.dtype
    if not precision.fuses_quantize or gather_sharding is not None or kernel.shape[-1] % 32:
        y = linear(x, kernel, bias, precision, dtype=dtype, x_quantized=x_quantized, rng=rng,
                   gather_sharding=gather_sharding)  # fmt: skip
        return jax.nn.gelu(y), None
    check_rank(x, 1, "x")
    if isinstance(x_quantized, MXHandoff):
        x_quantized = x_quantized.row
    h, h_q, h_w = mx_dot_general_quantized(
        x,
        kernel,
        (((x.ndim - 1,), (0,)), ((), ())),
        activation="gelu",
        preferred_element_type=out_dtype,
        bias=bias,
        config=precision.dot_config(),
        rng=rng if precision.grad_rounding == "stochastic" else None,
        lhs_quantized=x_quantized,
        orientations=("row", "wgrad"),
    )
    return h, MXHandoff(row=h_q, wgrad=h_w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def bf16_linear(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, out_dtype: np.dtype) -> jax.Array:
    """x @ kernel + bias with BF16 operands and FP32 accumulation, forward AND backward; (..., D_in) x
    (D_in, D_out) (+ (D_out,)) -> (..., D_out) in out_dtype.

    Every GEMM writes its result in the dtype it is rounded to anyway (`_gemm_out_dtype`): bfloat16 for
    bfloat16 outputs and gradients, as a stock nnx.Linear(dtype=bfloat16) does. A bf16 x bf16 -> bf16
    dot_general still accumulates in float32 and rounds once at the end (XLA's default accumulator for
    BF16 dots: cuBLAS compute type 32F on the GPU; XLA:CPU likewise; tests/flax/test_flax_bf16_linear.py
    checks it on the backend it runs on), so the product values are those of a float32 product rounded to
    bfloat16, but the GEMM writes (and the next op reads) half the bytes: writing float32 products and
    converting them in a separate pass cost the BF16 policy's train step ~2.4 GB of extra HBM traffic (see
    docs/perf/journal/perf-notes.md, "BF16 policy vs stock block").

    Bias (changed with that): with a bfloat16 output the bias (float32) is added in float32 to the product
    already rounded to bfloat16, and the sum is rounded again (two roundings, like stock Flax, which adds a
    bf16-rounded bias in bf16); with a float32 output (or float16, whose product is still formed in float32)
    the bias is added to the float32 product before the one rounding.

    Why a custom_vjp: autodiff of dot_general(bf16, bf16, preferred_element_type=float32) hands the
    backward a float32 cotangent, and JAX then runs both backward GEMMs with float32 operands (the bf16
    operand upcast): float32/TF32 GEMMs on a GPU. Here the cotangent is rounded to bfloat16 (a no-op when
    out_dtype is bfloat16, the usual case), so dx and dkernel are bf16 x bf16 GEMMs with float32
    accumulation like the forward. Gradients are rounded as autodiff rounded them (dx to x's dtype, dkernel
    to bfloat16 and back to the kernel's dtype), each once, by the GEMM that computes it.
    """
    return _bf16_linear_fwd(x, kernel, bias, out_dtype)[0]


def _gemm_out_dtype(dtype) -> np.dtype:
    """The dtype a BF16 GEMM whose result is rounded to `dtype` writes: bfloat16 itself, else float32."""
    return np.dtype(jnp.bfloat16) if np.dtype(dtype) == jnp.bfloat16 else np.dtype(jnp.float32)


def _bf16_dot(a: jax.Array, b: jax.Array, dims, out_dtype) -> jax.Array:
    """dot_general of bf16 a, b (FP32 accumulation) written as _gemm_out_dtype(out_dtype), then out_dtype."""
    y = lax.dot_general(a, b, dims, preferred_element_type=_gemm_out_dtype(out_dtype))
    return y.astype(out_dtype)


def _bf16_linear_fwd(x, kernel, bias, out_dtype):
    xb, kb = x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16)
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    if bias is None:
        return _bf16_dot(xb, kb, dims, out_dtype), (x, kernel, bias)
    y = _bf16_dot(xb, kb, dims, _gemm_out_dtype(out_dtype)).astype(jnp.float32)
    return (y + bias.astype(jnp.float32)).astype(out_dtype), (x, kernel, bias)


def _bf16_linear_bwd(out_dtype, res, g):
    x, kernel, bias = res
    xb, kb, gb = x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16), g.astype(jnp.bfloat16)
    lead = tuple(range(g.ndim - 1))
    dx = _bf16_dot(gb, kb, (((g.ndim - 1,), (1,)), ((), ())), x.dtype)
    # dk is rounded to bfloat16 (by the GEMM), as autodiff through kernel.astype(bfloat16) did (and stock
    # Flax does), then widened to the kernel's dtype
    dk = _bf16_dot(xb, gb, ((lead, lead), ((), ())), jnp.bfloat16).astype(kernel.dtype)
    db = None if bias is None else jnp.sum(g.astype(jnp.float32), axis=lead).astype(bias.dtype)
    return dx, dk, db


bf16_linear.defvjp(_bf16_linear_fwd, _bf16_linear_bwd)


def norm(x: jax.Array, weight: jax.Array, precision: LayerPrecision, eps: float) -> tuple[jax.Array, MXArray | None]:
    """RMSNorm over the last axis; also returns its MXArray when the next GEMM runs in MXFP8."""
    if precision.gemm == "mxfp8" and not precision.hadamard:
        return rms_norm_quantize(x, weight, eps=eps)
    return rms_norm(x, weight, eps), None


def rope(x: jax.Array, positions: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding over the last axis of x (..., T, N, H) with positions (..., T)."""
    h = x.shape[-1]
    freqs = base ** (-jnp.arange(0, h // 2, dtype=jnp.float32) * 2.0 / h)
    angles = positions.astype(jnp.float32)[..., None, None] * freqs  # (..., T, 1, H/2)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def positions_in_sequences(cu_seqlens: jax.Array, total: int) -> jax.Array:
    """Position of every packed row within its own sequence, (T_total,) int32."""
    cu_seqlens = jnp.asarray(cu_seqlens)
    rows = jnp.arange(total, dtype=jnp.int32)
    seq = jnp.searchsorted(cu_seqlens, rows, side="right") - 1
    return rows - cu_seqlens[jnp.clip(seq, 0, cu_seqlens.shape[0] - 1)]


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    precision: LayerPrecision,
    *,
    is_causal: bool,
    mask: jax.Array | None = None,
    config=None,
) -> jax.Array:
    """Dense attention, q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H) in q's dtype.

    mask: boolean, broadcastable to (B, N, T, S), True = attend. Both precisions check is_causal and mask
    by the same rule (the op's: ValueError naming them) and give 0 on a query row with no valid key.
    """
    if precision.attention == "mxfp8":
        return dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, config=config)
    is_causal = check_bool(is_causal, "is_causal")
    b, t, n, _ = q.shape
    mask = check_bias_or_mask(mask, "mask", (b, n, t, k.shape[1]), is_mask=True)
    return bf16_attention(q, k, v, mask=mask, is_causal=is_causal).astype(q.dtype)


def bf16_attention(
    q, k, v, *, mask=None, is_causal: bool, query_seq_lengths=None, key_value_seq_lengths=None
) -> jax.Array:
    """jax.nn.dot_product_attention on bf16 q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H) bf16, with 0
    on every query row that has no valid key (as the MXFP8 ops give), and that row's gradient 0.

    mask: None or boolean 4-D (B|1, N|1, T, S); lengths: None or (B,) int. A query row has a valid key
    when some key s is allowed by the mask, by causality (s <= t) and by key_value_seq_lengths (s < its
    length), and the row itself lies within query_seq_lengths. jax.nn's XLA path gives a keyless row the
    mean of V (a uniform softmax over equal large-negative logits); cuDNN's answer there is its own. Those
    rows are set to 0 after the call; under a mask they also attend every key they may for the call (a
    mask-only keyless row then reaches no backend: its values, and the backward of the zero cotangent it
    gets, stay finite). Rows with a valid key see the same mask and the same call, so their values and
    the gradients are jax.nn's, bit for bit.

    On a GPU backend it asks for cuDNN's fused (flash) attention, the BF16 baseline MXFP8 attention is
    measured against; implementation=None would be XLA's einsum/softmax path, which materialises the
    float32 (B, N, T, S) logits and runs its backward GEMMs with float32 operands. Arguments cuDNN does
    not cover (jax.nn checks them while tracing: head dim, dtype, mask patterns) fall back to XLA.
    """
    q, k, v = (a.astype(jnp.bfloat16) for a in (q, k, v))
    has_key = _rows_with_a_key(mask, is_causal, query_seq_lengths, key_value_seq_lengths, q.shape[1], k.shape[1])
    if has_key is not None and mask is not None:
        mask = mask | ~has_key[..., None]  # (B|1, N|1, T, S): a keyless row attends every key it may
    call = functools.partial(
        jax.nn.dot_product_attention,
        q,
        k,
        v,
        mask=mask,
        is_causal=is_causal,
        query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths,
    )
    out = None
    if jax.default_backend() == "gpu":
        try:
            out = call(implementation="cudnn")
        except (NotImplementedError, ValueError, RuntimeError):
            pass
    out = call() if out is None else out
    if has_key is None:
        return out
    return jnp.where(jnp.swapaxes(has_key, 1, 2)[..., None], out, jnp.zeros((), out.dtype))


def _rows_with_a_key(mask, is_causal: bool, q_lengths, kv_lengths, t: int, s: int) -> jax.Array | None:
    """(B|1, N|1, T) bool: whether query row t has a valid key (bf16_attention's rule), or None when every
    row has one (no mask, no lengths and S > 0; causal row t always has key 0)."""
    if mask is None and q_lengths is None and kv_lengths is None and s > 0:
        return None
    if mask is None:
        rows = jnp.full((1, 1, t), s > 0)
        if kv_lengths is not None:
            rows = rows & (jnp.asarray(kv_lengths) > 0)[:, None, None]
    else:
        keys = mask
        if is_causal:
            keys = keys & jnp.tril(jnp.ones((t, s), bool))
        if kv_lengths is not None:
            keys = keys & (jnp.arange(s) < jnp.asarray(kv_lengths)[:, None, None, None])
        rows = jnp.any(keys, axis=-1)
    if q_lengths is not None:
        rows = rows & (jnp.arange(t) < jnp.asarray(q_lengths)[:, None, None])
    return rows


def packed_offsets(cu_seqlens, max_seqlen, total: int) -> tuple[jax.Array, int]:
    """The offsets rule of every packed path (varlen_attention's own checks, so MXFP8 and BF16 agree).

    cu_seqlens must be a (B + 1,) integer array and max_seqlen a positive Python int (ValueError naming
    them). Concrete offsets must be non-decreasing within [0, total] with no sequence longer than
    max_seqlen (ValueError); traced offsets cannot be checked and are sanitized as varlen_attention does
    (reference/varlen.py sanitize_offsets: clamped to [0, total], made non-decreasing; valid offsets are
    unchanged). Returns (the (B + 1,) int32 offsets to use, max_seqlen as an int).
    """
    cu = check_cu_seqlens(cu_seqlens, "cu_seqlens")
    max_len = check_max_seqlen(max_seqlen, "max_seqlen")
    check_concrete_offsets(cu_seqlens, max_len, total, "cu_seqlens", "max_seqlen")
    return sanitize_offsets(cu, total), max_len


def jagged_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens: jax.Array,
    max_seqlen: int,
    precision: LayerPrecision,
    *,
    is_causal: bool,
    config=None,
) -> jax.Array:
    """Attention within packed sequences: q (T_total, N, H), k/v (T_total, K, H) -> (T_total, N, H).

    The MXFP8 path is varlen_attention (packed rows, no padding). The BF16 path gathers the sequences into
    a padded batch (B, round_up(max_seqlen, 32), ...) and runs jax.nn.dot_product_attention with
    query_seq_lengths / key_value_seq_lengths (cuDNN's fused attention on a GPU, see bf16_attention):
    the strong BF16 baseline, whose cost grows with B * max_seqlen^2, not T_total^2. Both paths take the
    offsets by one rule (packed_offsets): concrete offsets that are not non-decreasing within [0, T_total],
    or a sequence longer than max_seqlen, raise a ValueError; traced ones are sanitized (a traced sequence
    longer than max_seqlen is truncated to it). Rows outside every sequence are 0.
    """
    cu_seqlens, max_seqlen = packed_offsets(cu_seqlens, max_seqlen, q.shape[0])
    if precision.attention == "mxfp8":
        return varlen_attention(
            q,
            k,
            v,
            cu_seqlens,
            cu_seqlens,
            max_seqlen_q=max_seqlen,
            max_seqlen_k=max_seqlen,
            is_causal=is_causal,
            config=config,
        )
    if q.shape[0] == 0:  # no rows: nothing to gather into a padded batch (the empty result, as varlen's)
        return jnp.zeros(q.shape, q.dtype)
    cu = cu_seqlens
    lengths = seq_lengths(cu, max_seqlen)
    padded_len = round_up(max_seqlen, 32)
    qp, kp, vp = (to_padded(a, cu, lengths, padded_len) for a in (q, k, v))
    out = bf16_attention(
        qp, kp, vp, is_causal=is_causal, query_seq_lengths=lengths, key_value_seq_lengths=lengths
    )  # (B, L, N, H); rows past a sequence's length are dropped by to_packed
    return to_packed(out, cu, lengths, q.shape[0]).astype(q.dtype)
