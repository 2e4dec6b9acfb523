"""The Blackwell (sm_100a / sm_100f) attention kernels' operands (layer 5): E4M3 data as quantized, plus the
E8M0 scale bytes in the tcgen05 block-scaled MMA's 128x4 layout, once per GEMM orientation.

  sm100_operand(x, orientations)             square-block MXArray (B, L, heads, H) -> Sm100Operand
  operand_values(op, orientation)            the MX values a GEMM reading `op` in that orientation multiplies
(packed jagged sequences: attention_sm100_packed.py)

Why two orientations. Q, K, V and dO are quantized once, in 32x32 square blocks over (sequence, head_dim)
(AttentionConfig.qkv_blocks="square"): one E4M3 payload serves every GEMM, read K-major where the GEMM contracts
head_dim (S = Q K^T, dP = dO V^T) and MN-major where it contracts the sequence (O = P V, dV = P^T dO,
dK = dS^T Q, dQ = dS K; tcgen05 reads 8-bit operands either way from shared memory). The MMA's scale factors
are indexed by (MN row, K block) in both cases, so each orientation needs its own scale bytes:
  "hd"   rows = sequence positions, K blocks = head_dim / 32:  byte(t, j) = square[t // 32, j]
  "seq"  rows = head_dim channels,  K blocks = positions / 32: byte(h, i) = square[i, h // 32]
i.e. the square block's byte repeated over its 32 rows. The producer (the quantize pass) writes both from the
square scales; the kernels TMA them into shared memory and copy them to tensor memory (tcgen05.cp) as is.
This module is their XLA formulation: what the producer emits and what the emulations read.

The 128x4 layout is formats/blocked_scales.py's (the GEMM's): rows padded to 128 and K blocks to 4 with zero
bytes, 512-byte chunks (row // 128, kb // 4), byte (r % 32) * 16 + (r // 32) * 4 + kb % 4 inside (r = row % 128).

Data stays sequence-major and compact, (B, L, heads, H) E4M3, as the quantize pass wrote it: the kernels' TMA
boxes read a (128 rows x H) tile of one head with row stride heads * H and zero-fill rows past L (dense) or
past the sequence's end (packed, "ragged" boxes), which the emulations model by zero padding.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_mxfp8.formats.blocked_scales import from_blocked_scales, to_blocked_scales
from jax_mxfp8.formats.decode import decode_elements
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import quantize
from jax_mxfp8.formats.scales import decode_scale

TILE = 128  # MN rows per scale chunk, and the attention kernels' query / key tile
ORIENTATIONS = ("hd", "seq")


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Sm100Operand:
    """One attention operand as the sm100 kernels take it (L = sequence length, Lp = L rounded up to 128).

    data:   (B, L, heads, H) float8_e4m3fn, sequence-major (the quantize pass's output, compact)
    sf_hd:  (B, heads, Lp/128, ceil(H/128), 512) uint8, orientation "hd", or None when no GEMM reads it so
    sf_seq: (B, heads, ceil(H/128), Lp/128, 512) uint8, orientation "seq" (rows = the H channels padded to 128),
            or None
    """

    data: jax.Array
    sf_hd: jax.Array | None = None
    sf_seq: jax.Array | None = None


def orientation_scales(square: jax.Array, orientation: str) -> jax.Array:
    """(..., L/32, H/32) square-block scale bytes of one head -> that orientation's blocked bytes (module
    docstring): the byte of square block (i, j) repeated over its 32 rows."""
    if orientation == "hd":
        return to_blocked_scales(jnp.repeat(square, 32, axis=-2))  # (..., L, H/32)
    if orientation == "seq":
        return to_blocked_scales(jnp.repeat(jnp.swapaxes(square, -1, -2), 32, axis=-2))  # (..., H, L/32)
    raise ValueError(f"orientation={orientation!r} is not one of {ORIENTATIONS}")


def sm100_operand(x: MXArray, orientations: tuple[str, ...] = ORIENTATIONS) -> Sm100Operand:
    """A square-block MXArray (B, L, heads, H), blocks over (L, H) (axes (-3, -1)), -> Sm100Operand with the
    scale bytes of the given orientations (the producer's emission, in XLA)."""
    if not isinstance(x, MXArray) or x.block != "square" or x.positive_axes() != (1, 3) or x.ndim != 4:
        raise ValueError("x must be a (B, L, heads, H) MXArray in square blocks over axes (-3, -1)")
    unknown = set(orientations) - set(ORIENTATIONS)
    if unknown:
        raise ValueError(f"orientations={orientations!r}: {sorted(unknown)} not in {ORIENTATIONS}")
    square = x.scale.transpose(0, 2, 1, 3)  # (B, heads, L/32, H/32)
    sf = {o: orientation_scales(square, o) for o in orientations}
    return Sm100Operand(data=x.data, sf_hd=sf.get("hd"), sf_seq=sf.get("seq"))


def quantize_square(x: jax.Array, scale_rounding: str = "up") -> MXArray:
    """(B, L, heads, H) float -> its square-block MXArray (blocks over (L, H)), as the attention ops quantize."""
    return quantize(x, axis=(-3, -1), block="square", scale_rounding=scale_rounding)


def operand_values(op: Sm100Operand, orientation: str) -> jax.Array:
    """The MX values a GEMM reading `op` in `orientation` multiplies: (B, Lp, heads, H) float32, element x
    2^(byte - 127) with the byte that orientation's scales give the element (NaN for byte 0xFF), rows past
    L zero (the TMA boxes' zero fill); Lp = L rounded up to 128."""
    b, seq_len, heads, h = op.data.shape
    lp = _round_up(seq_len, TILE)
    data = jnp.pad(decode_elements(op.data), [(0, 0), (0, lp - seq_len), (0, 0), (0, 0)])
    if orientation == "hd":
        if op.sf_hd is None:
            raise ValueError("the operand has no 'hd' scales (sf_hd is None)")
        s = from_blocked_scales(op.sf_hd, lp, h // 32)  # (B, heads, Lp, H/32)
        per_elem = jnp.repeat(s, 32, axis=-1).transpose(0, 2, 1, 3)  # (B, Lp, heads, H)
    elif orientation == "seq":
        if op.sf_seq is None:
            raise ValueError("the operand has no 'seq' scales (sf_seq is None)")
        s = from_blocked_scales(op.sf_seq, h, lp // 32)  # (B, heads, H, Lp/32)
        per_elem = jnp.repeat(s, 32, axis=-1).transpose(0, 3, 1, 2)  # (B, Lp, heads, H)
    else:
        raise ValueError(f"orientation={orientation!r} is not one of {ORIENTATIONS}")
    return decode_scale(per_elem, data)
