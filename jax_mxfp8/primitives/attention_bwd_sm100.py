"""FFI-backed Blackwell MXFP8 attention backward (layer 5): the dO / Delta pre-pass and the backward kernel calls,
their XLA emulation (primitives/attention_bwd_sm100_emulation.py, attention_sm100_packed.py).

  find_variant(head_dim=, causal=, p_scale=, dq_accum=, deterministic=, packed=, dkv=) -> variant | None
  prepass_variant(head_dim, in_dtype, packed) -> variant | None
  bwd_prepass_sm100(do, o, dlse, tables, *, path, max_len_q=None, out=None) -> (do operand, delta)
  attention_bwd_sm100(q, k, v, do, lse, delta, tables, *, variant, scale, dq_scale_log2, path, max_len_q=None,
                      max_len_k=None, out=None) -> (dq, dk, dv)

The targets (csrc/attention_bwd_sm100.cc; operands: docs/interfaces.md "sm100 attention"):
  jax_mxfp8_attention_bwd_prepass_sm100  (do, o, dlse, lens | seqs, query_tiles) -> (do_q, do_sf_hd, do_sf_seq,
                                         delta)
  jax_mxfp8_attention_bwd_sm100          (q, q_sf_hd, q_sf_seq, k, k_sf_hd, k_sf_seq, v, v_sf_hd, do, do_sf_hd,
                                         do_sf_seq, lse, delta, lens | seqs, key_tiles) -> ([dq_sem,] dq, dk, dv)
attributes `kernel` (the registry variant's name) and, for the backward, `scale` (tau), `scale_log2`
(float32(tau log2 e)) and `dq_scale` (tau 2^e for dq_accum "fp16", tau otherwise). Shapes: q (Bq, T, N, H),
k, v (B, S, K, H), do (B, T, N, H) float8_e4m3fn (Sm100Operand data) with their blocked scales
(B, heads, C, 1, 512) "hd" / (B, heads, 1, C, 512) "seq"; lse, delta (B, N, T) float32; lens (2, B) int32;
dq (Bq, T, N, H) float32, or float16 holding dQ 2^e; dk, dv (B, S, K, H) float32; dq_sem (B, N, Cq) int32.
tables: lens (dense) or attention_sm100_packed.PackedSequenceTables (packed, B = 1; the emulation needs the
longest sequence, max_len_q / max_len_k, static).

The emulation is the kernel's arithmetic (domain "log2"): dq_accum "fp16" with deterministic=False is the
float16 TMA reduce-add (the emulation's "fp16_reduce": each key tile's partial rounded to float16, then
added), deterministic=True the ordered float32 add and one rounding per key tile ("fp16"). Sharding: the
batch axis (dense variants; broadcast q: q and dq whole, the devices' dq summed); vmap folds into the batch
(broadcast q and packed: mapped). NOT RUN ON HARDWARE by this project: compiled for sm_100f, checked
statically; the first call on a compute-capability 10.x GPU runs the family's self-test
(primitives/attention_bwd_sm100_self_test.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.attention import DQ_FP16_SCALE_LOG2, DQ_FP16_SCALE_LOG2_RANGE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import quantize as ref_quantize
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.attention_bwd_sm100_emulation import bwd_prepass, emulate_bwd_sm100
from jax_mxfp8.primitives.attention_sm100_emulation import LOG2E
from jax_mxfp8.primitives.attention_sm100_operands import TILE, Sm100Operand
from jax_mxfp8.primitives.attention_sm100_packed import (
    PackedSequenceTables,
    emulate_packed_bwd_sm100,
    pack_operand,
)
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule
from jax_mxfp8.reference.attention_bwd import bwd_delta

FAMILY = registry.AttentionBwdSm100Config.op
PREPASS_FAMILY = registry.AttentionBwdPrepassConfig.op
ARCHS = registry.AttentionBwdSm100Config.archs
TARGET = "jax_mxfp8_attention_bwd_sm100"
TARGET_PREPASS = "jax_mxfp8_attention_bwd_prepass_sm100"


def find_variant(
    *, head_dim: int, causal: bool = False, p_scale: str = "const", dq_accum: str = "fp32", deterministic: bool = False,
    packed: bool = False, dkv: str = "float32", tune: int = 0,
) -> registry.AttentionBwdSm100Config | None:  # fmt: skip
    """The registered backward variant for these options, or None."""
    if head_dim not in (64, 128):
        return None
    return registry.find(
        registry.AttentionBwdSm100Config, head_dim=head_dim, causal=bool(causal), p_scale=p_scale,
        dq_accum=dq_accum, deterministic=bool(deterministic), packed=bool(packed), dkv=dkv, tune=tune,
    )  # fmt: skip


def prepass_variant(head_dim: int, in_dtype, packed: bool = False) -> registry.AttentionBwdPrepassConfig | None:
    """The pre-pass variant for dO / O of `in_dtype` (bfloat16 or float32), or None."""
    name = np.dtype(in_dtype).name
    if head_dim not in (64, 128) or name not in ("bfloat16", "float32"):
        return None
    return registry.find(registry.AttentionBwdPrepassConfig, head_dim=head_dim, in_dtype=name, packed=bool(packed))


def _chunks(x: int) -> int:
    return -(-x // TILE)


def _cu(seqs: jax.Array, length_row: int, start_row: int) -> jax.Array:
    """(S + 1,) row offsets of the packed sequences from the seqs table (first row and length rows)."""
    return jnp.concatenate([seqs[start_row], seqs[start_row, -1:] + seqs[length_row, -1:]]).astype(jnp.int32)


def _chunk0(seqs: jax.Array, row: int) -> jax.Array:
    return jnp.concatenate([seqs[row], jnp.zeros((1,), jnp.int32)]).astype(jnp.int32)  # [-1] is never read


# --------------------------------------------------------------------------------------------------- pre-pass
@dataclasses.dataclass(frozen=True)
class PrepassCall:
    """The static part of one pre-pass call: the variant and (packed) the longest query sequence."""

    variant: registry.AttentionBwdPrepassConfig
    max_len_q: int = 0


def _prepass_outputs(call: PrepassCall, do, o, dlse, *tables):
    b, t, n, _ = do.shape
    c = tables[1].shape[1] if call.variant.packed else _chunks(t)
    u8 = jnp.uint8
    return (
        jax.ShapeDtypeStruct(do.shape, jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct((b, n, c, 1, 512), u8),
        jax.ShapeDtypeStruct((b, n, 1, c, 512), u8),
        jax.ShapeDtypeStruct((b, n, t), jnp.float32),
    )


def _prepass_emulation(call: PrepassCall, do, o, dlse, *tables):
    if not call.variant.packed:
        op, delta = bwd_prepass(do, o, dlse, tables[0][0])
        return op.data, op.sf_hd, op.sf_seq, delta
    seqs, query_tiles = tables
    cu = _cu(seqs, 2, 4)
    op = pack_operand(
        do.astype(jnp.float32), cu, _chunk0(seqs, 0), max_len=call.max_len_q, n_chunks=query_tiles.shape[1]
    )
    inside = (jnp.arange(do.shape[1])[None, :] >= cu[:-1, None]) & (jnp.arange(do.shape[1])[None, :] < cu[1:, None])
    d = jnp.where(jnp.any(inside, axis=0)[None, :, None, None], do.astype(jnp.float32), 0.0)
    delta = jnp.swapaxes(bwd_delta(d, o, jnp.swapaxes(dlse, 1, 2)), 1, 2)
    return op.data, op.sf_hd, op.sf_seq, delta


def _prepass_sharding(call: PrepassCall) -> ShardingRule:
    tables = ("y x", "w v") if call.variant.packed else ("l b",)
    return ShardingRule(
        operands=("b t n h", "b t n h", "b n t", *tables),
        results=("b t n h", "b n c o z", "b n o c z", "b n t"),
        replicated=("t", "n", "h", "c", "o", "z", "l", "y", "x", "w", "v") + (("b",) if call.variant.packed else ()),
    )


BWD_PREPASS_SM100 = FfiOp(
    target=TARGET_PREPASS,
    outputs=_prepass_outputs,
    emulation=_prepass_emulation,
    sharding=_prepass_sharding,
    batch_dims=(0, 0, 0, 1),
    result_batch_dims=(0, 0, 0, 0),
)
"""(do, o, dlse, lens) -> (do_q, do_sf_hd, do_sf_seq, delta): the dense pre-pass."""

BWD_PREPASS_SM100_PACKED = dataclasses.replace(BWD_PREPASS_SM100, batch_dims=None, result_batch_dims=None)
"""(do, o, dlse, seqs, query_tiles) -> the same: the packed pre-pass (B = 1; vmap maps the call)."""


def bwd_prepass_sm100(
    do: jax.Array, o: jax.Array, dlse: jax.Array, tables, *, path: str, max_len_q: int | None = None, out=None
) -> tuple[Sm100Operand, jax.Array]:
    """dO's square-block operand (both orientations) and Delta = rowsum(dO O) - dLSE (module docstring).

    do, o (B, T, N, H) bfloat16 or float32 (one dtype); dlse (B, N, T) float32; tables: lens (2, B) int32 or
    PackedSequenceTables (max_len_q: the longest query sequence, static). out: the results' buffers (the
    `_into` test hook, aliased). Returns (Sm100Operand, delta (B, N, T) float32)."""
    packed = isinstance(tables, PackedSequenceTables)
    variant = prepass_variant(do.shape[-1], do.dtype, packed)
    if variant is None or o.dtype != do.dtype or o.shape != do.shape:
        raise ValueError(
            f"bwd_prepass_sm100: no pre-pass for do {do.dtype} {do.shape} / o {o.dtype} {o.shape} (H 64 or 128, "
            "bfloat16 or float32, one dtype)"
        )
    if packed and max_len_q is None:
        raise ValueError("bwd_prepass_sm100: packed tables need max_len_q")
    call = PrepassCall(variant, int(max_len_q or 0))
    args = (do, o, dlse.astype(jnp.float32), *((tables.seqs, tables.query_tiles) if packed else (tables,)))
    decl = BWD_PREPASS_SM100_PACKED if packed else BWD_PREPASS_SM100
    if path == "cuda":
        library.load_library()
    res = decl.ffi_into(call, args, tuple(out)) if out is not None else decl.call(call, path, *args)
    data, sf_hd, sf_seq, delta = res
    return Sm100Operand(data, sf_hd, sf_seq), delta


# --------------------------------------------------------------------------------------------------- backward
@dataclasses.dataclass(frozen=True)
class BwdCall:
    """The static part of one backward call: the variant, tau, e of dq_accum "fp16", (packed) the longest
    query and key sequences."""

    variant: registry.AttentionBwdSm100Config
    scale: float
    dq_scale_log2: int = DQ_FP16_SCALE_LOG2
    max_len_q: int = 0
    max_len_k: int = 0
    broadcast_q: bool = False  # q (and dq) of batch 1 for k's B rows

    @property
    def dq_dtype(self):
        return jnp.float16 if self.variant.dq_accum == "fp16" else jnp.float32

    @property
    def emulated_dq_accum(self) -> str:
        """The emulation's dq_accum for the variant's dQ path (module docstring)."""
        v = self.variant
        return "fp32" if v.dq_accum == "fp32" else ("fp16" if v.deterministic else "fp16_reduce")


def _bwd_outputs(call: BwdCall, q, q_hd, q_seq, k, k_hd, k_seq, v, v_hd, do, *rest):
    b, t, n, h = do.shape
    _, s, n_kv, _ = k.shape
    tokens, features = b * s, n_kv * h
    e4m3, u8 = jnp.float8_e4m3fn, jnp.uint8
    out = {
        "dq_sem": jax.ShapeDtypeStruct((b, n, q_hd.shape[2]), jnp.int32),
        "dq": jax.ShapeDtypeStruct(q.shape, call.dq_dtype),
        "dk": jax.ShapeDtypeStruct(k.shape, jnp.float32),
        "dv": jax.ShapeDtypeStruct(k.shape, jnp.float32),
    }
    for g in ("dk", "dv"):  # dkv "mx": MXGradient's row and col MXArrays of bfloat16(g), (B S, K H)
        out[f"{g}_row"] = out[f"{g}_col"] = jax.ShapeDtypeStruct((tokens, features), e4m3)
        out[f"{g}_row_scale"] = jax.ShapeDtypeStruct((tokens, features // 32), u8)
        out[f"{g}_col_scale"] = jax.ShapeDtypeStruct((tokens // 32, features), u8)
    return tuple(out[name] for name in call.variant.outputs)


def _mx_gradient_parts(g: jax.Array, name: str) -> dict[str, jax.Array]:
    """dkv "mx": (B, S, K, H) float32 -> the row / col quantization of bfloat16(g) as (B S, K H) matrices (32-blocks
    along features / tokens, rule "up"), as the kernel's epilogue writes them."""
    b, s, n_kv, h = g.shape
    x = g.astype(jnp.bfloat16).reshape(b * s, n_kv * h)
    row, col = ref_quantize(x, axis=-1), ref_quantize(x, axis=-2)
    return {f"{name}_row": row.data, f"{name}_row_scale": row.scale, f"{name}_col": col.data,
            f"{name}_col_scale": col.scale}  # fmt: skip


