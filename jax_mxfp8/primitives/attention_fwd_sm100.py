"""FFI-backed Blackwell MXFP8 attention forward (layer 5): the kernel calls, dense (and broadcast query) and packed.

  kernel_variant(head_dim=, causal=, p_scale=, p_rounding=, packed=, broadcast_q=) -> (variant | None, why)
  scale_log2(scale) -> float                         fl(tau log2 e): the kernel's logit factor
  attention_fwd_sm100(q, k, v, lens, *, causal, scale, p_scale, p_rounding, broadcast_q=False, path, out=None)
      -> (o (B, T, N, H) bfloat16, lse (B, N, T) float32)
  attention_fwd_sm100_packed(q, k, v, tables, *, causal, scale, p_scale, p_rounding, max_len_q, max_len_k, path,
      out=None) -> (o (1, Tq, N, H) bfloat16, lse (1, N, Tq) float32)

Operands (docs/interfaces.md "sm100 attention"): Sm100Operands (primitives/attention_sm100_operands.py) with q's
and k's "hd" scales and v's "seq" scales; q (B, T, N, H) (batch 1 for broadcast_q: one query sequence for every
batch row of k and v), k and v (B, S, K, H), N a multiple of K; lens (2, B) int32 query / key lengths (clamped
to [0, T] / [0, S] here: the kernel trusts them). Packed: the operands of attention_sm100_packed.pack_operand
(batch 1, data compact, scales padded per sequence) and its PackedSequenceTables. The kernel is
kernels/sm100/attention_fwd.py (variants kernels/registry/attention_fwd_sm100.py), its handler
csrc/attention_fwd_sm100.cc, its arithmetic attention_sm100_emulation.emulate_fwd_sm100 /
attention_sm100_packed.emulate_packed_fwd_sm100 (domain "log2"): path "emulated" runs that instead of the FFI
call, through the same partitioning and batching. O is written in bfloat16 (0 on rows with no valid key), the
LSE in float32 (-inf there).

Sharding: batch and KV-head groups (query head n = kv * G + g), as the Hopper forward; sequences, head_dim and
the tables are replicated. vmap folds into the batch (dense); broadcast_q and packed calls map over it.

NOT RUN ON HARDWARE by this project: the kernel is compiled for sm_100f and checked statically; its first call
on a compute-capability 10.x GPU runs the family's self-test (primitives/sm100_self_tests.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.attention_emulation import p_options
from jax_mxfp8.primitives.attention_sm100_emulation import LOG2E, emulate_fwd_sm100
from jax_mxfp8.primitives.attention_sm100_operands import Sm100Operand
from jax_mxfp8.primitives.attention_sm100_packed import PackedSequenceTables, emulate_packed_fwd_sm100
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule

FAMILY = registry.AttentionFwdSm100Config.op
ARCHS = registry.AttentionFwdSm100Config.archs
"""The archs the Blackwell attention forward is built for (sm_100f: compute capability 10.0 and 10.3)."""


def kernel_variant(
    *,
    head_dim: int,
    causal: bool,
    p_scale: str = "const",
    p_rounding: str = "up",
    packed: bool = False,
    broadcast_q: bool = False,
) -> tuple[registry.AttentionFwdSm100Config | None, str | None]:
    """(the registry variant, None) when a kernel covers these arguments, else (None, why not). The same
    coverage as the Hopper forward (primitives/attention_fwd.kernel_variant): head_dim 64 / 128, p_scale "const"
    (any operand scale rounding) or "block" with the "up" rule."""
    p_scale, p_rounding = p_options(p_scale, p_rounding)
    find = lambda **kw: registry.find(registry.AttentionFwdSm100Config, head_dim=head_dim, causal=bool(causal), **kw)
    if find() is None:
        return None, f"no Blackwell attention kernel for head_dim={head_dim} (the kernel covers 64 and 128)"
    if broadcast_q and packed:
        return None, "broadcast_q runs on the dense (padded batch) kernel, not the packed one"
    if p_scale == "block" and p_rounding != "up":
        return None, (
            f"no Blackwell attention kernel for p_scale='block' with scale_rounding={p_rounding!r}: the kernel "
            "quantizes P per 32 keys with the 'up' rule only (docs/numerics.md)"
        )
    return find(p_scale=p_scale, packed=bool(packed), broadcast_q=bool(broadcast_q)), None


def scale_log2(scale: float) -> float:
    """fl(tau log2 e) as float32 (the emulation's factor, attention_sm100_emulation.exponent): the kernel's
    logits are round(acc * scale_log2), exponentiated base 2."""
    return float(np.float32(scale * LOG2E))


@dataclasses.dataclass(frozen=True)
class AttentionFwdSm100Call:
    """The static part of one kernel call: the variant, the softmax scale, the head grouping (for the sharding
    rule) and, packed, the static maximum sequence lengths (the emulation's windows)."""

    variant: registry.AttentionFwdSm100Config
    scale: float
    group: int  # G = N // K query heads per KV head
    n_kv: int  # K
    max_len_q: int = 0
    max_len_k: int = 0


def _outputs(call: AttentionFwdSm100Call, q, q_sf, k, *rest):
    """o (B, T, N, H) bfloat16 and lse (B, N, T) float32 for q (B | 1, T, N, H) and k (B, S, K, H)."""
    _, t, n, h = q.shape
    b = k.shape[0]
    return jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16), jax.ShapeDtypeStruct((b, n, t), jnp.float32)


def _cu(start: jax.Array, length: jax.Array) -> jax.Array:
    """(S,) first rows (chunks) and lengths -> (S + 1,) offsets (the last one start + length of the last)."""
    return jnp.concatenate([start, start[-1:] + length[-1:]]).astype(jnp.int32)


def _emulation(call: AttentionFwdSm100Call, q, q_sf, k, k_sf, v, v_sf, *tables):
    """The same contract as the kernel call: emulate_fwd_sm100 / emulate_packed_fwd_sm100 (domain "log2")."""
    var = call.variant
    ops = Sm100Operand(q, sf_hd=q_sf), Sm100Operand(k, sf_hd=k_sf), Sm100Operand(v, sf_seq=v_sf)
    kw = dict(causal=var.causal, scale=call.scale, p_scale=var.p_scale)
    if var.packed:
        seqs = tables[0]  # rows: first Q chunk, first K chunk, query length, key length, first query row, key row
        nch_q, nch_k = -(-seqs[2] // 128), -(-seqs[3] // 128)
        o, lse = emulate_packed_fwd_sm100(
            *ops, _cu(seqs[4], seqs[2]), _cu(seqs[5], seqs[3]), _cu(seqs[0], nch_q), _cu(seqs[1], nch_k),
            max_len_q=call.max_len_q, max_len_k=call.max_len_k, **kw,
        )  # fmt: skip
    else:
        o, lse = emulate_fwd_sm100(*ops, tables[0], **kw)
    return o.astype(jnp.bfloat16), lse


def _sharding(call: AttentionFwdSm100Call) -> ShardingRule:
    """Query heads are the compound factor (k g) (MHA: k alone; MQA: g, replicated), as the Hopper forward's
    rule. Sequences (t, s), head_dim (h), scale chunks (u, w), the unit axis (e), chunk bytes (c) and the tables
    never shard; broadcast_q's one query row (a) is whole on every device."""
    if call.group == 1:
        n, sizes = "k", ()
    elif call.n_kv == 1:
        n, sizes = "g", ()
    else:
        n, sizes = "(k g)", (("g", call.group),)
    tables = ("l z", "y x") if call.variant.packed else ("l b",)
    qb = "a" if call.variant.broadcast_q else "b"
    return ShardingRule(
        operands=(f"{qb} t {n} h", f"{qb} {n} u e c", "b s k h", "b k w e c", "b s k h", "b k e w c", *tables),
        results=(f"b t {n} h", f"b {n} t"),
        factor_sizes=sizes,
        replicated=("a", "g", "t", "h", "s", "u", "w", "e", "c", "l", "z", "y", "x"),
    )


def _attrs(call: AttentionFwdSm100Call) -> dict:
    return {"kernel": call.variant.name, "scale_log2": np.float32(scale_log2(call.scale))}


ATTENTION_FWD_SM100 = FfiOp(
    target="jax_mxfp8_attention_fwd_sm100",
    outputs=_outputs,
    emulation=_emulation,
    sharding=_sharding,
    batch_dims=(0, 0, 0, 0, 0, 0, 1),  # lens is (2, B)
    result_batch_dims=(0, 0),
    attrs=_attrs,
)
"""(q, q_sf_hd, k, k_sf_hd, v, v_sf_seq, lens) -> (o, lse); shapes in csrc/attention_fwd_sm100.cc."""

ATTENTION_FWD_SM100_BROADCAST_Q = dataclasses.replace(ATTENTION_FWD_SM100, batch_dims=None, result_batch_dims=None)
"""The same target for the broadcast_q variants: q has batch 1, so vmap maps the call."""

ATTENTION_FWD_SM100_PACKED = FfiOp(
    target="jax_mxfp8_attention_fwd_sm100_packed",
    outputs=_outputs,
    emulation=_emulation,
    sharding=_sharding,
    batch_dims=None,  # one batch row holds every sequence: vmap maps the call over the axis
    attrs=_attrs,
)
"""(q, q_sf_hd, k, k_sf_hd, v, v_sf_seq, seqs, work) -> (o, lse) over packed sequences (batch 1)."""


def _variant(head_dim: int, causal: bool, p_scale: str, p_rounding: str, packed: bool, broadcast_q: bool):
    variant, why = kernel_variant(
        head_dim=head_dim, causal=causal, p_scale=p_scale, p_rounding=p_rounding, packed=packed,
        broadcast_q=broadcast_q,
    )  # fmt: skip
    if variant is None:
        raise ValueError(f"attention_fwd_sm100: {why}")
    return variant


def _check_operands(q: Sm100Operand, k: Sm100Operand, v: Sm100Operand, q_batch: int | None) -> tuple[int, int]:
    """ValueError naming the operand unless q, k, v fit together and carry the scales the kernel reads;
    returns (G, K)."""
    if q.sf_hd is None or k.sf_hd is None or v.sf_seq is None:
        raise ValueError("attention_fwd_sm100 reads q's and k's 'hd' scales and v's 'seq' scales (sm100_operand)")
    bq, _, n, h = q.data.shape
    b, _, n_kv, hk = k.data.shape
    if v.data.shape != k.data.shape or hk != h:
        raise ValueError(f"k {k.data.shape} and v {v.data.shape} must be (B, S, K, H) with q's H = {h}")
    if n_kv == 0 or n % n_kv:
        raise ValueError(f"q's {n} heads must be a multiple of k's {n_kv} heads (GQA / MQA)")
    if bq != (b if q_batch is None else q_batch):
        raise ValueError(f"q has batch {bq}, expected {b if q_batch is None else q_batch}")
    return n // n_kv, n_kv


def attention_fwd_sm100(
    q: Sm100Operand,
    k: Sm100Operand,
    v: Sm100Operand,
    lens: jax.Array,
    *,
    causal: bool,
    scale: float,
    p_scale: str = "const",
    p_rounding: str = "up",
    broadcast_q: bool = False,
    path: str = "cuda",
    out: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Runs the kernel on dense (padded) batches. Returns o (B, T, N, H) bfloat16 and lse (B, N, T) float32.

    lens: (2, B) int32 query / key lengths (clamped to [0, T] / [0, S]). p_scale / p_rounding as
    AttentionConfig.p_scale / scale_rounding. broadcast_q: q (1, T, N, H) is one query sequence for all B batch
    rows. path: "cuda" (the kernel) or "emulated". out: optional (o, lse) buffers the kernel writes into
    (aliased; the NaN-poisoning test hooks; no partitioning or batching)."""
    group, n_kv = _check_operands(q, k, v, 1 if broadcast_q else None)
    variant = _variant(q.data.shape[-1], causal, p_scale, p_rounding, False, broadcast_q)
    t, s = q.data.shape[1], k.data.shape[1]
    lens = jnp.stack([jnp.clip(lens[0], 0, t), jnp.clip(lens[1], 0, s)]).astype(jnp.int32)
    call = AttentionFwdSm100Call(variant, float(scale), group, n_kv)
    args = (q.data, q.sf_hd, k.data, k.sf_hd, v.data, v.sf_seq, lens)
    if path == "cuda":
        library.load_library()  # registers the FFI targets (idempotent)
    if out is not None:
        return ATTENTION_FWD_SM100.ffi_into(call, args, tuple(out))
    op = ATTENTION_FWD_SM100_BROADCAST_Q if broadcast_q else ATTENTION_FWD_SM100
    return op.call(call, path, *args)


def attention_fwd_sm100_packed(
    q: Sm100Operand,
    k: Sm100Operand,
    v: Sm100Operand,
    tables: PackedSequenceTables,
    *,
    causal: bool,
    scale: float,
    max_len_q: int,
    max_len_k: int,
    p_scale: str = "const",
    p_rounding: str = "up",
    path: str = "cuda",
    out: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Runs the kernel over packed sequences (attention_sm100_packed.pack_operand operands, packed_tables tables
    built with the same `causal`). Returns o (1, Tq, N, H) bfloat16 and lse (1, N, Tq) float32: every row of a
    sequence written; rows outside every sequence are not (callers mask them). max_len_q / max_len_k: static
    bounds on the sequence lengths (the emulation's windows; the kernel reads the tables)."""
    group, n_kv = _check_operands(q, k, v, 1)
    if k.data.shape[0] != 1:
        raise ValueError(f"packed operands hold one batch row; k is {k.data.shape}")
    variant = _variant(q.data.shape[-1], causal, p_scale, p_rounding, True, False)
    call = AttentionFwdSm100Call(variant, float(scale), group, n_kv, int(max_len_q), int(max_len_k))
    args = (q.data, q.sf_hd, k.data, k.sf_hd, v.data, v.sf_seq, tables.seqs, tables.work)
    if path == "cuda":
        library.load_library()
    if out is not None:
        return ATTENTION_FWD_SM100_PACKED.ffi_into(call, args, tuple(out))
    return ATTENTION_FWD_SM100_PACKED.call(call, path, *args)
