"""FFI-backed Hopper MXFP8 attention forward (layer 5): the kernel calls, dense and packed.

  kernel_variant(head_dim=, causal=, p_scale=, p_rounding=, packed=, broadcast_q=, tune=) -> (variant | None, why)
  attention_fwd(ops, *, causal, t, p_scale, p_rounding, tune=0, out=None, path="cuda", broadcast_q=False)
      -> (o (B, T, N, H), lse)
  attention_fwd_packed(ops, work, *, causal, p_scale, p_rounding, tune=0, out=None, path="cuda") -> (o, lse)

Operands come from the producer pass (attention_operands.py); the kernel is
jax_mxfp8/kernels/sm90/attention_fwd.py, its handler csrc/attention_fwd.cc, its arithmetic in XLA
attention_emulation.py (path "emulated" runs that instead of the FFI call, through the same partitioning
and batching). Under jit with sharded operands the calls partition over batch and KV-head groups (heads
shard as whole KV groups: query head n = kv * G + g); sequences and head_dim are replicated (each device
runs whole sequences). Under vmap the mapped axis joins the batch (dense); the packed call maps over it.
broadcast_q (broadcast_query_attention): ops.q / ops.qs hold ONE batch row that every batch row of k, v
attends with; the kernel reads it at batch 0 (no tiled copy), the emulation broadcasts it; its batch factor
is its own (size 1, replicated) and vmap maps the call.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives.attention_emulation import emulate_fwd, p_options
from jax_mxfp8.primitives.attention_operands import AlignedOperands
from jax_mxfp8.primitives.attention_packed import emulate_packed_fwd
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule

ARCHS = registry.AttentionFwdConfig().archs
"""The archs the attention forward kernel is built for (wgmma: sm_90a)."""


def kernel_variant(
    *,
    head_dim: int,
    causal: bool,
    p_scale: str = "const",
    p_rounding: str = "up",
    packed: bool = False,
    broadcast_q: bool = False,
    tune: int = 0,
) -> tuple[registry.AttentionFwdConfig | None, str | None]:
    """(the registry variant, None) when a kernel covers these arguments, else (None, why not).

    p_rounding is ignored for p_scale="const" (one scale, no rule)."""
    p_scale, p_rounding = p_options(p_scale, p_rounding)
    find = lambda **kw: registry.find(registry.AttentionFwdConfig, head_dim=head_dim, causal=bool(causal), **kw)
    if find(p_scale="const", p_rounding="up", packed=False) is None:
        return None, f"no attention kernel for head_dim={head_dim} (the kernel covers 64 and 128)"
    if broadcast_q and packed:
        return None, "broadcast_q runs on the dense (padded batch) kernel, not the packed one"
    kind = dict(p_scale=p_scale, p_rounding=p_rounding, packed=bool(packed), broadcast_q=bool(broadcast_q))
    variant = find(**kind, tune=tune)
    if variant is None and find(**kind) is not None:
        return None, f"no attention kernel tuning {tune} for these arguments"
    if variant is None:
        return None, (
            f"no attention kernel for p_scale={p_scale!r} with scale_rounding={p_rounding!r}: the kernel's one P "
            "scale per (row, 128-key tile) reproduces the 'up' block rule, not the 'floor' rule's saturation of "
            "P elements (docs/numerics.md, 'Hopper attention kernel')"
        )
    return variant, None


@dataclasses.dataclass(frozen=True)
class AttentionFwdCall:
    """The static part of one kernel call: the variant and the head grouping (for the sharding rule)."""

    variant: registry.AttentionFwdConfig
    group: int  # G = N // K query heads per KV head
    n_kv: int  # K


def _outputs(call: AttentionFwdCall, q, k, *rest):
    """o (B, Tp, N, H) bfloat16 (the caller's layout) and lse (B, N, Tp) float32, for Q' (B, N, Tp, H) (or
    (1, N, Tp, H) with broadcast_q) and K' (B, K, Sp, H)."""
    _, n, tp, h = q.shape
    b = k.shape[0]
    return jax.ShapeDtypeStruct((b, tp, n, h), jnp.bfloat16), jax.ShapeDtypeStruct((b, n, tp), jnp.float32)


def _emulation(call: AttentionFwdCall, q, k, vt, qs, ks, vs, vi, *tables):
    """The same contract as the kernel call, computed by emulate_fwd / emulate_packed_fwd."""
    v = call.variant
    if v.broadcast_q:  # the kernel reads batch 0 for every batch row: the same values as a broadcast copy
        q, qs = (jnp.broadcast_to(x, (k.shape[0],) + x.shape[1:]) for x in (q, qs))
    ops = AlignedOperands(q, k, vt, qs, ks, vs, vi, tables[0])
    p = dict(p_scale=v.p_scale, p_rounding=v.p_rounding)
    if v.packed:
        o, lse = emulate_packed_fwd(ops, causal=v.causal, **p)
    else:
        o, lse = emulate_fwd(ops, causal=v.causal, t=q.shape[2], **p)
    return o.transpose(0, 2, 1, 3).astype(jnp.bfloat16), lse


def _sharding(call: AttentionFwdCall) -> ShardingRule:
    """Query heads are the compound factor (k g). Shardy rejects a size-1 factor inside a compound one: MHA
    (G = 1) names k alone; MQA (K = 1) gives the query heads their own factor g, which stays replicated (they
    cannot shard as KV groups). Sequences (t, s, u, v, w), head_dim (h) and the tables never shard."""
    if call.group == 1:
        n, sizes = "k", ()
    elif call.n_kv == 1:
        n, sizes = "g", ()
    else:
        n, sizes = "(k g)", (("g", call.group),)
    tables = ("l z", "y x") if call.variant.packed else ("l b",)
    qb = "a" if call.variant.broadcast_q else "b"  # broadcast_q: the one query row, whole on every device
    return ShardingRule(
        operands=(f"{qb} {n} t h", "b k s h", "b k h s", f"{qb} {n} u", "b k v", "b k w", "b k w", *tables),
        results=(f"b t {n} h", f"b {n} t"),
        factor_sizes=sizes,
        replicated=("a", "g", "t", "h", "s", "u", "v", "w", "l", "z", "y", "x"),
    )


ATTENTION_FWD = FfiOp(
    target="jax_mxfp8_attention_fwd",
    outputs=_outputs,
    emulation=_emulation,
    sharding=_sharding,
    batch_dims=(0, 0, 0, 0, 0, 0, 0, 1),  # lens is (2, B)
    result_batch_dims=(0, 0),
    attrs=lambda call: {"kernel": call.variant.name},
)
"""(q, k, vt, qs, ks, vs, vi, lens) -> (o, lse); shapes in csrc/attention_fwd.cc."""

ATTENTION_FWD_BROADCAST_Q = dataclasses.replace(ATTENTION_FWD, batch_dims=None, result_batch_dims=None)
"""The same target for the broadcast_q variants: q and qs have batch 1, so vmap maps the call."""

ATTENTION_FWD_PACKED = FfiOp(
    target="jax_mxfp8_attention_fwd_packed",
    outputs=_outputs,
    emulation=_emulation,
    sharding=_sharding,
    batch_dims=None,  # one batch row holds every sequence: vmap maps the call over the axis
    attrs=lambda call: {"kernel": call.variant.name},
)
"""(q, k, vt, qs, ks, vs, vi, seqs, work) -> (o, lse) over packed sequences (B = 1)."""


def _call(ops: AlignedOperands, packed: bool, causal: bool, p_scale: str, p_rounding: str, tune: int, bq=False):
    variant, why = kernel_variant(
        head_dim=ops.q.shape[-1], causal=causal, p_scale=p_scale, p_rounding=p_rounding, packed=packed, tune=tune,
        broadcast_q=bq,
    )  # fmt: skip
    if variant is None:
        raise ValueError(why)
    n_kv = ops.k.shape[1]
    return AttentionFwdCall(variant, ops.q.shape[1] // n_kv, n_kv)


def attention_fwd(
    ops: AlignedOperands,
    *,
    causal: bool,
    t: int,
    p_scale: str = "const",
    p_rounding: str = "up",
    tune: int = 0,
    out: tuple[jax.Array, jax.Array] | None = None,
    path: str = "cuda",
    broadcast_q: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Runs the kernel. Returns o (B, T, N, H) bfloat16 and lse (B, N, T) float32 (padding rows dropped).

    p_scale: "const" or "block" (AttentionConfig.p_scale); p_rounding: the block scale rule ("up" or
    "floor", AttentionConfig.scale_rounding; ignored for "const"). tune: a comparison schedule (--with-tunes).
    out: optional (o (B, Tp, N, H) bfloat16, lse (B, N, Tp) float32) buffers the kernel writes into
    (aliased; tests pass NaN-filled ones to check that every element is written). path "emulated" runs
    the emulation through the same partitioning and batching (CPU tests). broadcast_q: ops.q (1, N, Tp, H)
    and ops.qs (1, N, Tp/32) are one query sequence for all B batch rows of k, v (module docstring).
    """
    args = (ops.q, ops.k, ops.vt, ops.qs, ops.ks, ops.vs, ops.vi, ops.lens)
    call = _call(ops, False, causal, p_scale, p_rounding, tune, broadcast_q)
    op = ATTENTION_FWD_BROADCAST_Q if broadcast_q else ATTENTION_FWD
    if broadcast_q and (ops.q.shape[0] != 1 or ops.qs.shape[0] != 1):
        raise ValueError(f"broadcast_q takes q and qs of batch 1; got q {ops.q.shape}, qs {ops.qs.shape}")
    if out is None:
        o, lse = op.call(call, path, *args)
    else:
        o, lse = op.ffi_into(call, args, out)
    return o[:, :t], lse[:, :, :t]


def attention_fwd_packed(
    ops: AlignedOperands,
    work: jax.Array,
    *,
    causal: bool,
    p_scale: str = "const",
    p_rounding: str = "up",
    tune: int = 0,
    out: tuple[jax.Array, jax.Array] | None = None,
    path: str = "cuda",
) -> tuple[jax.Array, jax.Array]:
    """Runs the kernel over packed sequences (attention_packed.packed_tables; ops.lens holds the seqs table,
    B = 1).

    Returns o (1, Tp, N, H) bfloat16 and lse (1, N, Tp) float32 in the operands' aligned row order: rows of
    every sequence's query tiles are written (0 / -inf past its length); rows in no query tile of a
    sequence are left unwritten (garbage: read only through the sequences' rows). Shards over KV-head
    groups like attention_fwd. out, path: as for attention_fwd.
    """
    args = (ops.q, ops.k, ops.vt, ops.qs, ops.ks, ops.vs, ops.vi, ops.lens, work)
    call = _call(ops, True, causal, p_scale, p_rounding, tune)
    if out is None:
        return ATTENTION_FWD_PACKED.call(call, path, *args)
    return ATTENTION_FWD_PACKED.ffi_into(call, args, out)
