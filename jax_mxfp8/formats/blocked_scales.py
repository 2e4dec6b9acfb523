"""The 128x4 blocked layout of E8M0 scales that Blackwell's block-scaled MMA reads (tcgen05 `block_scale`).

An MXArray's scale for a 2-D operand blocked along its last axis is a (rows, cols) uint8 array, cols =
K / 32 (one byte per 32-element block of a row). tcgen05.mma ... block_scale, cuBLAS, cuDNN and
TransformerEngine read the same bytes in a tiled order (called "swizzled" there):

  - rows are padded to a multiple of 128 and cols to a multiple of 4 (padding bytes are 0: the scale
    2^-127, so that a padded block, whose elements are 0, contributes 0; never 0xFF, which is NaN and
    would turn the zero products of K padding into NaN);
  - the padded array is cut into 128 x 4 tiles (512 bytes each), stored tile-row-major: tile (i, j)
    starts at byte (i * cols_p / 4 + j) * 512;
  - inside a tile, local row r (0..127) and column c (0..3) is byte (r % 32) * 16 + (r // 32) * 4 + c:
    the 32 rows r, r + 32, r + 64, r + 96 share one 16-byte line, 4 columns each.

Here the blocked bytes are shaped (..., rows_p / 128, cols_p / 4, 512): tile row, tile column, the tile's
512 bytes; leading axes (a batch G) are kept. Its row-major bytes are the buffer the MMA's TMA loads read.

  to_blocked_scales(scale)                   (..., rows, cols) -> (..., rows_p/128, cols_p/4, 512)
  from_blocked_scales(blocked, rows, cols)   the inverse (drops the padding)
  blocked_shape(rows, cols)                  (rows_p/128, cols_p/4, 512)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mxfp8.formats.elements import SCALE_DTYPE

TILE_ROWS = 128
TILE_COLS = 4
TILE_BYTES = TILE_ROWS * TILE_COLS
ROW_GROUP = 32
"""Rows r and r + 32 k (k = 0..3) of a tile share one 16-byte line."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def blocked_shape(rows: int, cols: int) -> tuple[int, int, int]:
    """(tile rows, tile columns, 512) of the blocked layout of a (rows, cols) scale array."""
    if rows < 0 or cols < 0:
        raise ValueError(f"rows={rows} and cols={cols} must be >= 0")
    return (_cdiv(rows, TILE_ROWS), _cdiv(cols, TILE_COLS), TILE_BYTES)


def _check_scale(scale, name: str) -> None:
    if scale.dtype != SCALE_DTYPE:
        raise ValueError(f"{name} must be uint8 E8M0 scale bytes, got dtype {scale.dtype}")


def to_blocked_scales(scale: jax.Array) -> jax.Array:
    """The 128x4 blocked layout (module docstring) of an MXArray-style scale.

    Args:
      scale: uint8 (..., rows, cols): E8M0 bytes of row blocks along the last axis of a (..., rows, K)
        operand, cols = K / 32 (e.g. `jax_mxfp8.quantize(x, axis=-1).scale` of a 2-D x).
    Returns:
      uint8 (..., ceil(rows / 128), ceil(cols / 4), 512); padding bytes are 0.
    Raises:
      ValueError naming `scale` when it is not uint8 of rank >= 2.
    """
    scale = jnp.asarray(scale)
    if scale.ndim < 2:
        raise ValueError(f"scale must have rank >= 2 (..., rows, cols), got shape {tuple(scale.shape)}")
    _check_scale(scale, "scale")
    *lead, rows, cols = scale.shape
    tr, tc, _ = blocked_shape(rows, cols)
    pad = [(0, 0)] * len(lead) + [(0, tr * TILE_ROWS - rows), (0, tc * TILE_COLS - cols)]
    padded = jnp.pad(scale, pad)
    # (..., tile row i, k = r // 32, q = r % 32, tile col j, c) -> (..., i, j, q, k, c)
    n = len(lead)
    x = padded.reshape(*lead, tr, TILE_ROWS // ROW_GROUP, ROW_GROUP, tc, TILE_COLS)
    x = jnp.transpose(x, (*range(n), n, n + 3, n + 2, n + 1, n + 4))
    return x.reshape(*lead, tr, tc, TILE_BYTES)


def from_blocked_scales(blocked: jax.Array, rows: int, cols: int) -> jax.Array:
    """The (..., rows, cols) scale array held in the blocked layout `blocked` (the inverse of
    to_blocked_scales; padding dropped).

    Args:
      blocked: uint8 (..., ceil(rows / 128), ceil(cols / 4), 512).
      rows, cols: the logical scale shape (rows of the operand, K / 32).
    Raises:
      ValueError naming `blocked` when its dtype or shape does not match (rows, cols).
    """
    blocked = jnp.asarray(blocked)
    _check_scale(blocked, "blocked")
    tr, tc, tb = blocked_shape(rows, cols)
    if blocked.ndim < 3 or tuple(blocked.shape[-3:]) != (tr, tc, tb):
        raise ValueError(
            f"blocked has shape {tuple(blocked.shape)}; a ({rows}, {cols}) scale needs (..., {tr}, {tc}, {tb})"
        )
    lead = blocked.shape[:-3]
    n = len(lead)
    x = blocked.reshape(*lead, tr, tc, ROW_GROUP, TILE_ROWS // ROW_GROUP, TILE_COLS)  # (..., i, j, q, k, c)
    x = jnp.transpose(x, (*range(n), n, n + 3, n + 2, n + 1, n + 4))  # (..., i, k, q, j, c)
    x = x.reshape(*lead, tr * TILE_ROWS, tc * TILE_COLS)
    return x[..., :rows, :cols]
