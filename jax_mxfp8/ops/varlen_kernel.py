"""varlen_attention's Hopper kernel path: packed sequences whose FP8 data stays packed.

Forward: the packed (T_total, N, H) inputs are moved to the *aligned packed* layout (packed order, every
sequence starting on a 128-row tile, at most 127 zero rows after each; reference/varlen.py), quantized
there in 32x32 blocks (which therefore restart at every sequence start, as the contract's per-sequence
blocks do), re-encoded by the producer pass with V's exponent spread bounded per sequence, and run by the
packed kernel variant over a work list of (sequence, query tile) items, longest first
(primitives/attention_packed.py packed_tables). Nothing is padded to max_seqlen: the FP8 operands hold
sum_b ceil128(L_b) rows, the scales one per 32-row block of those rows.

Backward: the packed backward kernel variant (registry PACKED; primitives/attention_bwd.packed_tile_table) runs
on the aligned residuals themselves, one CTA per (key tile, KV head), on the forward's packed encoding (the seqs
table and a key-tile work list; ops/attention_bwd_kernel.packed_variant). Where no packed variant covers the
call (p_scale "block", the dQ modes, a library built before it), the residuals (aligned MX operands, O, LSE) are
gathered into the padded (B, max_seqlen) batch that dot_product_attention's backward takes; the MX blocks are
the same blocks (both layouts start every sequence on a block boundary and hold zeros past its end), so the
gradients equal those of the dense path on the padded batch (ops/varlen_attention.py's XLA route) given the same
forward residuals. That backward runs the backward kernel with the sequence lengths where a variant covers the
call (ops/attention_bwd_kernel.py), else the reference.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.ops.attention import mx_attention_bwd
from jax_mxfp8.ops.attention_core import AttentionStatic, operand_keys, square_sequence_major
from jax_mxfp8.ops.cotangents import remat_safe
from jax_mxfp8.ops.no_second_order import guard_bwd, guard_fwd
from jax_mxfp8.primitives import attention_fwd as attention_kernel
from jax_mxfp8.primitives.attention_bwd import packed_tile_table
from jax_mxfp8.primitives.attention_layout import TILE_M
from jax_mxfp8.primitives.attention_operands import prepare_sequence_major
from jax_mxfp8.primitives.attention_packed import packed_tables
from jax_mxfp8.reference.attention_tiling import round_up
from jax_mxfp8.reference.varlen import (
    aligned_owner,
    aligned_rows,
    aligned_starts,
    aligned_to_packed,
    aligned_to_padded,
    seq_lengths,
    to_aligned,
    to_packed,
    to_padded,
)

TILE = TILE_M  # sequences start on multiples of the kernel's 128-row tiles


@dataclasses.dataclass(frozen=True)
class VarlenStatic:
    """Trace-time facts of one packed call: the dense op's facts (config, scale, causal, dtype, group), the
    static maximum lengths and the packed row counts."""

    dense: AttentionStatic
    max_q: int
    max_k: int
    total_q: int  # T_total_q
    total_k: int  # T_total_k


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where each sequence sits in the aligned packed layout of one operand."""

    lengths: jax.Array  # (B,) int32
    starts: jax.Array  # (B,) int32, multiples of TILE
    rows: int  # static row count of the layout


def _layout(cu: jax.Array, total: int, max_len: int) -> _Layout:
    lengths = seq_lengths(cu, max_len)
    return _Layout(lengths, aligned_starts(lengths, TILE), aligned_rows(total, lengths.shape[0], max_len, TILE))


def _square_aligned(x: jax.Array, cu: jax.Array, lay: _Layout, scale_rounding: str, path: str) -> MXArray:
    """Packed (T_total, N, H) -> (1, rows, N, H) square-block MXArray in the aligned layout."""
    return square_sequence_major(to_aligned(x, cu, lay.lengths, lay.starts, lay.rows)[None], None, scale_rounding, path)


