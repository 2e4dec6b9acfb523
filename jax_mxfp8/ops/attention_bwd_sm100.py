"""The attention ops' backward on the Blackwell kernels (compute capability 10.0 / 10.3): which calls take it, and
the custom_vjp bwd that runs it.

  sm100_unsupported(config, *, head_dim, is_causal, broadcast_q=False) -> str | None   what the sm100 backward
                                                                                        does not cover
  choose_sm100_backward(implementation, why_not) -> "" | "cuda" | "emulated"   at the forward's trace time
  sm100_kernel_backward(static, res, cts, broadcast_q=False) -> the 7 cotangents of (q, k, v, bias, mask,
                                                                q_len, kv_len)
  mx_variant(static, head_dim), sm100_mx_backward(static, res, do) -> (dq, dk MX pair, dv MX pair)
                                            dot_product_attention_vjp's route (ops/attention_grads.py)

Which calls: on a cc 10.x GPU (or under library.forced_gpu of one, where the kernels are emulated) a call with
implementation=None that the kernel path covers (ops/attention_core.kernel_unsupported's conditions: no bias or
mask, AttentionConfig's defaults but the dQ options and p_scale, bfloat16 / float32 inputs, square-block MXArrays)
with head_dim 64 or 128, scale_rounding "up" and a registered variant (kernels/registry/attention_bwd_sm100.py)
takes it; AttentionStatic.bwd_sm100 holds the path. The backward's first call on the GPU runs the family's
self-test (primitives/attention_bwd_sm100_self_test.py); a disabled family (warned once,
KernelFallbackWarning), or a call outside those conditions, keeps the
XLA reference backward.

Dataflow: the residuals (ops/attention_core.quantize_operands: the square-block operands sequence-major,
(B, L, heads, H), as on the Hopper kernel path; O; the LSE) -> each operand's blocked scales of both
orientations (attention_sm100_operands.sm100_operand, in XLA) -> the pre-pass (dO square-quantized with
both orientations, Delta = rowsum(dO O) - dLSE; rows >= q_len of dO zeroed) -> the backward kernel
(primitives/attention_bwd_sm100.py) -> dq (B, T, N, H), dk, dv (B, S, K, H) float32, cast to the output dtype.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.ops.attention_core import AttentionStatic, kernel_operand, operand_keys
from jax_mxfp8.primitives import attention_bwd_sm100 as bwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library, self_test
from jax_mxfp8.primitives.attention_sm100_operands import sm100_operand

OP = "dot_product_attention_bwd"
"""The op name the backward's decision is recorded under (implementation.record()), as the Hopper backward's."""
FAMILIES = (bwd.FAMILY,)
"""The self-tested family (its first-use self-test runs the pre-pass and the backward)."""


def sm100_unsupported(
    config: AttentionConfig, *, head_dim: int, is_causal: bool, broadcast_q: bool = False
) -> str | None:
    """Why no sm100 backward variant covers a call that the kernel path's other conditions admit (None: one
    does)."""
    if config.scale_rounding != "up":
        return f"the sm100 backward quantizes with scale_rounding 'up' (got {config.scale_rounding!r})"
    variant = bwd.find_variant(
        head_dim=head_dim, causal=is_causal, p_scale=config.p_scale, dq_accum=config.dq_accum,
        deterministic=config.deterministic,
    )  # fmt: skip
    if variant is None:
        return (
            f"no sm100 backward for head_dim {head_dim}, p_scale {config.p_scale!r}, dq_accum "
            f"{config.dq_accum!r}, deterministic {config.deterministic} (head_dim 64 / 128; p_scale 'block' with "
            "float32 non-deterministic dQ only)"
        )
    if broadcast_q and (config.dq_accum != "fp32" or config.deterministic):
        return "broadcast_query_attention's sm100 backward takes dq_accum 'fp32' without deterministic"
    return None


def choose_sm100_backward(
    implementation: str | None, why_not: str | None, config: AttentionConfig, *, head_dim: int, is_causal: bool,
    broadcast_q: bool = False,
) -> str:  # fmt: skip
    """The sm100 backward's path for a call: "cuda", "emulated" (under library.forced_gpu) or "" (it does not
    take it; module docstring). why_not: why the kernel path does not cover the call (kernel_unsupported), or
    None. Asked only on a device the sm100 kernels serve (cc 10.0 / 10.3) with implementation None; on path
    "cuda" the loaded library must hold the variant (a library built before it keeps the reference)."""
    if implementation is not None or library.gpu_arch() not in bwd.ARCHS:
        return ""
    why = why_not or sm100_unsupported(config, head_dim=head_dim, is_causal=is_causal, broadcast_q=broadcast_q)
    path = impl.resolve(None, why, bwd.ARCHS, op=OP, warn=False, family=FAMILIES)
    disabled = self_test.verdict(bwd.FAMILY) if path == "xla" and why is None else None
    if disabled is not None:
        impl.warn_once(
            OP, "self-test", f"jax_mxfp8.dot_product_attention: the backward runs the XLA reference (slow) on this "
            f"GPU because the {bwd.FAMILY} kernels are disabled: {disabled}. Fix: {impl.FIX_SELF_TEST}."
        )  # fmt: skip
    if path == "cuda":
        variant = bwd.find_variant(
            head_dim=head_dim, causal=is_causal, p_scale=config.p_scale, dq_accum=config.dq_accum,
            deterministic=config.deterministic,
        )  # fmt: skip
        prepass = bwd.prepass_variant(head_dim, jnp.bfloat16)
        if not (library.has_kernel(variant.name) and library.has_kernel(prepass.name)):
            return ""
    return "" if path == "xla" else path


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
    if variant is not None and static.bwd_sm100 == "cuda" and not library.has_kernel(variant.name):
        return None
    return variant


def sm100_mx_backward(static: AttentionStatic, res, do):
    """The backward with MX dK / dV (a dkv "mx" variant, mx_variant): dq (B, T, N, H) in the output dtype and
    dk, dv each a (row, col) pair of MXArrays of the (B S, K H) matrix of bfloat16(g) (jax_mxfp8.MXGradient's)."""
    lse = res[2]
    dq, dk, dv = _gradients(static, res, (do, jnp.zeros(lse.shape, jnp.float32)), False, "mx")
    return dq.astype(static.out_dtype), dk, dv


def _gradients(static: AttentionStatic, res, cts, broadcast_q: bool, dkv: str):
    """(dq float32, dk, dv) of the sm100 backward on the residuals (dk, dv float32 (B, S, K, H), or MX pairs)."""
    quants, o, lse, bias, mask, q_len, kv_len = res
    if bias is not None or mask is not None:
        raise ValueError("the sm100 backward takes no bias or mask")
    do, dlse = cts
    keys = operand_keys(static)
    q_mx = kernel_operand(quants, keys["q_s"], None if broadcast_q else q_len)
    k_mx = kernel_operand(quants, keys["k_s"], kv_len)
    v_mx = kernel_operand(quants, keys["v_dp"], kv_len)
    q, k, v = sm100_operand(q_mx), sm100_operand(k_mx), sm100_operand(v_mx, ("hd",))
    b, t, n, h = do.shape
    lens = _lens(q_len, kv_len, b, t, k.data.shape[1])
    cfg = static.config
    variant = bwd.find_variant(
        head_dim=h, causal=static.is_causal, p_scale=cfg.p_scale, dq_accum=cfg.dq_accum,
        deterministic=cfg.deterministic, dkv=dkv,
    )  # fmt: skip
    in_dtype = o.dtype if np.dtype(o.dtype) in (np.dtype(jnp.bfloat16), np.dtype(jnp.float32)) else jnp.float32
    dlse = jnp.zeros((b, n, t), jnp.float32) if dlse is None else dlse.astype(jnp.float32)
    path = static.bwd_sm100
    do_op, delta = bwd.bwd_prepass_sm100(do.astype(in_dtype), o.astype(in_dtype), dlse, lens, path=path)
    return bwd.attention_bwd_sm100(
        q, k, v, do_op, lse.astype(jnp.float32), delta, lens, variant=variant, scale=static.scale,
        dq_scale_log2=cfg.dq_fp16_scale_log2, path=path,
    )  # fmt: skip
