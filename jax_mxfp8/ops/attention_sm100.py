"""The Blackwell (sm_100f: compute capability 10.0 and 10.3) forward of the attention ops' kernel path.

  dense_forward(static, q, k, v, q_len, kv_len, broadcast_q=False) -> (o (B, T, N, H), lse (B, N, T))
  square_mx(op) -> MXArray                     an Sm100Operand's square-block MXArray (the reference's residual)

The same dataflow as the Hopper path (ops/attention_core.fwd_kernel) from the same residuals: the sequence-major
square-block MXArrays (B, L, heads, H) (axes (-3, -1)) that quantize_operands made once. The kernel reads their
E4M3 data as it is (compact, no padding to 128 rows: its TMA boxes zero-fill past L) and each GEMM's scale bytes in
the tcgen05 128x4 layout: q and k in orientation "hd", v in "seq" (primitives/attention_sm100_operands.py: the
square byte repeated over its 32 rows). The producer kernel writes those bytes in the same pass that quantizes
(square_operand; the residuals keep its Sm100Operands next to the MXArrays, as "<operand>:sm100"); only a
caller's MXArray has its bytes laid out here in XLA. The forward kernel is
primitives/attention_fwd_sm100.py; packed jagged sequences: ops/varlen_sm100.py. The backward runs on the
residuals as on Hopper (the XLA reference where no Blackwell backward kernel covers the call).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mxfp8.formats.blocked_scales import from_blocked_scales
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.primitives import attention_fwd_sm100 as kernel
from jax_mxfp8.primitives import attention_operands_sm100 as producer
from jax_mxfp8.primitives.attention_sm100_operands import Sm100Operand, sm100_operand

ARCH = kernel.ARCHS[0]
FAMILIES = (producer.FAMILY, kernel.FAMILY)
"""The kernel families the Blackwell attention forward launches (each with a first-use self-test)."""


def lengths_table(q_len: jax.Array | None, kv_len: jax.Array | None, b: int, t: int, s: int) -> jax.Array:
    """(2, B) int32 query / key lengths (T, S where not given)."""
    q_len = jnp.full((b,), t, jnp.int32) if q_len is None else q_len.astype(jnp.int32)
    kv_len = jnp.full((b,), s, jnp.int32) if kv_len is None else kv_len.astype(jnp.int32)
    return jnp.stack([q_len, kv_len])


def square_operand(x: jax.Array, lengths: jax.Array | None, scale_rounding: str, path: str):
    """(B, L, heads, H) float -> (square-block MXArray (axes (-3, -1)), its Sm100Operand with both orientations'
    scale bytes), from one pass of the producer kernel (primitives/attention_operands_sm100.py; path "emulated":
    its emulation). Rows past `lengths` (B,) are zeroed first, as for the Hopper producer."""
    if lengths is not None:
        keep = jnp.arange(x.shape[1])[None, :] < lengths[:, None]
        x = jnp.where(keep[:, :, None, None], x, jnp.zeros((), x.dtype))
    return producer.attention_operands_sm100(x, scale_rounding=scale_rounding, path=path)


def _operand(x: MXArray | Sm100Operand, orientation: str) -> Sm100Operand:
    """The producer's operand as it is; a caller's MXArray with that orientation's bytes laid out in XLA."""
    return x if isinstance(x, Sm100Operand) else sm100_operand(x, (orientation,))


def dense_forward(static, q, k, v, q_len, kv_len, broadcast_q: bool = False):
    """The Blackwell forward kernel on q (B | 1, T, N, H), k and v (B, S, K, H): Sm100Operands from the producer
    (square_operand), or square-block MXArrays (a caller's; rows past the lengths zeroed by the caller, as for
    the Hopper kernel), whose blocked bytes are then laid out here. static: the op's AttentionStatic.
    broadcast_q: q holds one batch row for all of k's (q_len (B,) given). Returns o (B, T, N, H) in
    static.out_dtype and lse (B, N, T) float32."""
    cfg = static.config
    b, t, s = k.data.shape[0], q.data.shape[1], k.data.shape[1]
    o, lse = kernel.attention_fwd_sm100(
        _operand(q, "hd"),
        _operand(k, "hd"),
        _operand(v, "seq"),
        lengths_table(q_len, kv_len, b, t, s),
        causal=static.is_causal,
        scale=static.scale,
        p_scale=cfg.p_scale,
        p_rounding=cfg.scale_rounding,
        broadcast_q=broadcast_q,
        path=static.impl,
    )
    return o.astype(static.out_dtype), lse


def square_mx(op: Sm100Operand) -> MXArray:
    """The square-block MXArray (B, L, heads, H) (axes (-3, -1)) whose bytes an Sm100Operand carries: its data
    and the square scale of each 32x32 block, read back from either orientation's blocked bytes (every row of a
    block holds the block's byte). L must be a multiple of 32."""
    b, length, heads, h = op.data.shape
    lp = -(-length // 128) * 128
    if op.sf_hd is not None:
        rows = from_blocked_scales(op.sf_hd, lp, h // 32)  # (B, heads, Lp, H/32)
        square = rows[:, :, :length:32]
    else:
        rows = from_blocked_scales(op.sf_seq, h, lp // 32)  # (B, heads, H, Lp/32)
        square = jnp.swapaxes(rows[:, :, ::32, : length // 32], -1, -2)
    return MXArray(op.data, square.transpose(0, 2, 1, 3), (-3, -1), "square")