def _bwd_emulation(call: BwdCall, q, q_hd, q_seq, k, k_hd, k_seq, v, v_hd, do, do_hd, do_seq, lse, delta, *tables):
    var = call.variant
    ops = (Sm100Operand(q, q_hd, q_seq), Sm100Operand(k, k_hd, k_seq), Sm100Operand(v, v_hd))
    kw = dict(causal=var.causal, scale=call.scale, p_scale=var.p_scale, dq_accum=call.emulated_dq_accum,
              dq_scale_log2=call.dq_scale_log2)  # fmt: skip
    if var.packed:
        seqs = tables[0]
        dq, dk, dv = emulate_packed_bwd_sm100(
            *ops, Sm100Operand(do, do_hd, do_seq), lse, delta, _cu(seqs, 2, 4), _cu(seqs, 3, 5), _chunk0(seqs, 0),
            _chunk0(seqs, 1), max_len_q=call.max_len_q, max_len_k=call.max_len_k, **kw,
        )  # fmt: skip
    else:
        dq, dk, dv = emulate_bwd_sm100(*ops, Sm100Operand(do, do_hd, do_seq), lse, delta, tables[0], **kw)
    if var.dq_accum == "fp16":  # the call's dq is the float16 accumulator of dQ 2^e (exact: a power of two)
        dq = (dq * np.float32(2.0**call.dq_scale_log2)).astype(jnp.float16)
    res = {"dq": dq, "dk": dk, "dv": dv}
    if var.dkv == "mx":
        res |= _mx_gradient_parts(dk, "dk") | _mx_gradient_parts(dv, "dv")
    if var.deterministic:
        res["dq_sem"] = _emulated_sem(call, do.shape, q_hd.shape[2], k.shape[1], tables[0])
    return tuple(res[name] for name in var.outputs)


