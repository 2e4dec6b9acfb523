"""The 128x4 blocked scale layout (formats/blocked_scales.py) against an independent per-element formula.

The oracle places every scale byte with an explicit loop over (row, column): tile (r // 128, c // 4) of a
tile-row-major array of 512-byte tiles, byte (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4 inside it, the
rest 0. Shapes cover exact tiles, padding of rows and of columns, several tiles each way and a batch axis.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.formats import from_blocked_scales, quantize, to_blocked_scales
from jax_mxfp8.formats.blocked_scales import blocked_shape
from tests.seeding_testutil import test_rng


def blocked_oracle(scale: np.ndarray) -> np.ndarray:
    """Flat blocked bytes of a 2-D (rows, cols) scale, one element at a time."""
    rows, cols = scale.shape
    tiles_r, tiles_c = -(-rows // 128), -(-cols // 4)
    out = np.zeros(tiles_r * tiles_c * 512, np.uint8)
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * tiles_c + c // 4
            inner = (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)
            out[tile * 512 + inner] = scale[r, c]
    return out


SHAPES = [(128, 4), (1, 1), (100, 3), (129, 5), (256, 8), (300, 10), (32, 2)]


@pytest.mark.parametrize("rows, cols", SHAPES)
def test_to_blocked_matches_per_element_formula(rows, cols):
    scale = test_rng().integers(1, 255, size=(rows, cols), dtype=np.uint8)  # no 0: padding is visible
    got = np.asarray(to_blocked_scales(jnp.asarray(scale)))
    assert got.shape == blocked_shape(rows, cols)
    np.testing.assert_array_equal(got.reshape(-1), blocked_oracle(scale))


@pytest.mark.parametrize("rows, cols", SHAPES)
def test_round_trip(rows, cols):
    scale = test_rng().integers(0, 256, size=(rows, cols), dtype=np.uint8)
    back = from_blocked_scales(to_blocked_scales(jnp.asarray(scale)), rows, cols)
    np.testing.assert_array_equal(np.asarray(back), scale)


def test_from_blocked_reads_the_formula_positions():
    """from_blocked_scales of oracle-placed bytes (not of to_blocked_scales' output) gives the scale back."""
    rows, cols = 200, 7
    scale = test_rng().integers(0, 256, size=(rows, cols), dtype=np.uint8)
    blocked = blocked_oracle(scale).reshape(blocked_shape(rows, cols))
    np.testing.assert_array_equal(np.asarray(from_blocked_scales(jnp.asarray(blocked), rows, cols)), scale)


def test_padding_is_zero_never_nan_scale():
    scale = np.full((130, 5), 0xFF, np.uint8)  # NaN blocks everywhere: only the padding may differ
    flat = np.asarray(to_blocked_scales(jnp.asarray(scale))).reshape(-1)
    mask = blocked_oracle(np.ones_like(scale)) == 1  # where real bytes go
    assert (flat[mask] == 0xFF).all() and (flat[~mask] == 0).all()


def test_batch_axes_are_kept():
    scale = test_rng().integers(0, 256, size=(3, 2, 150, 6), dtype=np.uint8)
    got = np.asarray(to_blocked_scales(jnp.asarray(scale)))
    assert got.shape == (3, 2, *blocked_shape(150, 6))
    for i in range(3):
        for j in range(2):
            np.testing.assert_array_equal(got[i, j].reshape(-1), blocked_oracle(scale[i, j]))
    np.testing.assert_array_equal(np.asarray(from_blocked_scales(jnp.asarray(got), 150, 6)), scale)


def test_quantize_scale_round_trip():
    """The layout takes an MXArray's scale as quantize returns it (rows x K/32)."""
    x = jnp.asarray(test_rng().normal(size=(96, 160)).astype(np.float32))
    s = quantize(x, axis=-1).scale
    assert s.shape == (96, 5)
    np.testing.assert_array_equal(np.asarray(from_blocked_scales(to_blocked_scales(s), 96, 5)), np.asarray(s))


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="scale"):
        to_blocked_scales(jnp.zeros((4, 4), jnp.int32))
    with pytest.raises(ValueError, match="scale"):
        to_blocked_scales(jnp.zeros((4,), jnp.uint8))
    with pytest.raises(ValueError, match="blocked"):
        from_blocked_scales(jnp.zeros((1, 1, 512), jnp.uint8), 129, 4)
    with pytest.raises(ValueError, match="blocked"):
        from_blocked_scales(jnp.zeros((1, 1, 512), jnp.float32), 128, 4)
