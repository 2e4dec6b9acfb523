"""The attention ops' backward on the Blackwell kernels (compute capability 10.0 / 10.3): which calls take it, and
the custom_vjp bwd that runs it.

  sm100_unsupported(config, *, head_dim, is_causal, broadcast_q=False) -> str | None   what the sm100 backward
                                                                                        does not cover
  sm100_backward_variant(static, head_dim, broadcast_q=False) -> variant | None   whether the backward takes it
  sm100_kernel_backward(static, res, cts, broadcast_q=False) -> the 7 cotangents of (q, k, v, bias, mask,
                                                                q_len, kv_len)
  mx_variant(static, head_dim), sm100_mx_backward(static, res, do) -> (dq, dk MX pair, dv MX pair)
                                            dot_product_attention_vjp's route (ops/attention_grads.py)

Which calls: wherever the Hopper backward would on Hopper: the forward ran the Blackwell kernel path (cc 10.0 /
10.3, or library.forced_gpu of one where the kernels are emulated; AttentionStatic.arch) and a registered variant
(kernels/registry/attention_bwd_sm100.py) covers head_dim (64, 128), causal, p_scale, dq_accum and deterministic
with scale_rounding "up". The backward's first call on the GPU runs the family's self-test
(primitives/attention_bwd_sm100_self_test.py); a disabled family, a library without the variant or a call outside
those conditions keeps the XLA reference backward (warned once, KernelFallbackWarning).

Dataflow: the forward's residuals (ops/attention_core.quantize_operands: the producer's Sm100Operands, E4M3 data
sequence-major with both orientations' blocked scale bytes; a caller's square MXArray gets its bytes laid out
in XLA; O; the LSE) -> the pre-pass (dO square-quantized with
both orientations, Delta = rowsum(dO O) - dLSE; rows >= q_len of dO zeroed) -> the backward kernel
(primitives/attention_bwd_sm100.py) -> dq (B, T, N, H), dk, dv (B, S, K, H) float32, cast to the output dtype.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.ops.attention_core import BLACKWELL, AttentionStatic, kernel_operand, operand_keys
from jax_mxfp8.primitives import attention_bwd_sm100 as bwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library, self_test
from jax_mxfp8.primitives.attention_sm100_operands import Sm100Operand, sm100_operand

OP = "dot_product_attention_bwd"
"""The op name the backward's decision is recorded under (implementation.record()), as the Hopper backward's."""
FAMILIES = (bwd.FAMILY,)
"""The self-tested family (its first-use self-test runs the pre-pass and the backward)."""


def sm100_unsupported(
    config: AttentionConfig, *, head_dim: int, is_causal: bool, broadcast_q: bool = False, packed: bool = False
) -> str | None:
    """Why no sm100 backward variant covers a call that the kernel path's other conditions admit (None: one
    does). packed: varlen_attention's packed operands (p_scale "const", float32 non-deterministic dQ)."""
    if config.scale_rounding != "up":
        return f"the sm100 backward quantizes with scale_rounding 'up' (got {config.scale_rounding!r})"
    variant = bwd.find_variant(
        head_dim=head_dim, causal=is_causal, p_scale=config.p_scale, dq_accum=config.dq_accum,
        deterministic=config.deterministic, packed=packed,
    )  # fmt: skip
    if variant is None:
        return (
            f"no sm100 {'packed ' if packed else ''}backward for head_dim {head_dim}, p_scale {config.p_scale!r}, "
            f"dq_accum {config.dq_accum!r}, deterministic {config.deterministic} (head_dim 64 / 128; p_scale "
            "'block' and packed sequences with float32 non-deterministic dQ only)"
        )
    if broadcast_q and (config.dq_accum != "fp32" or config.deterministic):
        return "broadcast_query_attention's sm100 backward takes dq_accum 'fp32' without deterministic"
    return None


def sm100_backward_variant(static: AttentionStatic, head_dim: int, broadcast_q: bool = False, packed: bool = False):
    """The sm100 backward variant when the backward takes it, else None (module docstring): the forward ran the
    Blackwell kernel path, a variant covers the call, the family is not disabled by its first-use self-test and,
    on path "cuda", the loaded library holds the variant and its pre-pass. The decision is recorded under OP;
    a forward on the kernel whose backward runs the reference warns once per cause (KernelFallbackWarning).
    packed: the packed variant, or None without a record or a warning where none covers the call (varlen's
    backward then takes the padded batch, which asks again)."""
    if not static.kernel_path or static.arch != BLACKWELL:
        return None
    cfg = static.config
    why = sm100_unsupported(cfg, head_dim=head_dim, is_causal=static.is_causal, broadcast_q=broadcast_q, packed=packed)
    if packed and why:
        return None
    variant = None if why else bwd.find_variant(
        head_dim=head_dim, causal=static.is_causal, p_scale=cfg.p_scale, dq_accum=cfg.dq_accum,
        deterministic=cfg.deterministic, packed=packed,
    )  # fmt: skip
    if variant is not None and (static.impl == "cuda" or library.forced_cc() is not None):
        disabled = self_test.verdict(bwd.FAMILY)  # the first call on this device runs it
        why = f"the {bwd.FAMILY} kernels are disabled: {disabled}" if disabled else None
    if variant is not None and why is None and static.impl == "cuda":
        prepass = bwd.prepass_variant(head_dim, jnp.bfloat16, packed)
        missing = [v.name for v in (variant, prepass) if not library.has_kernel(v.name)]
        why = (
            f"the kernel library has no {', '.join(missing)} (rebuild it: tools/build_library.py)" if missing else None
        )
    impl.note(OP, static.impl, "xla" if why else static.impl, why or "")
    if why:
        impl.warn_once(
            OP, why, f"jax_mxfp8.dot_product_attention: the forward ran the Blackwell kernel path but the backward "
            f"runs the XLA reference (slow) because {why}. Fix: {impl.FIX_SELF_TEST}." if "disabled" in why else
            f"jax_mxfp8.dot_product_attention: the forward ran the Blackwell kernel path but the backward runs the "
            f"XLA reference (slow) because {why}.",
        )  # fmt: skip
        return None
    return variant


