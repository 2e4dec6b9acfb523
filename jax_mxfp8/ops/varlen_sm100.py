"""varlen_attention's Blackwell kernel path (compute capability 10.0 / 10.3): packed sequences, FP8 data compact.

Forward: each operand is quantized per sequence in 32x32 blocks restarting at its start (a partial last block
scaled from its valid rows), its E4M3 data written back in packed order (compact: no padding between sequences)
and its scale bytes padded per sequence to whole 128-row chunks (split addressing;
primitives/attention_sm100_packed.pack_operand); the packed kernel variant runs over the tables of
attention_sm100_packed.packed_tables (a work list of 256-row query pairs, longest first). A sequence longer than
max_seqlen (possible only with traced offsets) is truncated to it, as on the Hopper path: its rows past max_seqlen
are zeroed before quantizing and the tables give the kernel the truncated lengths.

Backward: the packed variant of the Blackwell backward (ops/attention_bwd_sm100.py) on the residuals (the packed
operands, which carry both orientations' scale bytes for it, O, LSE) and the same tables: the packed pre-pass
(dO quantized per sequence, Delta), then the backward over the key-tile work list. Where no packed variant
covers the call (p_scale "block", the dQ modes) the residuals are read back into the padded (B, max_seqlen)
batch that dot_product_attention's backward takes (the same 32x32 blocks and bytes:
ops/attention_sm100.square_mx), whose backward is the dense sm100 one, or the XLA reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.ops.attention import mx_attention_bwd
from jax_mxfp8.ops.attention_bwd_sm100 import sm100_backward_variant
from jax_mxfp8.ops.attention_core import operand_keys
from jax_mxfp8.ops.attention_sm100 import square_mx
from jax_mxfp8.ops.cotangents import remat_safe
from jax_mxfp8.ops.no_second_order import guard_bwd, guard_fwd
from jax_mxfp8.ops.varlen_kernel import VarlenStatic
from jax_mxfp8.primitives import attention_bwd_sm100 as bwd_kernel
from jax_mxfp8.primitives import attention_fwd_sm100 as kernel
from jax_mxfp8.primitives.attention_packed import query_work
from jax_mxfp8.primitives.attention_sm100_operands import TILE
from jax_mxfp8.primitives.attention_sm100_packed import ITEM_ROWS, chunk_starts, pack_operand, packed_tables
from jax_mxfp8.primitives.attention_sm100_packed import window_operand as _window_operand
from jax_mxfp8.reference.attention_tiling import round_up
from jax_mxfp8.reference.varlen import seq_lengths, to_packed, to_padded


def _owner(cu: jax.Array, total: int) -> tuple[jax.Array, jax.Array]:
    """(T_total,) the sequence holding each packed row (n_seq for rows after the last) and its position in it."""
    p = jnp.arange(total, dtype=jnp.int32)
    s = jnp.searchsorted(cu[1:], p, side="right").astype(jnp.int32)
    return s, p - cu[jnp.clip(s, 0, cu.shape[0] - 2)]


def _in_sequence(cu: jax.Array, lengths: jax.Array, total: int) -> jax.Array:
    """(T_total,) bool: the row lies in a sequence, within its (truncated) length."""
    s, pos = _owner(cu, total)
    n_seq = lengths.shape[0]
    return (s < n_seq) & (pos >= 0) & (pos < lengths[jnp.clip(s, 0, n_seq - 1)])


def _n_chunks(total: int, n_seq: int) -> int:
    """A static bound on sum_s ceil(L_s / 128) for n_seq sequences of total <= `total` rows (the offsets' own
    lengths: a sequence longer than max_seqlen keeps its chunks, so that no table points past the scales)."""
    return total // TILE + n_seq


def _pack(st: VarlenStatic, x: jax.Array, cu: jax.Array, lengths: jax.Array, max_len: int, orientations):
    """Packed (T_total, heads, H) float -> the packed Sm100Operand (batch 1) with these orientations' scales; rows
    past a sequence's (truncated) length zeroed first."""
    keep = _in_sequence(cu, lengths, x.shape[0])[:, None, None]
    x = jnp.where(keep, x, jnp.zeros((), x.dtype))[None]
    n_chunks = _n_chunks(x.shape[1], lengths.shape[0])
    return pack_operand(
        x, cu, chunk_starts(cu[1:] - cu[:-1]), max_len=max_len, n_chunks=n_chunks, orientations=orientations,
        scale_rounding=st.dense.config.scale_rounding,
    )  # fmt: skip


def _tables(st: VarlenStatic, cu_q, cu_k, len_q, len_k, n_chunks_q: int, n_chunks_k: int):
    """packed_tables with the truncated lengths in the sequence table and the work list built from them."""
    t = packed_tables(cu_q, cu_k, causal=st.dense.is_causal, n_chunks_q=n_chunks_q, n_chunks_k=n_chunks_k)
    seqs = t.seqs.at[2].set(len_q).at[3].set(len_k)
    work = query_work(
        len_q, len_k, t.seqs[0] * TILE, causal=st.dense.is_causal, q_rows=n_chunks_q * TILE, item_rows=ITEM_ROWS
    )
    return t._replace(seqs=seqs, work=work)


