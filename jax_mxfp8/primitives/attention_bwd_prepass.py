"""The Hopper attention backward kernel's operands and their pre-pass (layer 5; the call itself is
primitives/attention_bwd.py, which re-exports these names).

  BwdOperands, SdpFp8Operands   the kernel's inputs (shapes, dtypes and layouts: docs/interfaces.md)
  PackedTables                  the packed variants' length operands (seqs, work)
  CausalPackedTables            the same, work list longest first (the causal packed variants)
  packed_tile_table(q_len, kv_len, q_start, kv_start, kv_rows, *, causal) -> PackedTables
  bwd_operands(q, k, v, do_q, do, o, lse, dlse, *, q_len, kv_len, ...) -> BwdOperands   the pre-pass
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import dequantize
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives.attention_layout import LOG2E, TILE_M, TILE_N, round_up
from jax_mxfp8.primitives.attention_operands import (
    aligned_rows,
    do_float16,
    do_float16_scales,
    do_shift,
    head_major_scale,
)
from jax_mxfp8.primitives.attention_packed import key_tile_work, sequence_table, tile_work
from jax_mxfp8.primitives.attention_realign import realign
from jax_mxfp8.primitives.quantize import DEQUANTIZE
from jax_mxfp8.reference.attention_bwd import bwd_delta

# the dequantize variants of the pre-pass's 16-bit operands: bfloat16, and the dv_f16 variants' float16 dO (its
# name marks a library built since dv_f16)
_DEQUANTIZE = {
    dt: registry.find(registry.DequantizeConfig, elem_dtype="float8_e4m3fn", block="square", out_dtype=dt)
    for dt in ("bfloat16", "float16")
}
DO_F16_DEQUANTIZE = _DEQUANTIZE["float16"].name


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
    lens: jax.Array | PackedTables  # (2, B) int32 query lengths, KV lengths (packed variants: PackedTables)
    fp8: SdpFp8Operands | None = None  # the sdp_fp8 variants' FP8 copies (None for the others)
    # dv_f16 variants: do is float16 dO^ 2^-do_shift[b, n // G] (attention_operands.do_float16), (B, K) int32,
    # do_shift(fp8.dos, N // K) as bwd_operands makes it (the call's emulation recomputes it from dos)
    do_shift: jax.Array | None = None

    def tables(self) -> tuple[jax.Array, ...]:
        """The length operands: (lens,), or for the packed variants (seqs, work)."""
        return tuple(self.lens) if isinstance(self.lens, PackedTables) else (self.lens,)

    def args(self) -> tuple[jax.Array, ...]:
        """The plain call's operands (q, k, v, do, lse, delta, lens)."""
        return (self.q, self.k, self.v, self.do, self.lse, self.delta, *self.tables())

    def fp8_args(self) -> tuple[jax.Array, ...]:
        """The sdp_fp8 call's operands (q, k, v8, do, lse, delta, lens, q8, k8, do8, qs, ks, vs, dos); packed:
        seqs, work in lens' place."""
        f = self.fp8
        head = (self.q, self.k, f.v8, self.do, self.lse, self.delta, *self.tables())
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
        ops/attention.py's kernel_operand and square_sequence_major leave them (a NaN scale there would
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


class PackedTables(NamedTuple):
    """The packed variants' length operands (B = 1, the aligned packed layout): the packed kernels' one
    sequence encoding, shared with the forward (primitives/attention_packed.py)."""

    seqs: jax.Array  # (4, S) int32 per sequence: first query tile, first KV tile, query length, KV length
    # (2, Sp / 128) int32 per key tile: (its sequence, key tile in it), (-1, 0) for none; causal: longest first,
    # (-1, key tile) for none
    work: jax.Array


class CausalPackedTables(PackedTables):
    """PackedTables whose work list holds the key tiles longest first (key_tile_work): what the causal packed
    variants decode. The type carries the order, so a kernel call can refuse a table of the other order (a
    non-causal list would zero the wrong rows: its padding items name no key tile)."""

    __slots__ = ()


def packed_tile_table(
    q_len: jax.Array, kv_len: jax.Array, q_start: jax.Array, kv_start: jax.Array, kv_rows: int, *, causal: bool
) -> PackedTables:
    """The packed variants' PackedTables for S sequences laid out from rows q_start / kv_start (multiples of
    128) in an aligned packed layout of kv_rows key rows: the forward's seqs table and a work list of every
    key tile (a tile in no sequence gets its dk, dv rows 0). Non-causal: item n is key tile n (tile_work);
    causal (for the causal variants only): the key tiles longest first (key_tile_work), as CausalPackedTables."""
    seqs = sequence_table(q_len, kv_len, q_start, kv_start)
    if causal:
        return CausalPackedTables(seqs, key_tile_work(q_len, kv_len, kv_start, kv_rows))
    return PackedTables(seqs, tile_work(kv_len, kv_start, kv_rows))
