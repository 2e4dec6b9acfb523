"""FFI-backed Hopper MXFP8 attention backward (layer 5): the kernel call and its XLA emulation.

  kernel_variant(head_dim=, causal=, p_scale=, p_rounding=, dq_accum=, deterministic=, ...) -> (variant | None, why)
  bwd_operands(q, k, v, do_q, do, o, lse, dlse, *, q_len, kv_len, ...) -> BwdOperands   the pre-pass
  packed_tile_table(q_len, kv_len, q_start, kv_start, kv_rows, *, causal) -> PackedTables   the packed variants' lens
      (these three and BwdOperands, SdpFp8Operands: primitives/attention_bwd_prepass.py, re-exported here)
  attention_bwd(ops, *, variant, scale, dq_scale_log2, out=None, path="cuda") -> (dq, dk, dv) padded,
      head-major, float32
  emulate_bwd(ops, *, causal, scale, p_scale, p_rounding, dq_accum, dq_scale_log2) -> the same, in XLA

The targets (csrc/attention_bwd.cc; operand tables in docs/interfaces.md): `jax_mxfp8_attention_bwd`
(q, k, v, do, lse, delta, lens), `jax_mxfp8_attention_bwd_fp8` for the sdp_fp8 variants (production: v8 in v's
place, then q8, k8, do8, qs, ks, vs, dos) and `jax_mxfp8_attention_bwd_packed` for the packed ones (the fp8
operands with seqs, work in lens' place), each -> (dq, dk, dv, dq_sem); attributes `kernel` (the registry
variant's name), `scale` (tau) and `dq_scale_log2` (e of dq_accum "fp16", 0 for "fp32"). The kernel is
kernels/sm90/attention_bwd.py (variants: AttentionBwdConfig in kernels/registry/attention_bwd.py).
Shapes (Tp = T, Sp = S rounded up to 128; N = K * G):
  q, do (B, N, Tp, H) bfloat16; k, v (B, K, Sp, H) bfloat16; lse, delta (B, N, Tp) float32; lens (2, B) int32
  -> the call's dq (B, N, Tp, H) float32 (dq_accum "fp16": float16 holding dQ * 2^e), dk, dv (B, K, Sp, H)
  float32 (dk, dv summed over each KV head's G query heads), dq_sem (B, N, Tp / 32) int32 (the
  deterministic variants' counters; garbage for the others). attention_bwd returns dq / 2^e in float32.
sdp_fp8: the FP8 copies (float8_e4m3fn, shapes of q, k, v, do) re-encoded to one exponent per 32 rows and
their row factors qs, dos (B, N, Tp/32), ks, vs (B, K, Sp/32) float32 (qs includes tau log2(e)); the
emulation is the plain one on V = v8 2^eV.
Every operand is an MX value (E4M3 element x 2^e), exact in bfloat16 (docs/numerics.md "Hopper attention
backward"), so the plain call's emulation is the contract itself: reference/attention_bwd.py's
attention_bwd_quantized run on these operands, which equals the reference backward on the same values bit for bit
(the sdp_fp8 call's reads V re-encoded, v8 2^eV, as its kernel does: not the contract's V^ bit for bit). Under jit
with sharded operands the call partitions over batch and KV-head groups like the forward (attention_fwd.py);
sequences and head_dim are replicated. Under vmap the mapped axis joins the batch.
broadcast_q variants (broadcast_query_attention; dq_accum "fp32", not deterministic): q (1, N, Tp, H) is one
query sequence for all B batch rows; the kernel loads it at batch 0 and adds every batch row's dQ into one
float32 dq (1, N, Tp, H) (its atomics' order), the emulation broadcasts q and sums its per-row dq over the
batch in float32; under a batch-sharded jit each device's call sums its own rows and the partition callback
adds the devices' dq (psum over the batch axes); vmap maps the call.
packed variants (varlen_attention; B = 1 holds every sequence of the aligned packed layout): lens is
PackedTables (seqs, work), the forward's sequence table and the key tiles' work list; the emulation runs every
sequence alone (as the kernel's CTAs see it); vmap maps the call.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.attention import (
    DQ_ACCUMS,
    DQ_FP16_SCALE_LOG2,
    DQ_FP16_SCALE_LOG2_RANGE,
    AttentionConfig,
)
from jax_mxfp8.formats.scales import mul_pow2
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives.attention_bwd_prepass import (
    DO_F16_DEQUANTIZE,
    BwdOperands,
    CausalPackedTables,
    PackedTables,
    SdpFp8Operands,
    bwd_operands,
    packed_tile_table,
)
from jax_mxfp8.primitives.attention_emulation import p_options
from jax_mxfp8.primitives.attention_layout import TILE_M, TILE_N
from jax_mxfp8.primitives.attention_operands import do_shift, shift_per_query_head
from jax_mxfp8.primitives.attention_packed import sequence_windows
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule
from jax_mxfp8.reference.attention_bwd import attention_bwd_quantized
from jax_mxfp8.reference.attention_tiling import Masking

__all__ = [
    "ATTENTION_BWD",
    "ATTENTION_BWD_BROADCAST_Q",
    "ATTENTION_BWD_FP8",
    "ATTENTION_BWD_PACKED",
    "DO_F16_DEQUANTIZE",
    "TARGET",
    "TARGET_FP8",
    "TARGET_PACKED",
    "AttentionBwdCall",
    "BwdOperands",
    "CausalPackedTables",
    "PackedTables",
    "SdpFp8Operands",
    "attention_bwd",
    "bwd_operands",
    "emulate_bwd",
    "kernel_variant",
    "packed_tile_table",
]

TARGET = "jax_mxfp8_attention_bwd"
TARGET_FP8 = TARGET + "_fp8"  # the sdp_fp8 variants' call
TARGET_PACKED = TARGET + "_packed"  # the packed variants' call (sdp_fp8, seqs and work for lens)
BWD_QUERY_TILE = 64  # the backward kernel's query rows per step (one dq_sem counter pair per tile)


# ------------------------------------------------------------------------------------------- the variants
def kernel_variant(
    *,
    head_dim: int,
    causal: bool,
    p_scale: str = "const",
    p_rounding: str = "up",
    dq_accum: str = "fp32",
    deterministic: bool = False,
    packed: bool = False,
    broadcast_q: bool = False,
    tune: int = 0,
) -> tuple[registry.AttentionBwdConfig | None, str | None]:
    """(the registry variant, None) when a backward kernel covers these arguments, else (None, why not).

    deterministic: dQ bit-identical across runs (the kernel orders its KV tiles' adds; slower).
    p_rounding is ignored for p_scale="const" (one scale, no rule), as in the forward's lookup."""
    p_scale, p_rounding = p_options(p_scale, p_rounding)
    if dq_accum not in DQ_ACCUMS:
        raise ValueError(f"dq_accum={dq_accum!r} is not one of {DQ_ACCUMS}")
    fields = dict(head_dim=head_dim, causal=bool(causal), p_scale=p_scale, p_rounding=p_rounding)
    fields.update(dq_accum=dq_accum, deterministic=bool(deterministic), packed=bool(packed))
    fields.update(broadcast_q=bool(broadcast_q))
    if broadcast_q and (dq_accum != "fp32" or deterministic):  # the registry refuses it (AttentionBwdConfig)
        why = "broadcast_q (one query, dQ summed over the batch by float32 atomics) has no dq_accum='fp16' or "
        why += "deterministic=True variant: the backward runs the XLA reference (the defaults take the kernel)"
        return None, why
    variant = registry.find(registry.AttentionBwdConfig, **fields, tune=tune)
    if variant is None:
        args = ", ".join(f"{k}={v!r}" for k, v in {**fields, "tune": tune}.items())
        return None, f"no backward kernel variant for {args}"
    return variant, None


# ------------------------------------------------------------------------------------------ the emulation
def _unwindows(xw: jax.Array, start: jax.Array, length: jax.Array, total: int) -> jax.Array:
    """sequence_windows' inverse for disjoint windows (rows start .. start + length - 1 of each): (W, heads,
    size, H) -> (1, heads, total, H), zeros elsewhere."""
    size = xw.shape[2]
    pos = jnp.arange(size, dtype=jnp.int32)
    idx = jnp.where(pos[None, :] < length[:, None], start[:, None] + pos[None, :], total)  # total: dropped
    rows = jnp.moveaxis(xw, 1, 0).reshape(xw.shape[1], -1, xw.shape[-1])
    out = jnp.zeros((xw.shape[1], total, xw.shape[-1]), xw.dtype)
    return out.at[:, idx.reshape(-1)].set(rows, mode="drop")[None]


def _emulate_packed(ops: BwdOperands, **kw) -> tuple[jax.Array, jax.Array, jax.Array]:
    """emulate_bwd of a packed call (B = 1, lens = PackedTables): every sequence alone, as the kernel's CTAs
    see it (a key tile reads only its sequence's query rows): sequence s becomes batch row s of a dense
    emulation (windows of its whole tiles, zeros after them; the rows past its lengths are masked by them),
    and the gradients go back to their rows (zeros in no sequence's rows)."""
    seqs = ops.lens.seqs
    tp, sp = ops.q.shape[2], ops.k.shape[2]
    q0, kv0, q_len, kv_len = seqs[0] * TILE_M, seqs[1] * TILE_N, seqs[2], seqs[3]
    wq = lambda x: None if x is None else sequence_windows(x, seqs[0], -(-q_len // TILE_M), 2)
    wk = lambda x: None if x is None else sequence_windows(x, seqs[1], -(-kv_len // TILE_N), 2)
    win = BwdOperands(
        wq(ops.q), wk(ops.k), wk(ops.v), wq(ops.do), wq(ops.lse), wq(ops.delta), jnp.stack([q_len, kv_len])
    )
    dq, dk, dv = emulate_bwd(win, **kw)
    return (
        _unwindows(dq, q0, q_len, tp),
        _unwindows(dk, kv0, kv_len, sp),
        _unwindows(dv, kv0, kv_len, sp),
    )


def emulate_bwd(
    ops: BwdOperands,
    *,
    causal: bool,
    scale: float,
    p_scale: str = "const",
    p_rounding: str = "up",
    dq_accum: str = "fp32",
    dq_scale_log2: int = DQ_FP16_SCALE_LOG2,
    packed: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The interface's numerics in XLA: reference/attention_bwd.py on the kernel's operands.

    The padding rows and columns (>= q_len, >= kv_len, and the 128-padding) are masked by the lengths, so
    they produce exact zeros in dq, dk, dv. Returns dq (B, N, Tp, H), dk, dv (B, K, Sp, H) float32 (dq_accum
    "fp16": the float16 accumulator's dQ * 2^e times 2^-e, e = dq_scale_log2). packed: B = 1 and ops.lens the
    PackedTables (_emulate_packed: each sequence alone, as the kernel's CTAs see it)."""
    if packed:
        kw = dict(causal=causal, scale=scale, p_scale=p_scale, p_rounding=p_rounding, dq_accum=dq_accum)
        return _emulate_packed(ops, **kw, dq_scale_log2=dq_scale_log2)
    b, n, tp, h = ops.q.shape
    nk, sp = ops.k.shape[1], ops.k.shape[2]
    g = n // nk
    hm = lambda x: x.reshape(b, nk, g, *x.shape[2:])
    masking = Masking(is_causal=causal, s_real=sp, q_len=ops.lens[0], kv_len=ops.lens[1], mask=None, bias=None)
    config = AttentionConfig(
        p_scale=p_scale, scale_rounding=p_rounding, dq_accum=dq_accum, kv_tile=TILE_N, dq_fp16_scale_log2=dq_scale_log2
    )
    q = hm(ops.q)
    dq, dk, dv, _ = attention_bwd_quantized(
        q, ops.k, ops.v, q, ops.k, hm(ops.lse), hm(ops.do), hm(ops.delta), masking, scale=scale, config=config
    )
    return dq.reshape(b, n, tp, h), dk, dv


# ---------------------------------------------------------------------------------------------- the call
@dataclasses.dataclass(frozen=True)
class AttentionBwdCall:
    """The static part of one kernel call: the variant, tau and the head grouping (for the sharding rule)."""

    variant: registry.AttentionBwdConfig
    scale: float
    group: int  # G = N // K query heads per KV head
    n_kv: int  # K
    dq_scale_log2: int = 0  # e of dq_accum "fp16" (the call's dq holds dQ * 2^e); 0 for "fp32"

    @property
    def dq_dtype(self):
        return jnp.float16 if self.variant.dq_accum == "fp16" else jnp.float32


def _outputs(call: AttentionBwdCall, q, k, v, do, *rest):
    b, n, tp, _ = do.shape  # q's shape with the batch of k (broadcast_q: q has batch 1)
    return (
        jax.ShapeDtypeStruct(q.shape, call.dq_dtype),  # broadcast_q: (1, N, Tp, H), the sum over the batch
        jax.ShapeDtypeStruct(k.shape, jnp.float32),
        jax.ShapeDtypeStruct(k.shape, jnp.float32),
        jax.ShapeDtypeStruct((b, n, tp // 32), jnp.int32),
    )


def _emulation(call: AttentionBwdCall, q, k, v, do, lse, delta, lens):
    var = call.variant
    p_scale, p_rounding = p_options(var.p_scale, var.p_rounding)
    e = call.dq_scale_log2
    if var.broadcast_q:  # the kernel loads batch 0's Q for every batch row: the values of a broadcast copy
        q = jnp.broadcast_to(q, do.shape)
    dq, dk, dv = emulate_bwd(
        BwdOperands(q, k, v, do, lse, delta, lens),
        causal=var.causal,
        scale=call.scale,
        p_scale=p_scale,
        p_rounding=p_rounding,
        dq_accum=var.dq_accum,
        dq_scale_log2=e if var.dq_accum == "fp16" else DQ_FP16_SCALE_LOG2,
        packed=var.packed,
    )
    # the call's dq: the float16 accumulator itself for "fp16" (dq 2^e is exact: dq is that float16 value
    # times 2^-e); dq_sem as the kernel leaves it for the deterministic variants (every counter at its
    # query tile's number of KV tiles), zeros otherwise (XLA's output is unspecified there)
    dq = (dq * jnp.float32(2.0**e)).astype(jnp.float16) if var.dq_accum == "fp16" else dq
    sem = _emulated_sem(call, q.shape, lens)
    if var.broadcast_q:  # the kernel's reductions of every batch row into batch 0's dq (float32 only)
        dq = jnp.sum(dq, axis=0, keepdims=True)
    return dq, dk, dv, sem


def _emulation_fp8(call: AttentionBwdCall, q, k, v8, do, lse, delta, lens, q8, k8, do8, qs, ks, vs, dos):
    """The sdp_fp8 target's emulation: the plain call's on V = v8 2^eV (the re-encoded V the kernel's dP^T
    reads, exact in bfloat16) and the bfloat16 q, k, do. The kernel's S^T and dP^T read the re-encoded Q, K,
    dO as well, which differ from q, k, do only where the one-exponent-per-32-rows re-encoding rounded an
    element below E4M3's normal range (measured in tests/attention/test_attention_bwd_kernel_gpu.py). dv_f16 variants:
    do is float16 dO^ 2^-shift (shift from dos, as bwd_operands made it) and dv comes out times 2^-shift; the
    emulation reads dO as do 2^shift for dP as well, which equals dO^ except in blocks more than 22 binades
    below the group's largest (rounded in float16; the kernel's dP^T reads do8 there)."""
    del q8, k8, do8, qs, ks
    v = (v8.astype(jnp.float32) * jnp.repeat(vs, 32, axis=2)[..., None]).astype(jnp.bfloat16)
    if not call.variant.dv_f16:
        return _emulation(call, q, k, v, do, lse, delta, lens)
    shift = shift_per_query_head(do_shift(dos, call.group), q.shape[1])  # (B, N, 1, 1)
    dq, dk, dv, sem = _emulation(call, q, k, v, mul_pow2(do.astype(jnp.float32), shift), lse, delta, lens)
    return dq, dk, mul_pow2(dv, -shift[:, :: call.group]), sem


def _emulated_sem(call: AttentionBwdCall, q_shape, lens) -> jax.Array:
    """dq_sem (B, N, Tp / 32) int32 after a deterministic kernel call: counter [b, n, 2 m + c] = the number
    of KV tiles with keys < kv_len (causal: also tiles n <= (64 m + 63) / 128) for query tiles m with rows
    < q_len, and for both head-dim halves c at H128 (c = 0 only at H64); 0 elsewhere and for the others."""
    b, n, tp, h = q_shape
    if not call.variant.deterministic:
        return jnp.zeros((b, n, tp // 32), jnp.int32)
    rows = BWD_QUERY_TILE
    slot = jnp.arange(tp // 32, dtype=jnp.int32)  # 2 m + c (an iota: custom_partitioning takes no constants)
    m, c = slot // 2, slot % 2
    count = jnp.broadcast_to(((lens[1] + TILE_N - 1) // TILE_N)[:, None], (b, slot.size))
    if call.variant.causal:
        count = jnp.minimum(count, (rows * m + rows - 1) // TILE_N + 1)
    live = (m[None, :] * rows < lens[0][:, None]) & ((c == 0) | (h == 128))[None, :]
    sem = jnp.where(live, count, 0)[:, None, :]
    return jnp.broadcast_to(sem, (b, n, tp // 32)).astype(jnp.int32)


def _sharding(call: AttentionBwdCall) -> ShardingRule:
    """As the forward's (attention_fwd._sharding): query heads are the compound factor (k g), MHA names k
    alone, MQA gives the query heads their own replicated factor g; sequences, head_dim and lens' first
    axis never shard."""
    if call.group == 1:
        n, sizes = "k", ()
    elif call.n_kv == 1:
        n, sizes = "g", ()
    else:
        n, sizes = "(k g)", (("g", call.group),)
    # broadcast_q: the one query row (and its dq, the sum over the batch) whole on every device; with the
    # batch sharded, each device's dq sums its own rows and the partition adds the devices' (ffi_op summed)
    bq = call.variant.broadcast_q
    qb = "a" if bq else "b"
    tables = ("l z", "y x") if call.variant.packed else ("l b",)  # packed: seqs, work, never sharded
    return ShardingRule(
        operands=(f"{qb} {n} t h", "b k s h", "b k s h", f"b {n} t h", f"b {n} t", f"b {n} t", *tables),
        results=(f"{qb} {n} t h", "b k s h", "b k s h", f"b {n} u"),
        factor_sizes=sizes,
        replicated=("a", "g", "t", "h", "s", "l", "u", "x", "y", "z"),
        summed=((0, "b"),) if bq else (),
    )


ATTENTION_BWD = FfiOp(
    target=TARGET,
    outputs=_outputs,
    emulation=_emulation,
    sharding=_sharding,
    batch_dims=(0, 0, 0, 0, 0, 0, 1),  # lens is (2, B)
    result_batch_dims=(0, 0, 0, 0),
    attrs=lambda call: {
        "kernel": call.variant.name,
        "scale": np.float32(call.scale),
        "dq_scale_log2": np.int32(call.dq_scale_log2),
    },
)
"""(q, k, v, do, lse, delta, lens) -> (dq, dk, dv, dq_sem); shapes in the module docstring and
csrc/attention_bwd.cc."""


def _sharding_fp8(call: AttentionBwdCall) -> ShardingRule:
    """_sharding's rule with the FP8 copies (q8, do8 as q; k8, v8 as k) and their row factors (qs, dos over
    (b, heads, Tp/32), ks, vs over (b, k, Sp/32)) appended."""
    rule = _sharding(call)  # (packed: seqs and work in lens' place)
    q_spec, k_spec, _, do_spec = rule.operands[:4]
    qf = do_spec.rsplit(" ", 2)[0] + " u"  # "b {n} u"
    extra = (q_spec, k_spec, do_spec, qf, "b k w", "b k w", qf)  # q8, k8, do8, qs, ks, vs, dos (v8 in v's place)
    return dataclasses.replace(rule, operands=rule.operands + extra, replicated=rule.replicated + ("w",))


ATTENTION_BWD_FP8 = FfiOp(
    target=TARGET_FP8,
    outputs=_outputs,
    emulation=_emulation_fp8,
    sharding=_sharding_fp8,
    batch_dims=(0, 0, 0, 0, 0, 0, 1) + (0,) * 7,
    result_batch_dims=(0, 0, 0, 0),
    attrs=ATTENTION_BWD.attrs,
)
"""(q, k, v8, do, lse, delta, lens, q8, k8, do8, qs, ks, vs, dos) -> (dq, dk, dv, dq_sem): the sdp_fp8
variants (csrc/attention_bwd.cc)."""

ATTENTION_BWD_BROADCAST_Q = dataclasses.replace(ATTENTION_BWD, batch_dims=None, result_batch_dims=None)
"""The same target for the broadcast_q variants: q has batch 1, so vmap maps the call."""


def _emulation_packed(call: AttentionBwdCall, q, k, v8, do, lse, delta, seqs, work, *fp8):
    """The packed target's emulation: the sdp_fp8 one with lens = PackedTables(seqs, work)."""
    return _emulation_fp8(call, q, k, v8, do, lse, delta, PackedTables(seqs, work), *fp8)


ATTENTION_BWD_PACKED = dataclasses.replace(
    ATTENTION_BWD_FP8, target=TARGET_PACKED, emulation=_emulation_packed, batch_dims=None, result_batch_dims=None
)
"""(q, k, v8, do, lse, delta, seqs, work, q8, k8, do8, qs, ks, vs, dos) -> (dq, dk, dv, dq_sem): the packed
variants (sdp_fp8; B = 1 holds every sequence, so vmap maps the call over the axis)."""


def attention_bwd(
    ops: BwdOperands,
    *,
    variant,
    scale: float,
    dq_scale_log2: int = DQ_FP16_SCALE_LOG2,
    out: tuple[jax.Array, ...] | None = None,
    path: str = "cuda",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Runs the backward kernel variant (kernel_variant) on the pre-pass's operands.

    Returns dq (B, N, Tp, H), dk, dv (B, K, Sp, H) float32, padding rows 0; for dq_accum "fp16" dq is the
    kernel's float16 dQ * 2^e times 2^-e (e = dq_scale_log2 in [0, 15]; ignored for "fp32"). out: optional
    (dq, dk, dv, dq_sem) buffers the kernel writes into (the call's dtypes and shapes; the `_into` test
    hook, aliased; tests pass NaN-filled ones to check that every element is written; no partitioning or
    batching; dv_f16 variants: the returned dv is that buffer times 2^do_shift, a new array). path "emulated"
    runs emulate_bwd through the same partitioning and batching (CPU tests).
    """
    fp16 = variant.dq_accum == "fp16"
    lo, hi = DQ_FP16_SCALE_LOG2_RANGE
    bad = isinstance(dq_scale_log2, bool) or not isinstance(dq_scale_log2, int) or not lo <= dq_scale_log2 <= hi
    if fp16 and bad:
        raise ValueError(f"dq_scale_log2={dq_scale_log2!r} must be an int in [{lo}, {hi}]")
    e = int(dq_scale_log2) if fp16 else 0
    n_kv = ops.k.shape[1]
    call = AttentionBwdCall(variant, float(scale), ops.q.shape[1] // n_kv, n_kv, e)
    op = ATTENTION_BWD_BROADCAST_Q if variant.broadcast_q else ATTENTION_BWD
    if variant.broadcast_q and ops.q.shape[0] != 1:
        raise ValueError(f"a broadcast_q variant takes q of batch 1; got {ops.q.shape}")
    packed_lens = isinstance(ops.lens, PackedTables)
    if variant.packed != packed_lens or (variant.packed and not variant.sdp_fp8):
        want = "PackedTables (packed_tile_table) and the FP8 operands" if variant.packed else "lens (2, B)"
        got = "PackedTables" if packed_lens else f"lens {ops.lens.shape}"
        raise ValueError(f"variant {variant.name} takes {want}; got {got}")
    if variant.packed and variant.causal != isinstance(ops.lens, CausalPackedTables):
        raise ValueError(
            f"variant {variant.name} decodes a work list in {'longest-first' if variant.causal else 'key-tile'} "
            f"order: pass packed_tile_table(..., causal={variant.causal})"
        )
    want_do = jnp.float16 if variant.dv_f16 else jnp.bfloat16
    if variant.dv_f16 != (ops.do_shift is not None) or ops.do.dtype != want_do:
        want = "float16 do and its do_shift: bwd_operands(..., do_f16=True)" if variant.dv_f16 else "bfloat16 do"
        got = f"do {ops.do.dtype}, do_shift {'None' if ops.do_shift is None else 'given'}"
        raise ValueError(f"variant {variant.name} takes {want}; got {got}")
    if ops.do_shift is not None:
        want_shape = (ops.k.shape[0], ops.k.shape[1])
        if ops.do_shift.shape != want_shape or not jnp.issubdtype(ops.do_shift.dtype, jnp.integer):
            got = f"{ops.do_shift.shape} {ops.do_shift.dtype}"
            raise ValueError(f"do_shift must be {want_shape} (B, K) integers, got {got}")
    if variant.sdp_fp8:
        if ops.fp8 is None:
            raise ValueError(f"variant {variant.name} (sdp_fp8) needs the FP8 copies: bwd_operands(..., fp8_path=)")
        op, args = (ATTENTION_BWD_PACKED if variant.packed else ATTENTION_BWD_FP8), ops.fp8_args()
    elif ops.v is None:
        raise ValueError(f"variant {variant.name} reads the bfloat16 v: bwd_operands without fp8_path")
    else:
        args = ops.args()
    if out is None:
        dq, dk, dv, _ = op.call(call, path, *args)
    else:
        dq, dk, dv, _ = op.ffi_into(call, args, out)
    if fp16:
        dq = dq.astype(jnp.float32) * jnp.float32(2.0**-e)
    if variant.dv_f16:  # the kernel's dv holds dV 2^-shift (exact powers of two)
        dv = mul_pow2(dv, ops.do_shift[:, :, None, None])
    return dq, dk, dv