def _forward(st: VarlenStatic, q, k, v, cu_q, cu_k):
    len_q, len_k = seq_lengths(cu_q, st.max_q), seq_lengths(cu_k, st.max_k)
    both = ("hd", "seq")  # the forward reads q, k "hd" and v "seq"; the backward q, k "seq" and v "hd" as well
    qo = _pack(st, q, cu_q, len_q, st.max_q, both)
    ko = _pack(st, k, cu_k, len_k, st.max_k, both)
    vo = _pack(st, v, cu_k, len_k, st.max_k, both)
    tables = _tables(st, cu_q, cu_k, len_q, len_k, qo.sf_hd.shape[2], ko.sf_hd.shape[2])
    cfg = st.dense.config
    o, lse = kernel.attention_fwd_sm100_packed(
        qo, ko, vo, tables, causal=st.dense.is_causal, scale=st.dense.scale, max_len_q=st.max_q,
        max_len_k=st.max_k, p_scale=cfg.p_scale, p_rounding=cfg.scale_rounding, path=st.dense.impl,
    )  # fmt: skip
    inside = _in_sequence(cu_q, len_q, st.total_q)  # the kernel writes the sequences' rows only
    o = jnp.where(inside[:, None, None], o[0], 0.0).astype(st.dense.out_dtype)
    lse = jnp.where(inside[None, :], lse[0], -jnp.inf)
    return o, (qo, ko, vo, o, lse, cu_q, cu_k)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def packed_sm100_attention(st: VarlenStatic, q, k, v, cu_q, cu_k) -> jax.Array:
    """(T_total_q, N, H), (T_total_k, K, H) x2, (B + 1,) offsets x2 -> (T_total_q, N, H) in q's dtype."""
    return _forward(st, q, k, v, cu_q, cu_k)[0]


def _padded_mx(op, cu: jax.Array, max_len: int, padded_len: int) -> MXArray:
    """A packed Sm100Operand -> the (B, padded_len, heads, H) square MXArray of its sequences' windows."""
    dense = _window_operand(op, cu, chunk_starts(cu[1:] - cu[:-1]), max_len=max_len)
    x = square_mx(dense)
    return MXArray(x.data[:, :padded_len], x.scale[:, : padded_len // BLOCK_SIZE], x.axes, x.block)


def _packed_backward(st: VarlenStatic, variant, res, do):
    """The packed sm100 pre-pass and backward on the residuals: (dq, dk, dv) packed rows in the output dtype."""
    qo, ko, vo, o, lse, cu_q, cu_k = res
    len_q, len_k = seq_lengths(cu_q, st.max_q), seq_lengths(cu_k, st.max_k)
    tables = _tables(st, cu_q, cu_k, len_q, len_k, qo.sf_hd.shape[2], ko.sf_hd.shape[2])
    path, lse_p = st.dense.impl, lse[None]
    do_op, delta = bwd_kernel.bwd_prepass_sm100(
        do.astype(o.dtype)[None], o[None], jnp.zeros(lse_p.shape, jnp.float32), tables, path=path, max_len_q=st.max_q
    )  # fmt: skip
    dq, dk, dv = bwd_kernel.attention_bwd_sm100(
        qo, ko, vo, do_op, lse_p, delta, tables, variant=variant, scale=st.dense.scale, path=path,
        max_len_q=st.max_q, max_len_k=st.max_k,
    )  # fmt: skip
    out = st.dense.out_dtype
    return dq[0].astype(out), dk[0].astype(out), dv[0].astype(out)


def _bwd(st: VarlenStatic, res, do):
    variant = sm100_backward_variant(st.dense, res[3].shape[-1], packed=True)
    if variant is not None:
        return (*_packed_backward(st, variant, res, do), None, None)
    qo, ko, vo, o, lse, cu_q, cu_k = res
    len_q, len_k = seq_lengths(cu_q, st.max_q), seq_lengths(cu_k, st.max_k)
    pq, pk = round_up(st.max_q, BLOCK_SIZE), round_up(st.max_k, BLOCK_SIZE)
    padded = {"q": _padded_mx(qo, cu_q, st.max_q, pq), "k": _padded_mx(ko, cu_k, st.max_k, pk)}
    padded["v"] = _padded_mx(vo, cu_k, st.max_k, pk)
    quants = {key: padded[key[0]] for key in set(operand_keys(st.dense).values())}
    o_p = to_padded(o, cu_q, len_q, pq)  # (B, pq, N, H)
    valid = jnp.arange(pq)[None, :] < len_q[:, None]
    lse_p = jnp.where(valid[:, None, :], to_padded(lse.T, cu_q, len_q, pq).transpose(0, 2, 1), -jnp.inf)
    res_dense = (quants, o_p, lse_p, None, None, len_q, len_k)
    do_p = to_padded(do, cu_q, len_q, pq)
    dq, dk, dv, *_ = mx_attention_bwd(st.dense, res_dense, (do_p, jnp.zeros_like(lse_p)))
    return (
        to_packed(dq, cu_q, len_q, st.total_q),
        to_packed(dk, cu_k, len_k, st.total_k),
        to_packed(dv, cu_k, len_k, st.total_k),
        None,
        None,
    )


packed_sm100_attention.defvjp(  # FP8 residuals as bits (ops/cotangents.py: remat)
    *remat_safe(guard_fwd(_forward, "varlen_attention", argnums=(1, 2, 3)), guard_bwd(_bwd, "varlen_attention"))
)
