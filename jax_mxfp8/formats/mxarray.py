"""MXArray: FP8 elements plus E8M0 block scales, as a JAX pytree."""

from __future__ import annotations

import dataclasses
import operator

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats.blocked_scales import blocked_shape, from_blocked_scales, to_blocked_scales
from jax_mxfp8.formats.decode import decode_mx
from jax_mxfp8.formats.elements import BLOCK_SIZE, SCALE_DTYPE, element_format

BLOCK_KINDS = ("row", "square")
SCALE_LAYOUTS = ("natural", "blocked")


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
      scale_layout: "natural" (default: `scale` as above) or "blocked": the same bytes in the 128x4 layout
        Blackwell's block-scaled MMA reads (formats/blocked_scales.py), for row blocks along the last axis of
        a rank >= 2 array only: data (..., R, K) -> scale (..., ceil(R / 128), ceil(K / 128), 512), leading
        axes kept (to_blocked_scales of the natural scale; padding bytes 0). The Blackwell producers emit it
        (rms_norm_quantize and mx_dot_general_quantized on the sm100 kernel path, quantize with
        scale_layout="blocked") so that the next GEMM reads their scales without a re-layout pass; the
        values are the same as the natural layout's (`natural()` converts; dequantize takes either).

    `data` and `scale` are pytree leaves; `axes`, `block` and `scale_layout` are static metadata, so an MXArray passes
    through jit, vmap (batch axis 0), tree_map, device_put and shard-preserving ops. It is a
    non-differentiable carrier (quantize has a zero gradient); for a differentiable round trip use
    `fake_quantize(x)`, whose gradient is straight-through.

    Construction validates every field (ValueError naming it): `block`, `axes` (negative, distinct, one
    for "row" and two for "square", within data's rank), `scale_layout`, the element dtype, a uint8 scale
    and the scale's shape. Pytree unflattening (what jit, vmap, tree_map and custom_vjp do with placeholder
    or float0 leaves) does not re-validate; every op that consumes an MXArray (dequantize, the GEMMs,
    attention) checks it again with `check_consistent`, so an MXArray that tree_map made inconsistent (data
    reshaped without its scale, say) raises a ValueError there, not an error deep inside the op.
    """

    data: jax.Array
    scale: jax.Array
    axes: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    block: str = dataclasses.field(metadata=dict(static=True))
    scale_layout: str = dataclasses.field(default="natural", metadata=dict(static=True))

    def __post_init__(self):
        axes = check_axes_and_block(self.axes, self.block)
        object.__setattr__(self, "axes", axes)
        check_scale_layout(self.scale_layout, axes, self.block, self.data)
        check_leaves(self.data, self.scale, axes, scale_layout=self.scale_layout)

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
        """The values in `dtype` (default float32): formats.dequantize(self, dtype), saturating finite values."""
        a = check_consistent(self).natural()
        return decode_mx(a.data, a.scale, a.positive_axes(), dtype, saturated=True)

    def natural(self) -> MXArray:
        """This MXArray with its scale in the natural layout (itself when it already is)."""
        if self.scale_layout == "natural":
            return self
        *_, rows, k = self.data.shape
        scale = from_blocked_scales(self.scale, rows, k // BLOCK_SIZE)
        return MXArray(data=self.data, scale=scale, axes=self.axes, block=self.block)

    def blocked(self) -> MXArray:
        """This MXArray with its scale in the 128x4 blocked layout (row blocks along the last axis only)."""
        if self.scale_layout == "blocked":
            return self
        scale = to_blocked_scales(self.scale)
        return MXArray(data=self.data, scale=scale, axes=self.axes, block=self.block, scale_layout="blocked")

    def __repr__(self) -> str:
        layout = ", scale_layout='blocked'" if self.scale_layout == "blocked" else ""
        return (
            f"MXArray(shape={self.shape}, dtype={np.dtype(self.data.dtype).name}, block={self.block!r}, "
            f"axes={self.axes}, scale_shape={tuple(self.scale.shape)}{layout})"
        )


def scale_shape_of(shape: tuple[int, ...], axes: tuple[int, ...], scale_layout: str) -> tuple[int, ...]:
    """Shape of the scale array of data `shape` blocked along `axes` (non-negative) in `scale_layout`."""
    if scale_layout == "blocked":
        *lead, rows, k = shape
        return (*lead, *blocked_shape(rows, k // BLOCK_SIZE))
    return scale_shape(shape, axes)


def check_scale_layout(scale_layout, axes: tuple[int, ...], block: str, data) -> None:
    """ValueError naming `scale_layout` unless it is known and, for "blocked", the array is row-blocked along
    its last axis with rank >= 2."""
    if not isinstance(scale_layout, str) or scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"MXArray scale_layout={scale_layout!r} is not one of {SCALE_LAYOUTS}")
    if scale_layout == "blocked":
        ndim = len(data.shape) if _is_array_like(data) else None
        if block != "row" or axes != (-1,) or (ndim is not None and ndim < 2):
            raise ValueError(
                "MXArray scale_layout='blocked' holds row blocks along the last axis of a rank >= 2 array "
                f"(block='row', axes=(-1,)); got block={block!r}, axes={axes}, rank {ndim}"
            )


def scale_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the scale array for `shape` blocked along `axes` (non-negative)."""
    return tuple(d // BLOCK_SIZE if i in axes else d for i, d in enumerate(shape))


def check_axes_and_block(axes, block) -> tuple[int, ...]:
    """The static fields' checks: returns `axes` as a tuple of Python ints; ValueError naming the field."""
    if not isinstance(block, str) or block not in BLOCK_KINDS:
        raise ValueError(f"MXArray block={block!r} is not one of {BLOCK_KINDS}")
    try:
        axes = tuple(operator.index(a) for a in axes)
    except TypeError as e:
        raise ValueError(f"MXArray axes={axes!r} must be a tuple of negative ints, e.g. (-1,)") from e
    want = 1 if block == "row" else 2
    if len(axes) != want:
        raise ValueError(f"MXArray axes={axes!r}: block={block!r} takes exactly {want} axis(es)")
    if any(a >= 0 for a in axes):
        raise ValueError(f"MXArray axes={axes!r} must be negative indices (e.g. (-1,) for the last axis)")
    if len(set(axes)) != len(axes):
        raise ValueError(f"MXArray axes={axes!r} names the same axis twice")
    return axes


def _is_array_like(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def check_leaves(
    data, scale, axes: tuple[int, ...], name: str = "MXArray", scale_layout: str = "natural"
) -> None:
    """Checks data / scale against each other, `axes` and `scale_layout` (ValueError naming `name` and the
    field). Leaves that are not arrays (placeholders) and float0 leaves (zero cotangents) are not checked."""
    if _is_array_like(data):
        ndim = len(data.shape)
        if any(a < -ndim for a in axes):
            raise ValueError(f"{name} axes={axes} are out of range for data of shape {tuple(data.shape)}")
        if data.dtype != jax.dtypes.float0:
            try:
                element_format(data.dtype)
            except ValueError as e:
                raise ValueError(f"{name} data has dtype {data.dtype}; it must be float8_e4m3fn or float8_e5m2") from e
        for a in axes:
            if data.shape[a] % BLOCK_SIZE:
                raise ValueError(
                    f"{name} data has shape {tuple(data.shape)}: blocked axis {a} is not a multiple of {BLOCK_SIZE}"
                )
    if _is_array_like(scale) and scale.dtype not in (np.dtype(SCALE_DTYPE), jax.dtypes.float0):
        raise ValueError(f"{name} scale has dtype {scale.dtype}; scales are uint8 E8M0 exponent bytes")
    if _is_array_like(data) and _is_array_like(scale):
        ndim = len(data.shape)
        want = scale_shape_of(tuple(data.shape), tuple(a % ndim for a in axes), scale_layout)
        if tuple(scale.shape) != want:
            rule = (
                "the 128x4 blocked layout: (..., ceil(R/128), ceil(K/128), 512)"
                if scale_layout == "blocked"
                else f"each blocked axis divided by {BLOCK_SIZE}"
            )
            raise ValueError(
                f"{name} scale has shape {tuple(scale.shape)}; data of shape {tuple(data.shape)} blocked along "
                f"axes {axes} needs scale shape {want} ({rule})"
            )


def check_consistent(a: MXArray, name: str = "MXArray") -> MXArray:
    """`a`, checked as construction checks it, where an op consumes it (ValueError naming `name`).

    Pytree transformations rebuild MXArrays without validation (placeholder and float0 leaves must pass
    through), so jax.tree_util.tree_map can return one whose data and scale disagree. At consumption the
    leaves are arrays or tracers (under jit and vmap: tracers have shapes and dtypes, so the check runs at
    trace time and costs nothing at run time); anything else is an error here.
    """
    for field in ("data", "scale"):
        leaf = getattr(a, field)
        if not _is_array_like(leaf) or leaf.dtype == jax.dtypes.float0:
            raise ValueError(f"{name} {field} must be an array; got {type(leaf).__name__}")
    check_leaves(a.data, a.scale, a.axes, name, a.scale_layout)
    return a


def _flatten_with_keys(a: MXArray):
    keys = jax.tree_util.GetAttrKey
    return ((keys("data"), a.data), (keys("scale"), a.scale)), (a.axes, a.block, a.scale_layout)


def _flatten(a: MXArray):
    return (a.data, a.scale), (a.axes, a.block, a.scale_layout)


def _unflatten(aux, children) -> MXArray:
    # No validation: transformations unflatten with placeholders, tracers of other shapes and float0 leaves.
    a = object.__new__(MXArray)
    for name, value in zip(("data", "scale", "axes", "block", "scale_layout"), (*children, *aux), strict=True):
        object.__setattr__(a, name, value)
    return a


jax.tree_util.register_pytree_with_keys(MXArray, _flatten_with_keys, _unflatten, _flatten)