def _emulated_sem(call: BwdCall, do_shape, cq: int, s: int, lens) -> jax.Array:
    """dq_sem after a deterministic call: each query tile's counter at the number of key tiles that visited it
    (key tiles with keys < kv_len; causal: those at or left of the tile's diagonal), for query tiles with rows
    < q_len; 0 elsewhere."""
    b, _, n, _ = do_shape
    m = jnp.arange(cq, dtype=jnp.int32)[None, :]
    count = jnp.broadcast_to(((jnp.minimum(lens[1], s) + TILE - 1) // TILE)[:, None], (b, cq))
    if call.variant.causal:
        count = jnp.minimum(count, m + 1)
    live = m * TILE < lens[0][:, None]
    return jnp.broadcast_to(jnp.where(live, count, 0)[:, None, :], (b, n, cq)).astype(jnp.int32)


def _bwd_sharding(call: BwdCall) -> ShardingRule:
    """The batch shards (dense); everything else whole. Broadcast q: q and its dq are whole on every device
    and each device's dq sums its rows (the partition adds the devices' dq: `summed`)."""
    var = call.variant
    qb = "a" if call.broadcast_q else "b"

    def sf(batch: str, heads: str, chunks: str) -> tuple[str, str]:  # "hd" (.., C, 1, 512), "seq" (.., 1, C, 512)
        return f"{batch} {heads} {chunks} o z", f"{batch} {heads} o {chunks} z"

    q_sf, k_sf, do_sf = sf(qb, "n", "c"), sf("b", "k", "d"), sf("b", "n", "c")
    tables = ("y x", "w v") if var.packed else ("l b",)
    ops = (f"{qb} t n h", *q_sf, "b s k h", *k_sf, "b s k h", k_sf[0], "b t n h", *do_sf, "b n t", "b n t", *tables)
    res = {"dq_sem": "b n c", "dq": f"{qb} t n h", "dk": "b s k h", "dv": "b s k h"}
    for g in ("dk", "dv"):  # dkv "mx": (B S, K H) matrices, whole (the batch is folded into their rows)
        res |= {f"{g}_row": "r f", f"{g}_row_scale": "r e", f"{g}_col": "r f", f"{g}_col_scale": "p f"}
    whole = ("a", "t", "n", "h", "c", "d", "o", "z", "s", "k", "l", "y", "x", "w", "v", "r", "f", "e", "p")
    return ShardingRule(
        operands=ops,
        results=tuple(res[name] for name in var.outputs),
        replicated=whole + (("b",) if var.packed or var.dkv == "mx" else ()),
        summed=((var.outputs.index("dq"), "b"),) if call.broadcast_q else (),
    )


def _bwd_attrs(call: BwdCall) -> dict:
    e = call.dq_scale_log2 if call.variant.dq_accum == "fp16" else 0
    return {  # rounded from float64 as the emulation's factors (attention_sm100_emulation.exponent)
        "kernel": call.variant.name,
        "scale": np.float32(call.scale),
        "scale_log2": np.float32(call.scale * LOG2E),
        "dq_scale": np.float32(call.scale * 2.0**e),
    }


BWD_SM100 = FfiOp(
    target=TARGET,
    outputs=_bwd_outputs,
    emulation=_bwd_emulation,
    sharding=_bwd_sharding,
    batch_dims=(0,) * 13 + (1,),
    result_batch_dims=None,
    attrs=_bwd_attrs,
)
"""The dense backward with q of batch B: (q, q_sf_hd, q_sf_seq, k, .., do_sf_seq, lse, delta, lens) -> the
variant's outputs ([dq_sem,] dq, dk, dv)."""

BWD_SM100_MAPPED = dataclasses.replace(BWD_SM100, batch_dims=None)
"""The same target for broadcast q (q of batch 1), packed tables and MX dK / dV: vmap maps the call."""


def attention_bwd_sm100(
    q: Sm100Operand, k: Sm100Operand, v: Sm100Operand, do: Sm100Operand, lse: jax.Array, delta: jax.Array, tables, *,
    variant: registry.AttentionBwdSm100Config, scale: float, dq_scale_log2: int = DQ_FP16_SCALE_LOG2, path: str,
    max_len_q: int | None = None, max_len_k: int | None = None, out=None,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """Runs the backward variant on the forward's operands and the pre-pass's (module docstring).

    Returns dq (Bq, T, N, H) float32 (dq_accum "fp16": the kernel's float16 dQ 2^e times 2^-e), dk, dv (B, S,
    K, H) float32 (GQA: summed over each KV head's query heads); for a dkv "mx" variant dk and dv are each a
    pair (row, col) of MXArrays of the (B S, K H) matrix of bfloat16(g), blocked along features / tokens
    (jax_mxfp8.MXGradient's). out: the results' buffers in the variant's output order (the `_into` test hook,
    aliased; no partitioning or batching). path "emulated" runs the emulation through the same partitioning and
    batching."""
    packed = isinstance(tables, PackedSequenceTables)
    if packed != variant.packed or (packed and (max_len_q is None or max_len_k is None)):
        want = "PackedSequenceTables and max_len_q / max_len_k" if variant.packed else "lens (2, B)"
        raise ValueError(f"attention_bwd_sm100: variant {variant.name} takes {want}")
    lo, hi = DQ_FP16_SCALE_LOG2_RANGE
    e = dq_scale_log2
    if isinstance(e, bool) or not isinstance(e, (int, np.integer)) or not lo <= e <= hi:
        raise ValueError(f"dq_scale_log2={e!r} must be an int in [{lo}, {hi}]")
    b, t, n, h = do.data.shape
    why = variant.unsupported(b, t, k.data.shape[1], n, k.data.shape[2], q.data.shape[0])
    if why:
        raise ValueError(f"attention_bwd_sm100: {why}")
    broadcast_q = q.data.shape[0] != b
    call = BwdCall(variant, float(scale), int(e), int(max_len_q or 0), int(max_len_k or 0), broadcast_q)
    parts = (q.data, q.sf_hd, q.sf_seq, k.data, k.sf_hd, k.sf_seq, v.data, v.sf_hd, do.data, do.sf_hd, do.sf_seq)
    args = (*parts, lse, delta, *((tables.seqs, tables.key_tiles) if packed else (tables,)))
    decl = BWD_SM100_MAPPED if packed or broadcast_q or variant.dkv == "mx" else BWD_SM100
    if path == "cuda":
        library.load_library()
    res = decl.ffi_into(call, args, tuple(out)) if out is not None else decl.call(call, path, *args)
    got = dict(zip(variant.outputs, res))
    dq = got["dq"]
    if variant.dq_accum == "fp16":
        dq = dq.astype(jnp.float32) * np.float32(2.0**-e)
    if variant.dkv == "mx":
        return (dq, *(
            (MXArray(got[f"{g}_row"], got[f"{g}_row_scale"], (-1,), "row"),
             MXArray(got[f"{g}_col"], got[f"{g}_col_scale"], (-2,), "row"))
            for g in ("dk", "dv")
        ))  # fmt: skip
    return dq, got["dk"], got["dv"]
