"""MXArray: FP8 elements plus E8M0 block scales, as a JAX pytree."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats.elements import BLOCK_SIZE

BLOCK_KINDS = ("row", "square")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MXArray:
    """A block-scaled FP8 array.

    Attributes:
      data: FP8 elements (float8_e4m3fn or float8_e5m2) with the logical array's shape.
      scale: uint8 E8M0 exponent bytes (value 2**(b - 127); 0xFF = NaN) with the same rank as `data`;
        each blocked axis is divided by 32 (the convention of jax.nn.scaled_matmul and qwix).
      axes: the blocked axes as NEGATIVE indices (static). One axis for row blocks, two for square
        blocks. Negative indices stay valid when vmap adds leading batch axes.
      block: "row" (32 consecutive elements along one axis) or "square" (32x32 over two axes).

    `data` and `scale` are pytree leaves; `axes` and `block` are static metadata, so an MXArray passes
    through jit, vmap (batch axis 0), tree_map, device_put and shard-preserving ops. It is a
    non-differentiable carrier (quantize has a zero gradient); for a differentiable round trip use
    `fake_quantize(x)`, whose gradient is straight-through.
    """

    data: jax.Array
    scale: jax.Array
    axes: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    block: str = dataclasses.field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def dtype(self):
        """The element dtype (float8_e4m3fn or float8_e5m2)."""
        return self.data.dtype

    def positive_axes(self) -> tuple[int, ...]:
        """The blocked axes as non-negative indices into `shape`."""
        return tuple(a % self.ndim for a in self.axes)

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        from jax_mxfp8.formats.quantize import dequantize

        return dequantize(self, dtype)

    def __repr__(self) -> str:
        return (
            f"MXArray(shape={self.shape}, dtype={np.dtype(self.data.dtype).name}, block={self.block!r}, "
            f"axes={self.axes}, scale_shape={tuple(self.scale.shape)})"
        )


def scale_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the scale array for `shape` blocked along `axes` (non-negative)."""
    return tuple(d // BLOCK_SIZE if i in axes else d for i, d in enumerate(shape))
