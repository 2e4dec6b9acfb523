"""dot_product_attention's backward on the Hopper kernel path (the custom_vjp's bwd when the forward ran the kernel).

  backward_variant(static, head_dim, broadcast_q=False) -> (variant | None, why)   whether the backward takes
                                                                                    the kernel
  packed_variant(static, head_dim) -> variant | None                                  the same for varlen's packed
                                                                                    residuals
  kernel_backward(static, variant, res, cts, broadcast_q=False) -> (dq, dk, dv, None, None, None, None)

Dataflow (operands: docs/interfaces.md): the forward's residuals (sequence-major square MXArrays q, k, v; O (B,
T, N, H); LSE (B, N, T)) and the cotangents (dO, dLSE) -> dO square-quantized (the CUDA square quantize kernel where
the forward ran the kernel, its emulation on path "emulated"; rows >= q_len zeroed first) -> the pre-pass
(primitives/attention_bwd.py bwd_operands: bfloat16 head-major padded operands through the realign (zero shift) and
dequantize calls on the forward's path, LSE, Delta; for an sdp_fp8 variant the FP8 copies of Q, K, V, dO instead of
the bfloat16 V) -> the backward call ATTENTION_BWD (path "cuda" or "emulated", as the forward's) -> dq, dk, dv
sliced to T / S, transposed to (B, T, N, H) / (B, S, K, H), cast to the output dtype. GQA's dk and dv come summed
over the group from the call. varlen_attention's kernel route (ops/varlen_kernel.py) calls kernel_backward with
a packed variant (packed_variant) on its aligned residuals, or gathers them into the padded batch for
dot_product_attention's bwd (ops/attention.py mx_attention_bwd).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax.numpy as jnp

from jax_mxfp8.ops.attention_core import HOPPER, AttentionStatic, kernel_operand, operand_keys, square_sequence_major
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library

OP = "dot_product_attention_bwd"
"""The op name the backward's decision is recorded under (implementation.record())."""
_warned: set[str] = set()
_SM100_BACKWARD = "the Blackwell forward's backward is ops/attention_bwd_sm100.py's (sm100_backward_variant)"


def backward_variant(static: AttentionStatic, head_dim: int, broadcast_q: bool = False):
    """(the backward kernel variant, None) when the backward takes the kernel path, else (None, why not).

    It does when the forward took the kernel path (static.kernel_path), a variant covers (head_dim,
    is_causal, p_scale, scale_rounding, dq_accum, deterministic), and, on path "cuda", the loaded library holds that
    variant (a library built before the backward kernel keeps the reference backward). The decision is
    recorded for implementation.record() under OP; on path "cuda" a reference backward warns once per cause
    (KernelFallbackWarning: the forward ran the kernel, so the slow backward would otherwise go unnoticed).
    """
    if not static.kernel_path:
        return None, "the forward ran the XLA reference"
    if static.arch != HOPPER:  # decided (and recorded) by ops/attention_bwd_sm100.sm100_backward_variant
        return None, _SM100_BACKWARD
    variant, why = _lookup(static, head_dim, broadcast_q=broadcast_q)
    if variant is not None and static.impl == "cuda":
        why = _missing_from_library(variant)
        variant = None if why else variant
    impl.note(OP, static.impl, "xla" if variant is None else static.impl, why or "")
    if variant is None and static.impl == "cuda" and why not in _warned:
        _warned.add(why)
        msg = (
            f"jax_mxfp8.dot_product_attention: the forward ran the Hopper kernel but the backward runs the XLA "
            f"reference (slow) because {why}. Fix: p_scale='const' (the default) has backward kernels for "
            "dq_accum 'fp32' and 'fp16', deterministic or not, p_scale='block' for dq_accum 'fp32' without "
            "deterministic; a library built before them needs tools/build_library.py."
        )
        warnings.warn(msg, impl.KernelFallbackWarning, stacklevel=2)
    return variant, why


def packed_variant(static: AttentionStatic, head_dim: int):
    """The packed backward variant for varlen_attention's aligned packed residuals, or None (then varlen's
    backward gathers them into the padded batch: backward_variant decides there). Path "cuda" needs it in the
    loaded library. Recorded under OP when found."""
    if not static.kernel_path or static.arch != HOPPER:
        return None
    variant, _ = _lookup(static, head_dim, packed=True)
    if variant is not None and static.impl == "cuda" and _missing_from_library(variant):
        return None
    if variant is not None:
        impl.note(OP, static.impl, static.impl, "")
    return variant


