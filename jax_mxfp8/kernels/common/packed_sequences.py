"""Device-side decode of the packed-sequence encoding the attention kernels of every arch share (arch-neutral
CuTe DSL, traced inline; the host tables: primitives/attention_packed.py for Hopper,
primitives/attention_sm100_packed.packed_tables for Blackwell, which adds rows 4-5).

  seqs (R, S) int32, per sequence s: row 0 its first query tile, 1 its first KV tile (128-row tiles of the
      aligned packed layout; the Blackwell kernels' first Q and K / V scale chunks), 2 its query length, 3 its
      KV length; R = 6 on Blackwell: 4 its first query row, 5 its first key row in the compact data
  work (2, W) int32, item i: (sequence, tile inside it), sequence -1 = an item that does nothing

  packed_item(work, seqs, i)   PackedItem: the item's tile, its sequence's row 0-3 entries, live, the row of
                               seqs it read (a padding item reads sequence 0's entries and is not live)
  sequence_rows(seqs, seq)     (first query row, first key row): rows 4-5
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32

SEQ_TILE = 128
"""Rows per tile of the aligned packed layout (every sequence starts on one): the unit of seqs' first tiles."""


class PackedItem(NamedTuple):
    """One work-list item (DSL values)."""

    tile: Int32  # work[1, i]: the tile (or tile pair) inside the sequence
    q_tile0: Int32  # the sequence's first query tile
    kv_tile0: Int32  # its first KV tile
    q_len: Int32  # its query rows
    kv_len: Int32  # its keys
    live: Boolean  # False: a padding item (sequence -1)
    seq: Int32  # the sequence (0 for a padding item): the column of seqs read


def packed_item(work: cute.Tensor, seqs: cute.Tensor, item: Int32) -> PackedItem:
    """Work item `item` of a packed work list (module docstring)."""
    seq = work[0, item]
    live = seq >= 0
    s = cutlass.max(seq, 0)  # padding items read sequence 0's entries (unused)
    tile = work[1, item]
    return PackedItem(tile, seqs[0, s], seqs[1, s], seqs[2, s], seqs[3, s], live, s)


def sequence_rows(seqs: cute.Tensor, seq: Int32) -> tuple[Int32, Int32]:
    """(first query row, first key row) of sequence seq in the compact packed data (Blackwell's rows 4-5)."""
    return seqs[4, seq], seqs[5, seq]