def _lens(q_len, kv_len, b: int, t: int, s: int) -> jnp.ndarray:
    q = jnp.full((b,), t, jnp.int32) if q_len is None else jnp.asarray(q_len, jnp.int32)
    k = jnp.full((b,), s, jnp.int32) if kv_len is None else jnp.asarray(kv_len, jnp.int32)
    return jnp.stack([q, k])


def sm100_kernel_backward(static: AttentionStatic, res, cts, broadcast_q: bool = False):
    """The custom_vjp bwd on the sm100 kernels (module docstring): the 7 cotangents of (q, k, v, bias, mask,
    q_len, kv_len), as attention_core.reference_backward. broadcast_q: the query residuals hold batch 1 for
    all B rows (ops/broadcast_attention.py); dq comes back as their float32 sum, (1, T, N, H)."""
    dq, dk, dv = _gradients(static, res, cts, broadcast_q, "float32")
    out = static.out_dtype
    dq = None if static.is_mx[0] else dq.astype(out)
    dk = None if static.is_mx[1] else dk.astype(out)
    dv = None if static.is_mx[2] else dv.astype(out)
    return dq, dk, dv, None, None, None, None


def mx_variant(static: AttentionStatic, head_dim: int):
    """The dkv "mx" variant for a call (MX dK / dV written by the epilogue), or None (also where the loaded
    library lacks it on path "cuda")."""
    cfg = static.config
    variant = bwd.find_variant(
        head_dim=head_dim, causal=static.is_causal, p_scale=cfg.p_scale, dq_accum=cfg.dq_accum,
        deterministic=cfg.deterministic, dkv="mx",
    )  # fmt: skip
    if variant is not None and static.impl == "cuda" and not library.has_kernel(variant.name):
        return None
    return variant


def sm100_mx_backward(static: AttentionStatic, res, do):
    """The backward with MX dK / dV (a dkv "mx" variant, mx_variant): dq (B, T, N, H) in the output dtype and
    dk, dv each a (row, col) pair of MXArrays of the (B S, K H) matrix of bfloat16(g) (jax_mxfp8.MXGradient's)."""
    lse = res[2]
    dq, dk, dv = _gradients(static, res, (do, jnp.zeros(lse.shape, jnp.float32)), False, "mx")
    return dq.astype(static.out_dtype), dk, dv


def _operand(quants, key: str, lengths) -> Sm100Operand:
    """The residual's Sm100Operand: the producer's (both orientations' blocked bytes, "<name>:sm100"), else (a
    caller's MXArray, or the padded residuals of varlen's fallback) the square MXArray's bytes laid out in XLA."""
    op, mx = quants.get(f"{key[0]}:sm100"), quants[key]
    complete = op is not None and op.sf_hd is not None and op.sf_seq is not None
    if complete and not key.endswith(":user") and op.data.shape == mx.data.shape:  # (not broadcast copies' batch)
        return op
    return sm100_operand(kernel_operand(quants, key, lengths))


def _gradients(static: AttentionStatic, res, cts, broadcast_q: bool, dkv: str):
    """(dq float32, dk, dv) of the sm100 backward on the residuals (dk, dv float32 (B, S, K, H), or MX pairs)."""
    quants, o, lse, bias, mask, q_len, kv_len = res
    if bias is not None or mask is not None:
        raise ValueError("the sm100 backward takes no bias or mask")
    do, dlse = cts
    keys = operand_keys(static)
    q = _operand(quants, keys["q_s"], None if broadcast_q else q_len)
    k = _operand(quants, keys["k_s"], kv_len)
    v = _operand(quants, keys["v_dp"], kv_len)
    b, t, n, h = do.shape
    lens = _lens(q_len, kv_len, b, t, k.data.shape[1])
    cfg = static.config
    variant = bwd.find_variant(
        head_dim=h, causal=static.is_causal, p_scale=cfg.p_scale, dq_accum=cfg.dq_accum,
        deterministic=cfg.deterministic, dkv=dkv,
    )  # fmt: skip
    in_dtype = o.dtype if np.dtype(o.dtype) in (np.dtype(jnp.bfloat16), np.dtype(jnp.float32)) else jnp.float32
    dlse = jnp.zeros((b, n, t), jnp.float32) if dlse is None else dlse.astype(jnp.float32)
    path = static.impl
    do_op, delta = bwd.bwd_prepass_sm100(do.astype(in_dtype), o.astype(in_dtype), dlse, lens, path=path)
    return bwd.attention_bwd_sm100(
        q, k, v, do_op, lse.astype(jnp.float32), delta, lens, variant=variant, scale=static.scale,
        dq_scale_log2=cfg.dq_fp16_scale_log2, path=path,
    )  # fmt: skip
