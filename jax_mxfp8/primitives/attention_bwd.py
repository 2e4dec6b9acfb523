"""FFI-backed Hopper MXFP8 attention backward (layer 5): the kernel call, its pre-pass and its XLA emulation.

  kernel_variant(head_dim=, causal=, p_scale=, p_rounding=, dq_accum=, deterministic=, ...) -> (variant | None, why)
  bwd_operands(q, k, v, do_q, do, o, lse, dlse, *, q_len, kv_len, broadcast_q=False, fp8_path=None, scale=None,
               path=None, do_f16=False)
      -> BwdOperands   the pre-pass (XLA, or the realign + dequantize calls on `path`; with fp8_path the FP8
      copies of the sdp_fp8 variants)
  attention_bwd(ops, *, variant, scale, dq_scale_log2, out=None, path="cuda") -> (dq, dk, dv) padded,
      head-major, float32
  emulate_bwd(ops, *, causal, scale, p_scale, p_rounding, dq_accum, dq_scale_log2) -> the same, in XLA

The interface is /work/coord/ATTN_BWD_INTERFACE.md (issue 17): target `jax_mxfp8_attention_bwd`, attributes
`kernel` (the registry variant's name), `scale` (tau) and `dq_scale_log2` (e of dq_accum "fp16", 0 for
"fp32"); the kernel is jax_mxfp8/kernels/sm90/attention_bwd.py (variants: AttentionBwdConfig in
kernels/registry/attention_bwd.py; the dQ modes in attention_bwd_dq.py), its handler csrc/attention_bwd.cc.
Shapes (Tp = T, Sp = S rounded up to 128; N = K * G):
  q, do (B, N, Tp, H) bfloat16; k, v (B, K, Sp, H) bfloat16; lse, delta (B, N, Tp) float32; lens (2, B) int32
  -> the call's dq (B, N, Tp, H) float32 (dq_accum "fp16": float16 holding dQ * 2^e), dk, dv (B, K, Sp, H)
  float32 (dk, dv summed over each KV head's G query heads), dq_sem (B, N, Tp / 32) int32 (the
  deterministic variants' counters; garbage for the others). attention_bwd returns dq / 2^e in float32.
sdp_fp8 variants (production; S^T and dP^T on FP8 wgmma): target `jax_mxfp8_attention_bwd_fp8` with operands
(q, k, v8, do, lse, delta, lens, q8, k8, do8, qs, ks, vs, dos): the FP8 copies (float8_e4m3fn, shapes of q, k,
v, do) re-encoded to one exponent per 32 rows and their row factors qs, dos (B, N, Tp/32), ks, vs (B, K,
Sp/32) float32 (qs includes tau log2(e)); its emulation is the plain one on V = v8 2^eV.
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
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import dequantize
from jax_mxfp8.formats.scales import mul_pow2
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives.attention_emulation import p_options
from jax_mxfp8.primitives.attention_layout import LOG2E, TILE_M, TILE_N, round_up
from jax_mxfp8.primitives.attention_operands import (
    aligned_rows,
    do_float16,
    do_float16_scales,
    do_shift,
    head_major_scale,
    shift_per_query_head,
)
from jax_mxfp8.primitives.attention_packed import sequence_windows
from jax_mxfp8.primitives.attention_realign import realign
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule
from jax_mxfp8.primitives.quantize import DEQUANTIZE
from jax_mxfp8.reference.attention_bwd import attention_bwd_quantized, bwd_delta
from jax_mxfp8.reference.attention_tiling import Masking
from jax_mxfp8.reference.varlen import aligned_owner

TARGET = "jax_mxfp8_attention_bwd"
TARGET_FP8 = TARGET + "_fp8"  # the sdp_fp8 variants' call
# the dequantize variants of the pre-pass's 16-bit operands: bfloat16, and the dv_f16 variants' float16 dO (its
# name marks a library built since dv_f16)
_DEQUANTIZE = {
    dt: registry.find(registry.DequantizeConfig, elem_dtype="float8_e4m3fn", block="square", out_dtype=dt)
    for dt in ("bfloat16", "float16")
}
DO_F16_DEQUANTIZE = _DEQUANTIZE["float16"].name
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


# -------------------------------------------------------------------------------------------- the pre-pass
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SdpFp8Operands:
    """The sdp_fp8 variants' extra inputs: Q, K, V, dO re-encoded to FP8 with one exponent per 32 rows
    (attention_operands.aligned_rows, the forward's Q / K encoding) for S^T = K Q^T and dP^T = V dO^T."""

    q8: jax.Array  # (B, N, Tp, H) float8_e4m3fn
    k8: jax.Array  # (B, K, Sp, H) float8_e4m3fn
    v8: jax.Array  # (B, K, Sp, H) float8_e4m3fn
    do8: jax.Array  # (B, N, Tp, H) float8_e4m3fn
    qs: jax.Array  # (B, N, Tp/32) float32 tau log2(e) 2^eQ (NaN for a row block holding a NaN block)
    ks: jax.Array  # (B, K, Sp/32) float32 2^eK
    vs: jax.Array  # (B, K, Sp/32) float32 2^eV
    dos: jax.Array  # (B, N, Tp/32) float32 2^edO


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BwdOperands:
    """The backward kernel's inputs (module docstring: shapes and dtypes)."""

    q: jax.Array  # (B, N, Tp, H) bfloat16 Q^, rows >= q_len and padding 0
    k: jax.Array  # (B, K, Sp, H) bfloat16 K^, rows >= kv_len 0
    v: jax.Array | None  # (B, K, Sp, H) bfloat16 V^, rows >= kv_len 0 (None with fp8: V only as fp8.v8)
    do: jax.Array  # (B, N, Tp, H) bfloat16 dO^ (rows >= q_len zeroed before the square quantization); dv_f16: float16
    lse: jax.Array  # (B, N, Tp) float32, -inf on rows >= q_len and padding
    delta: jax.Array  # (B, N, Tp) float32 rowsum(dO * O) - dLSE, 0 on padding rows
    lens: jax.Array  # (2, B) int32 query lengths, KV lengths (packed variants: (4, Sp / 128) packed_tile_table)
    fp8: SdpFp8Operands | None = None  # the sdp_fp8 variants' FP8 copies (None for the others)
    # dv_f16 variants: do is float16 dO^ 2^-do_shift[b, n // G] (attention_operands.do_float16), (B, K) int32,
    # do_shift(fp8.dos, N // K) as bwd_operands makes it (the call's emulation recomputes it from dos)
    do_shift: jax.Array | None = None

    def args(self) -> tuple[jax.Array, ...]:
        """The plain call's operands (q, k, v, do, lse, delta, lens)."""
        return (self.q, self.k, self.v, self.do, self.lse, self.delta, self.lens)

    def fp8_args(self) -> tuple[jax.Array, ...]:
        """The sdp_fp8 call's operands (q, k, v8, do, lse, delta, lens, q8, k8, do8, qs, ks, vs, dos)."""
        f = self.fp8
        head = (self.q, self.k, f.v8, self.do, self.lse, self.delta, self.lens)
        return head + (f.q8, f.k8, f.do8, f.qs, f.ks, f.vs, f.dos)


def _keep_rows(length: int, lengths: jax.Array | None) -> jax.Array | None:
    """(B, L) bool: position < lengths[b] (None: every position)."""
    if lengths is None:
        return None
    return jnp.arange(length, dtype=jnp.int32)[None, :] < lengths[:, None]


def _head_major(x: jax.Array, keep: jax.Array | None, padded: int, fill=0.0) -> jax.Array:
    """(B, L, N, ...) -> (B, N, Lp, ...): rows where `keep` is False set to `fill`, padded with `fill`."""
    if keep is not None:
        k = keep.reshape(keep.shape + (1,) * (x.ndim - 2))
        x = jnp.where(k, x, jnp.asarray(fill, x.dtype))
    x = jnp.swapaxes(x, 1, 2)
    widths = [(0, 0)] * x.ndim
    widths[2] = (0, padded - x.shape[2])
    return jnp.pad(x, widths, constant_values=fill)


def _operand(x: MXArray, keep, padded: int, path: str | None = None, f16=None) -> jax.Array:
    """A sequence-major square MXArray (B, L, N, H) -> bfloat16 (B, N, Lp, H) (f16: float16), zero rows past the lengths
    (zeroed after dequantization, as the reference does, so no NaN block scale past them reaches a GEMM).

    path None: in XLA (dequantize, transpose and pad in one program). "cuda" / "emulated": the FP8 bytes
    moved head-major by the realign call with zero shifts (exact, zero-padded to Lp), then the dequantize call
    on the head-major square blocks, the same values: on the H200 XLA's version ran as two fusions per operand
    (a per-element predicate, then a transposing bit-level decode: 0.109 ms at B4 T4k N16 H128,
    benchmarks/results/h200_profile_attention_step.json), the two calls are copy-speed kernels.
    f16: (dos, shift) for the dv_f16 variants' dO: float16 dO^ 2^-shift (attention_operands.do_float16's values;
    on a kernel path the dequantize call writes them from lowered scale bytes, do_float16_scales)."""
    b, length, n, h = x.shape
    if path is None:
        out = _head_major(dequantize(x, jnp.bfloat16), None, padded)
        out = out if f16 is None else do_float16(out, *f16)
    else:
        zero = jnp.zeros((b, length // 32, n, h // 32), jnp.int8)
        data = realign(x.data, zero, "rows", path)  # (B, N, Lp, H)
        scale, out_dtype = head_major_scale(x, padded), "bfloat16"
        if f16 is not None:
            scale, out_dtype = do_float16_scales(scale, *f16), "float16"
        out = DEQUANTIZE.call(_DEQUANTIZE[out_dtype], path, data, scale)
    if keep is None:
        return out
    keep_hm = jnp.pad(keep, [(0, 0), (0, padded - length)])[:, None, :, None]
    return jnp.where(keep_hm, out, jnp.zeros((), out.dtype))


def bwd_operands(
    q: MXArray,
    k: MXArray,
    v: MXArray,
    do_q: MXArray,
    do: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    dlse: jax.Array | None,
    *,
    q_len: jax.Array | None,
    kv_len: jax.Array | None,
    broadcast_q: bool = False,
    fp8_path: str | None = None,
    scale: float | None = None,
    path: str | None = None,
    do_f16: bool = False,
) -> BwdOperands:
    """The backward's pre-pass (XLA, or the realign + dequantize calls with `path`).

    Args:
      q: (B, T, N, H) square-block MXArray (blocks over (T, H), axes (-3, -1)), the forward's residual.
      k, v: (B, S, K, H) likewise.
      do_q: dO quantized the same way (square blocks over (T, H)) after zeroing rows >= q_len (the caller
        quantizes: ops/attention_bwd_kernel.py, with the CUDA square quantize where the forward ran it).
      do: (B, T, N, H) the unquantized output cotangent; o: (B, T, N, H) the forward's output.
      lse: (B, N, T) float32, the forward's LSE; dlse: its cotangent (B, N, T) or None.
      q_len, kv_len: (B,) int32 or None (= T, S).
      broadcast_q: q (and nothing else) has batch 1, one query sequence for all B rows; q_len must then be
        the same for every row (its first entry zeroes q's rows). The operands' q keeps batch 1.
      path: None (default): the bfloat16 operands in XLA; "cuda" / "emulated": through the realign and
        dequantize calls on that path (the same values; see _operand).
      fp8_path: make the sdp_fp8 variants' FP8 copies (SdpFp8Operands) through the realign call on this path
        ("cuda" or "emulated") instead of the bfloat16 v (those variants read V only as v8); scale (tau,
        folded into qs) is then required. Not with broadcast_q. The copies are made from q, k, v, do_q as
        given (not masked by the lengths): their data and scales past the lengths must already be zero, as
        ops/attention_core.py's kernel_operand and square_sequence_major leave them (a NaN scale there would
        make the whole 32-row factor NaN).
      do_f16: the dv_f16 variants' do: float16 dO^ 2^-shift with one shift per (batch, KV head) from dO's
        row factors (attention_operands.do_shift / do_float16; BwdOperands.do_shift). Needs fp8_path.
    """
    if do_f16 and fp8_path is None:
        raise ValueError("do_f16=True needs fp8_path (the shift comes from dO's FP8 row factors)")
    _, t, n, h = q.shape
    b = do.shape[0]
    s = k.shape[1]
    tp, sp = round_up(t, TILE_M), round_up(s, TILE_N)
    keep_q, keep_k = _keep_rows(t, q_len), _keep_rows(s, kv_len)
    do_f = do.astype(jnp.float32)
    if keep_q is not None:
        do_f = jnp.where(keep_q[:, :, None, None], do_f, 0.0)
    delta = bwd_delta(do_f, o, None if dlse is None else jnp.swapaxes(dlse, 1, 2))  # (B, T, N)
    lse_rows = lse if keep_q is None else jnp.where(keep_q[:, None, :], lse, -jnp.inf)
    lse_p = jnp.pad(lse_rows.astype(jnp.float32), [(0, 0), (0, 0), (0, tp - t)], constant_values=-jnp.inf)
    ql = jnp.full((b,), t, jnp.int32) if q_len is None else q_len.astype(jnp.int32)
    kl = jnp.full((b,), s, jnp.int32) if kv_len is None else kv_len.astype(jnp.int32)
    fp8 = None
    if fp8_path is not None:
        if scale is None or broadcast_q:
            raise ValueError("fp8_path needs scale (tau) and broadcast_q=False")
        q8, qs = aligned_rows(q, tp, fp8_path, float(np.float32(scale * LOG2E)))
        k8, ks = aligned_rows(k, sp, fp8_path)
        v8, vs = aligned_rows(v, sp, fp8_path)
        do8, dos = aligned_rows(do_q, tp, fp8_path)
        fp8 = SdpFp8Operands(q8=q8, k8=k8, v8=v8, do8=do8, qs=qs, ks=ks, vs=vs, dos=dos)
    shift = do_shift(fp8.dos, n // k.shape[2]) if do_f16 else None
    do_op = _operand(do_q, keep_q, tp, path, None if shift is None else (fp8.dos, shift))
    return BwdOperands(
        fp8=fp8,
        do_shift=shift,
        q=_operand(q, keep_q[:1] if broadcast_q and keep_q is not None else keep_q, tp, path),
        k=_operand(k, keep_k, sp, path),
        v=None if fp8 is not None else _operand(v, keep_k, sp, path),
        do=do_op,
        lse=lse_p,
        delta=_head_major(delta, None, tp),
        lens=jnp.stack([ql, kl]),
    )


# ------------------------------------------------------------------------------------------ the emulation
def packed_tile_table(
    q_len: jax.Array, kv_len: jax.Array, q_start: jax.Array, kv_start: jax.Array, kv_rows: int
) -> jax.Array:
    """The packed variants' lens operand: (4, kv_rows / 128) int32, per key tile of the aligned packed layout
    (every sequence from a 128-row tile; ops/varlen_kernel.py) its sequence's first query row, query end row,
    KV end row and first KV row; zeros for tiles in no sequence (the kernel then writes their dk, dv rows 0)."""
    tile0 = jnp.arange(kv_rows // TILE_N, dtype=jnp.int32) * TILE_N
    seq = aligned_owner(kv_start, tile0)
    live = (tile0 >= kv_start[seq]) & (tile0 < kv_start[seq] + kv_len[seq])
    rows = (q_start[seq], q_start[seq] + q_len[seq], kv_start[seq] + kv_len[seq], kv_start[seq])
    return jnp.stack([jnp.where(live, x, 0) for x in rows]).astype(jnp.int32)


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
    """emulate_bwd of a packed call (B = 1, lens = packed_tile_table): every sequence alone, as the kernel's
    CTAs see it (a key tile reads only its sequence's query rows): the sequence starting at key tile w becomes
    batch row w of a dense emulation (windows of its rows, zeros after its lengths; rows for tiles that start
    no sequence are empty), and the gradients go back to their rows."""
    table = ops.lens
    tp, sp = ops.q.shape[2], ops.k.shape[2]
    tile0 = jnp.arange(table.shape[1], dtype=jnp.int32) * TILE_N
    first = (table[3] == tile0) & (table[2] > table[3])  # this key tile starts a sequence with keys
    q0, kv0 = table[0], table[3]
    q_len = jnp.where(first, table[1] - table[0], 0)
    kv_len = jnp.where(first, table[2] - table[3], 0)
    # each sequence's whole tiles (the rows past its length in its last tile are its own padding, masked by
    # the lengths), zeros after them
    wq = lambda x: None if x is None else sequence_windows(x, q0 // TILE_N, -(-q_len // TILE_N), 2)
    wk = lambda x: None if x is None else sequence_windows(x, kv0 // TILE_N, -(-kv_len // TILE_N), 2)
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
    packed_tile_table (_emulate_packed: each sequence alone, as the kernel's CTAs see it)."""
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
    element below E4M3's normal range (measured in tests/test_attention_bwd_kernel_gpu.py). dv_f16 variants:
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
    lens = "l x" if call.variant.packed else "l b"  # packed: the (4, Sp / 128) key-tile table, never sharded
    return ShardingRule(
        operands=(f"{qb} {n} t h", "b k s h", "b k s h", f"b {n} t h", f"b {n} t", f"b {n} t", lens),
        results=(f"{qb} {n} t h", "b k s h", "b k s h", f"b {n} u"),
        factor_sizes=sizes,
        replicated=("a", "g", "t", "h", "s", "l", "u", "x"),
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
    rule = _sharding(call)
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

ATTENTION_BWD_PACKED_FP8 = dataclasses.replace(ATTENTION_BWD_FP8, batch_dims=None, result_batch_dims=None)
"""The FP8 target for the packed variants (B = 1 holds every sequence; lens is the key-tile table): vmap maps
the call over the axis."""


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
    if variant.packed != (ops.lens.shape[0] == 4) or (variant.packed and not variant.sdp_fp8):
        raise ValueError(
            f"variant {variant.name} takes lens {'(4, Sp / 128): packed_tile_table' if variant.packed else '(2, B)'}"
            f" (and packed variants the FP8 operands); got lens {ops.lens.shape}"
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
        op, args = (ATTENTION_BWD_PACKED_FP8 if variant.packed else ATTENTION_BWD_FP8), ops.fp8_args()
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
