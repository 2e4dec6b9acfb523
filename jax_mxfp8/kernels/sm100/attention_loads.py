"""Global views and load sources of the Blackwell attention kernels' operands (sm_100f; traced in CuTe DSL).
Shared by the forward and the backward: Q, K, V, dO and O are sequence-major row operands, their scales 128x4
blocked chunks (primitives/attention_sm100_operands.py, formats/blocked_scales.py).

Operands arrive as 2-D row-major views of the emulation's arrays (no copies; docs/interfaces.md "sm100
attention"):
  data   (Lb * L, heads * H)   E4M3 (or O bfloat16, dQ / dK / dV float32): (Lb, L, heads, H) with Lb batch rows
                               (1 when packed)
  scales (Lb * heads, C * 512) uint8: (Lb, heads, C, 1, 512) orientation "hd" (C = row chunks) or
                               (Lb, heads, 1, C, 512) orientation "seq" (C = key-block chunks), H <= 128

  rows_view(x, batch, heads, head_dim, packed)   (rows, H, heads, L) for TMA (A operands, K-major B, O)
  cols_view(x, batch, heads, head_dim, packed)   (H, rows, heads, L): the same bytes as an MN-major B
                                                 operand (V in O = P V)
  scale_view(sf, rows, k)                        the blocked bytes as ((32, 4, rows / 128), (32, 4, k / 128),
                                                 groups) (blockscaled_mma.blocked_scale_layout), for TMA
  sequence_tiles(tma_tensor, seq, head, tiler, mn_mode)   one sequence's tiles of one head (the forward)
  sequence_view(tma_tensor, lcoord, shift, packed)        one sequence's (rows, H, heads) (the backward,
                                                          whose CTA walks the heads of a group)
  scale_chunk_addr(base, batch, head, heads, chunks, chunk)   a 512-byte chunk's global address (the
                                                          backward's 1-D bulk copies)

Dense operands: L is the batch mode, each batch row's `rows` mode has extent T (or S), so a 128-row box
past it reads zeros (TMA bounds), never the next batch row. Packed operands use the ragged-row encoding
(the technique of Triton's ragged TMA descriptors): the rows mode has extent 2^30 with the base pointer moved
back by 2^30 rows, and an extra mode L of extent 2^31 - 1 with the row stride. Sequence s (rows row0 ..
row0 + len - 1) is read at row coordinate 2^30 - len + r and L coordinate row0 + len (ragged_coords): the
address is base + (row0 + r) * stride, and r >= len falls past the rows extent, so the box is clipped at the
sequence's end (zeros in, nothing out) and no sequence reads another's bytes (an E4M3 NaN there would
reach O through 0 x NaN). Never run on hardware.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from jax_mxfp8.kernels.sm100.blockscaled_mma import blocked_scale_layout

RAGGED_ROWS = 2**30
"""Extent of the rows mode of a packed view (rows of one operand must stay below it)."""
RAGGED_L = 2**31 - 1
"""Extent of the extra mode that carries `row0 + len` of a packed view."""


class SeqAddr(NamedTuple):
    """One sequence of one operand, in the coordinates of its views (DSL Int32 values).

    lcoord: coordinate of the L mode (dense: the batch row; packed: row0 + rows); shift: added to the row
    coordinate (dense: 0; packed: 2^30 - rows); rows: the sequence's rows (the TMA bound); row0: its first
    row in the 2-D operand; g: scale group (row of the 2-D scale view); chunk0: its first scale chunk."""

    lcoord: Int32
    shift: Int32
    rows: Int32
    row0: Int32
    g: Int32
    chunk0: Int32


def ragged_coords(row0: Int32, rows: Int32) -> tuple[Int32, Int32]:
    """(L coordinate, row shift) of the packed sequence at rows row0 .. row0 + rows - 1 (module docstring)."""
    return row0 + rows, Int32(RAGGED_ROWS) - rows


def dense_seq(b: Int32, rows: Int32, g: Int32) -> SeqAddr:
    return SeqAddr(b, Int32(0), rows, b * rows, g, Int32(0))


def packed_seq(row0: Int32, rows: Int32, g: Int32, chunk0: Int32) -> SeqAddr:
    lcoord, shift = ragged_coords(row0, rows)
    return SeqAddr(lcoord, shift, rows, row0, g, chunk0)


def _view(x: cute.Tensor, batch, heads: int | Int32, head_dim: int, packed: bool, transposed: bool) -> cute.Tensor:
    rstride = heads * head_dim
    if cutlass.const_expr(packed):
        elem_bytes = x.element_type.width // 8
        addr = x.iterator.toint() - Int64(RAGGED_ROWS) * Int64(rstride) * Int64(elem_bytes)
        ptr = cute.make_ptr(x.element_type, addr, cute.AddressSpace.gmem, assumed_align=16)
        shape, stride = (RAGGED_ROWS, head_dim, heads, RAGGED_L), (rstride, 1, head_dim, rstride)
    else:
        ptr = x.iterator
        length = x.shape[0] // batch
        shape, stride = (length, head_dim, heads, batch), (rstride, 1, head_dim, length * rstride)
    if cutlass.const_expr(transposed):
        shape, stride = (shape[1], shape[0], *shape[2:]), (stride[1], stride[0], *stride[2:])
    return cute.make_tensor(ptr, cute.make_layout(shape, stride=stride))


def rows_view(x: cute.Tensor, batch, heads, head_dim: int, packed: bool) -> cute.Tensor:
    """(rows, H, heads, L) over a (batch * rows, heads * H) operand (module docstring)."""
    return _view(x, batch, heads, head_dim, packed, transposed=False)


def cols_view(x: cute.Tensor, batch, heads, head_dim: int, packed: bool) -> cute.Tensor:
    """(H, rows, heads, L): the rows_view with its first two modes swapped (MN-major B operand)."""
    return _view(x, batch, heads, head_dim, packed, transposed=True)


def scale_view(sf: cute.Tensor, rows, k) -> cute.Tensor:
    """The (groups, chunks * 512) blocked scale bytes as ((32, 4, rows / 128), (32, 4, k / 128), groups):
    element (row, k, g) -> its byte (32 elements of a block share it)."""
    return cute.make_tensor(sf.iterator, blocked_scale_layout(rows, k, sf.shape[0]))


def sequence_tiles(tma_tensor: cute.Tensor, seq: SeqAddr, head, tiler, rows_mode: int, packed: bool) -> cute.Tensor:
    """(tile_rows, tile_cols, tiles) of one head of one sequence, from a 4-mode TMA coordinate tensor
    ((rows, H) or (H, rows) first, then heads, L); tile i along the rows mode starts at the sequence's row
    tiler[rows_mode] * i."""
    t = tma_tensor[None, None, head, seq.lcoord]
    if cutlass.const_expr(packed):
        off = (seq.shift, 0) if rows_mode == 0 else (0, seq.shift)
        t = cute.domain_offset(off, t)
    coord = (None, 0) if rows_mode == 0 else (0, None)
    return cute.local_tile(t, tiler, coord)


def scale_tiles(tma_tensor: cute.Tensor, g, tiler, rows_mode: int) -> cute.Tensor:
    """(tile_rows, tile_cols, chunks) of scale group g (chunk c = rows 128 c .. of the blocked view, or key
    blocks 4 c .. for rows_mode 1)."""
    t = tma_tensor[None, None, g]
    coord = (None, 0) if rows_mode == 0 else (0, None)
    return cute.local_tile(t, tiler, coord)


def sequence_view(tma_tensor: cute.Tensor, lcoord: Int32, shift, packed: bool) -> cute.Tensor:
    """(rows, H, heads) of one sequence of a rows_view TMA coordinate tensor: batch row lcoord (dense), or
    the packed sequence of ragged_coords (lcoord, shift)."""
    t = tma_tensor[(None, None, None, lcoord)]
    if cutlass.const_expr(packed):
        t = cute.domain_offset((shift, 0, 0), t)
    return t


def scale_chunk_addr(base: Int64, batch: Int32, head: Int32, heads: Int32, chunks: Int32, chunk: Int32) -> Int64:
    """Global address of the 512-byte scale chunk `chunk` of (batch, head) in a (batch * heads, chunks * 512)
    blocked scale operand (either orientation at H <= 128)."""
    return base + ((Int64(batch) * Int64(heads) + Int64(head)) * Int64(chunks) + Int64(chunk)) * 512