def prepare_packed(st: VarlenStatic, q, k, v, cu_q, cu_k):
    """The packed path's producer: aligned square MX operands and the kernel's inputs.

    Returns (qm, km, vm) (1, rows, heads, H) MXArrays, the kernel operands (AlignedOperands with lens = the
    seqs table), the work list and the query layout.
    """
    lq, lk = _layout(cu_q, st.total_q, st.max_q), _layout(cu_k, st.total_k, st.max_k)
    rounding, path = st.dense.config.scale_rounding, st.dense.impl
    qm = _square_aligned(q, cu_q, lq, rounding, path)
    km, vm = _square_aligned(k, cu_k, lk, rounding, path), _square_aligned(v, cu_k, lk, rounding, path)
    kv_tiles = jnp.arange(lk.rows // TILE, dtype=jnp.int32) * TILE
    kv_tile_seq = aligned_owner(lk.starts, kv_tiles)
    ops = prepare_sequence_major(
        qm, km, vm, scale=st.dense.scale, q_len=None, kv_len=None, kv_tile_seq=kv_tile_seq, path=path
    )
    seqs, work = packed_tables(lq.lengths, lk.lengths, lq.starts, lk.starts, causal=st.dense.is_causal, q_rows=lq.rows)
    return (qm, km, vm), dataclasses.replace(ops, lens=seqs), work, lq


def _kernel_forward(st: VarlenStatic, q, k, v, cu_q, cu_k):
    (qm, km, vm), ops, work, lq = prepare_packed(st, q, k, v, cu_q, cu_k)
    config = st.dense.config
    o_al, lse_al = attention_kernel.attention_fwd_packed(
        ops,
        work,
        causal=st.dense.is_causal,
        p_scale=config.p_scale,
        p_rounding=config.scale_rounding,
        path=st.dense.impl,
    )
    o = aligned_to_packed(o_al[0], cu_q, lq.lengths, lq.starts, st.total_q).astype(st.dense.out_dtype)
    return o, (qm, km, vm, o_al, lse_al, cu_q, cu_k)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def packed_kernel_attention(st: VarlenStatic, q, k, v, cu_q, cu_k) -> jax.Array:
    """(T_total_q, N, H), (T_total_k, K, H) x2, (B + 1,) offsets x2 -> (T_total_q, N, H) in q's dtype."""
    return _kernel_forward(st, q, k, v, cu_q, cu_k)[0]


def _padded_mx(x: MXArray, lay: _Layout, padded_len: int) -> MXArray:
    """(1, rows, N, H) aligned MXArray -> (B, padded_len, N, H): the same 32x32 blocks, zeros after each sequence."""
    data = aligned_to_padded(x.data[0], lay.starts, lay.lengths, padded_len)
    scale = aligned_to_padded(
        x.scale[0], lay.starts // BLOCK_SIZE, -(-lay.lengths // BLOCK_SIZE), padded_len // BLOCK_SIZE
    )
    return MXArray(data, scale, x.axes, x.block)


def _packed_bwd(st: VarlenStatic, variant, res, do):
    """The packed backward kernel on the aligned residuals (B = 1, lens the key-tile table); the packed
    cotangents (dq, dk, dv, None, None)."""
    qm, km, vm, o_al, lse_al, cu_q, cu_k = res
    lq, lk = _layout(cu_q, st.total_q, st.max_q), _layout(cu_k, st.total_k, st.max_k)
    keys = operand_keys(st.dense)
    aligned = {"q": qm, "k": km, "v": vm}
    quants = {key: aligned[key[0]] for key in set(keys.values())}
    res_al = (quants, o_al.astype(st.dense.out_dtype), lse_al, None, None, None, None)
    do_al = to_aligned(do, cu_q, lq.lengths, lq.starts, lq.rows)[None]  # (1, rows, N, H), zeros between sequences
    table = packed_tile_table(lq.lengths, lk.lengths, lq.starts, lk.starts, lk.rows, causal=st.dense.is_causal)
    dq, dk, dv, *_ = kbwd.kernel_backward(st.dense, variant, res_al, (do_al, jnp.zeros_like(lse_al)), tile_table=table)
    return (
        aligned_to_packed(dq[0], cu_q, lq.lengths, lq.starts, st.total_q),
        aligned_to_packed(dk[0], cu_k, lk.lengths, lk.starts, st.total_k),
        aligned_to_packed(dv[0], cu_k, lk.lengths, lk.starts, st.total_k),
        None,
        None,
    )


def _bwd(st: VarlenStatic, res, do):
    variant = kbwd.packed_variant(st.dense, do.shape[-1])
    if variant is not None:
        return _packed_bwd(st, variant, res, do)
    qm, km, vm, o_al, lse_al, cu_q, cu_k = res
    lq, lk = _layout(cu_q, st.total_q, st.max_q), _layout(cu_k, st.total_k, st.max_k)
    pq, pk = round_up(st.max_q, BLOCK_SIZE), round_up(st.max_k, BLOCK_SIZE)
    o = aligned_to_padded(o_al[0], lq.starts, lq.lengths, pq).astype(st.dense.out_dtype)  # (B, pq, N, H)
    lse = aligned_to_padded(lse_al[0].T, lq.starts, lq.lengths, pq, fill=-jnp.inf).transpose(0, 2, 1)  # (B, N, pq)
    keys = operand_keys(st.dense)
    padded = {"q": _padded_mx(qm, lq, pq), "k": _padded_mx(km, lk, pk), "v": _padded_mx(vm, lk, pk)}
    quants = {key: padded[key[0]] for key in set(keys.values())}
    res_dense = (quants, o, lse, None, None, lq.lengths, lk.lengths)
    do_p = to_padded(do, cu_q, lq.lengths, pq)
    dq, dk, dv, *_ = mx_attention_bwd(st.dense, res_dense, (do_p, jnp.zeros_like(lse)))
    return (
        to_packed(dq, cu_q, lq.lengths, st.total_q),
        to_packed(dk, cu_k, lk.lengths, st.total_k),
        to_packed(dv, cu_k, lk.lengths, st.total_k),
        None,
        None,
    )


packed_kernel_attention.defvjp(  # FP8 residuals as bits (ops/cotangents.py: remat)
    *remat_safe(guard_fwd(_kernel_forward, "varlen_attention", argnums=(1, 2, 3)), guard_bwd(_bwd, "varlen_attention"))
)