def _lookup(static: AttentionStatic, head_dim: int, **kind):
    """abwd.kernel_variant for the call's config (kind: broadcast_q / packed) -> (variant | None, why)."""
    cfg = static.config
    return abwd.kernel_variant(
        head_dim=head_dim, causal=static.is_causal, p_scale=cfg.p_scale, p_rounding=cfg.scale_rounding,
        dq_accum=cfg.dq_accum, deterministic=cfg.deterministic, **kind,
    )  # fmt: skip


def _missing_from_library(variant) -> str | None:
    """Why the loaded library cannot run `variant` (path "cuda"), or None: its kernel name, the sdp_fp8 target
    (a library built before it holds a kernel of the same name that takes the plain call), dv_f16's float16
    dequantize (a library built before it holds a kernel of the same name that takes bfloat16 do), the packed
    target (a library built before it holds packed kernels of the same name that take a per-key-tile table)."""
    rebuild = "rebuild it: tools/build_library.py"
    names = {n for n, _ in library.kernel_names()}
    if variant.name not in names:
        return f"the kernel library has no {variant.name} ({rebuild})"
    if variant.sdp_fp8 and abwd.TARGET_FP8 not in library.ffi_targets():
        return f"the kernel library has no {abwd.TARGET_FP8} target ({rebuild})"
    if variant.dv_f16 and abwd.DO_F16_DEQUANTIZE not in names:
        return f"the kernel library has no {abwd.DO_F16_DEQUANTIZE} (dv_f16's dO; {rebuild})"
    if variant.packed and abwd.TARGET_PACKED not in library.ffi_targets():
        return f"the kernel library has no {abwd.TARGET_PACKED} target ({rebuild})"
    return None


def kernel_backward(
    static: AttentionStatic, variant, res, cts, broadcast_q: bool = False, tile_table: abwd.PackedTables | None = None
):
    """The custom_vjp bwd on the kernel (see the module docstring); returns the 7 cotangents of
    (q, k, v, bias, mask, q_len, kv_len), as attention_core.reference_backward.

    res, cts: mx_attention_fwd's residuals (quants, o, lse, bias, mask, q_len, kv_len) with bias and mask
    None (the kernel path has neither), and the cotangents (dO (B, T, N, H), dLSE (B, N, T)).
    tile_table (a packed variant: packed_tile_table of the aligned packed layout, B = 1): the forward's seqs table
    and the key-tile work list, in the kernel's lens slot.
    broadcast_q (ops/broadcast_attention.py, with a broadcast_q variant): the query residuals hold batch 1
    for all B rows; dq comes back as their sum, (1, T, N, H) (the kernel's float32 reductions over the
    batch rows, one rounding to the output dtype here).
    """
    quants, o, lse, bias, mask, q_len, kv_len = res
    if bias is not None or mask is not None:  # kernel_unsupported keeps them off the kernel path
        raise ValueError("the backward kernel takes no bias or mask")
    do, dlse = cts
    keys = operand_keys(static)
    q = kernel_operand(quants, keys["q_s"], q_len)
    k = kernel_operand(quants, keys["k_s"], kv_len)
    v = kernel_operand(quants, keys["v_dp"], kv_len)
    do_q = square_sequence_major(do, q_len, static.config.scale_rounding, static.impl)
    fp8_path = static.impl if variant.sdp_fp8 else None  # the FP8 copies of S^T's and dP^T's operands
    ops = abwd.bwd_operands(
        q, k, v, do_q, do, o, lse, dlse, q_len=q_len, kv_len=kv_len, broadcast_q=broadcast_q, fp8_path=fp8_path,
        scale=static.scale, path=static.impl, do_f16=variant.dv_f16,
    )  # fmt: skip
    if tile_table is not None:
        ops = dataclasses.replace(ops, lens=tile_table)
    e = static.config.dq_fp16_scale_log2
    dq, dk, dv = abwd.attention_bwd(ops, variant=variant, scale=static.scale, dq_scale_log2=e, path=static.impl)
    t, s = q.shape[1], k.shape[1]
    out = static.out_dtype
    dq = None if static.is_mx[0] else jnp.swapaxes(dq[:, :, :t], 1, 2).astype(out)
    dk = None if static.is_mx[1] else jnp.swapaxes(dk[:, :, :s], 1, 2).astype(out)
    dv = None if static.is_mx[2] else jnp.swapaxes(dv[:, :, :s], 1, 2).astype(out)
    return dq, dk, dv, None, None, None, None
