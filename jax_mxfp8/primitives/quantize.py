"""FFI-backed MX quantize / dequantize (layer 5): kernel coverage, the FFI op declarations, entry points.

Entry points (jax_mxfp8.quantize / dequantize, in jax_mxfp8/ops/quantize.py, forward to these):
  quantize(x, *, axis=-1, block="row", dtype=..., scale_rounding="up", rounding="nearest", rng=None,
           implementation=None, scale_layout="natural") -> MXArray
  quantize_rowcol(x, *, dtype=..., scale_rounding="up", implementation=None) -> (row MXArray, col MXArray)
      one pass over x: row blocks along the last axis AND column blocks along the second-to-last axis.
  dequantize(a, dtype=jnp.float32, *, implementation=None) -> jax.Array

`implementation` is resolved by jax_mxfp8.primitives.implementation ("xla": formats.quantize; "emulated":
the declarations below with their XLA bodies; "cuda": the kernels).

What the kernels cover: float32 / bfloat16 input of rank >= 2 whose last two dimensions are multiples
of 32; row blocks along the last axis (block="row", axis=-1), column blocks along the second-to-last
(block="row", axis=-2), 32x32 square blocks over the last two axes; float8_e4m3fn / float8_e5m2;
scale_rounding "up" / "floor"; rounding="nearest". Leading axes are flattened into rows by the handler.

scale_layout="blocked" (row blocks along the last axis, rank >= 2: the scales in the 128x4 layout of Blackwell's
block-scaled MMA, MXArray.scale_layout) runs the Blackwell GEMM operand producer ("row" orientation of
primitives/gemm_operands.py, layout "blocked", sm_100f only) on x viewed as (G, R, K), else the reference.

Sharding (QUANTIZE, QUANTIZE_ROWCOL, DEQUANTIZE): leading axes free; the last two axes are (blocks, 32)
compound factors, so they shard only on block boundaries (the kernels need both local dims multiples of
32) and the scales shard with their data. Batching: the vmapped axis folds into the leading axis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats import MXArray, element_format
from jax_mxfp8.formats import dequantize as ref_dequantize
from jax_mxfp8.formats import quantize as ref_quantize
from jax_mxfp8.formats.mxarray import check_consistent, check_scale_layout
from jax_mxfp8.formats.quantize import block_axes, check_blockable, check_quantize_input
from jax_mxfp8.formats.scales import check_scale_rounding
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule
from jax_mxfp8.primitives.gemm_operands import find_variant, gemm_operands, gemm_operands_unsupported

# (block, axes relative to the end) -> the kernels' mode
_MODE_OF = {("row", (-1,)): "row", ("row", (-2,)): "col", ("square", (-2, -1)): "square"}
_BLOCKED = {"row": (False, True), "col": (True, False), "square": (True, True), "rowcol": (True, True)}


def _scale_shape(shape, mode: str) -> tuple[int, ...]:
    s = list(shape)
    rows, cols = _BLOCKED[mode]
    if rows:
        s[-2] //= 32
    if cols:
        s[-1] //= 32
    return tuple(s)


def _scale_dims(mode: str) -> str:
    """A scale's factors: a blocked dim carries the block count alone, an unblocked one the data's factors."""
    rows, cols = _BLOCKED[mode]
    return f"... {'m' if rows else '(m r)'} {'k' if cols else '(k c)'}"


_DATA = "... (m r) (k c)"
_SIZES = (("r", 32), ("c", 32))


# ------------------------------------------------------------------------------------------ declarations
def _quantize_outputs(variant: registry.QuantizeConfig, x):
    elem = jnp.dtype(variant.elem_dtype)
    modes = ("row", "col") if variant.mode == "rowcol" else (variant.mode,)
    out = []
    for mode in modes:
        out += [jax.ShapeDtypeStruct(x.shape, elem), jax.ShapeDtypeStruct(_scale_shape(x.shape, mode), jnp.uint8)]
    return tuple(out)


def _quantize_emulation(variant: registry.QuantizeConfig, x):
    """The kernels' outputs from the reference (bit-identical, tests/quantize/test_quantize_kernels_gpu.py)."""
    kw = dict(dtype=jnp.dtype(variant.elem_dtype), scale_rounding=variant.scale_rounding)
    if variant.mode == "rowcol":
        r, c = ref_quantize(x, axis=-1, **kw), ref_quantize(x, axis=-2, **kw)
        return (r.data, r.scale, c.data, c.scale)
    if variant.mode == "square":
        q = ref_quantize(x, axis=(-2, -1), block="square", **kw)
    else:
        q = ref_quantize(x, axis=-1 if variant.mode == "row" else -2, **kw)
    return (q.data, q.scale)


def _quantize_sharding(variant: registry.QuantizeConfig) -> ShardingRule:
    modes = ("row", "col") if variant.mode == "rowcol" else (variant.mode,)
    results = tuple(s for mode in modes for s in (_DATA, _scale_dims(mode)))
    return ShardingRule(operands=(_DATA,), results=results, factor_sizes=_SIZES)


def _quantize_op(target: str, n_results: int) -> FfiOp:
    return FfiOp(
        target=target,
        outputs=_quantize_outputs,
        emulation=_quantize_emulation,
        sharding=_quantize_sharding,
        batch_dims=(0,),
        result_batch_dims=(0,) * n_results,
    )


QUANTIZE = _quantize_op("jax_mxfp8_quantize", 2)
"""x (..., M, K) -> (data, scale) in the variant's mode ("row", "col", "square")."""

QUANTIZE_ROWCOL = _quantize_op("jax_mxfp8_quantize_rowcol", 4)
"""x (..., M, K) -> (row data, row scale (..., M, K/32), col data, col scale (..., M/32, K)) in one pass."""


def _dequantize_outputs(variant: registry.DequantizeConfig, data, scale):
    return (jax.ShapeDtypeStruct(data.shape, jnp.dtype(variant.out_dtype)),)


def _dequantize_emulation(variant: registry.DequantizeConfig, data, scale):
    axes = {"row": (-1,), "col": (-2,), "square": (-2, -1)}[variant.block]
    a = MXArray(data=data, scale=scale, axes=axes, block="square" if variant.block == "square" else "row")
    return ref_dequantize(a, jnp.dtype(variant.out_dtype))


DEQUANTIZE = FfiOp(
    target="jax_mxfp8_dequantize",
    outputs=_dequantize_outputs,
    emulation=_dequantize_emulation,
    sharding=lambda v: ShardingRule(operands=(_DATA, _scale_dims(v.block)), results=(_DATA,), factor_sizes=_SIZES),
    batch_dims=(0, 0),
    result_batch_dims=(0,),
)
"""(data (..., M, K), scale) -> values (..., M, K) in the variant's out_dtype."""


# ------------------------------------------------------------------------------------ kernel coverage
def _quantize_variant(x, axes_neg, block, dtype, scale_rounding, rounding, mode=None) -> tuple[object, str | None]:
    """(registry variant, None) when a kernel covers the arguments, else (None, why not). mode: "rowcol" for
    the one-pass row+col kernel (its coverage is that of the row blocks), else from (block, axes_neg)."""
    if np.dtype(x.dtype).name not in registry.IN_DTYPES:
        return None, f"the kernels take float32 / bfloat16 input, got {x.dtype}"
    if rounding != "nearest":
        return None, "the kernels round to nearest even only (rounding='stochastic' runs in XLA)"
    if x.ndim < 2:
        return None, "the kernels take arrays of rank >= 2"
    if (block, axes_neg) not in _MODE_OF:
        why = "the kernels block along the last axis, the second-to-last, or both (square)"
        return None, f"{why}; got block={block!r}, axes={axes_neg}"
    if x.shape[-1] % 32 or x.shape[-2] % 32:
        return None, f"the kernels need the last two dimensions to be multiples of 32, got shape {x.shape}"
    return _find_quantize(x.dtype, mode or _MODE_OF[(block, axes_neg)], dtype, scale_rounding)


def _find_quantize(in_dtype, mode, dtype, scale_rounding):
    variant = registry.find(
        registry.QuantizeConfig,
        in_dtype=np.dtype(in_dtype).name,
        mode=mode,
        elem_dtype=np.dtype(dtype).name,
        scale_rounding=scale_rounding,
    )
    return variant, (None if variant is not None else "no registered kernel variant for these arguments")


def _path(implementation, variant, why, op: str) -> str:
    return impl.resolve(implementation, why, variant.archs if variant is not None else registry.ARCHS, op=op)


# ---------------------------------------------------------------------------------------- entry points
def quantize(
    x,
    *,
    axis=-1,
    block: str = "row",
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    rounding: str = "nearest",
    rng=None,
    implementation: str | None = None,
    scale_layout: str = "natural",
) -> MXArray:
    """jax_mxfp8.quantize with an `implementation` switch (see the module docstring)."""
    impl.check(implementation)
    x = check_quantize_input(x)  # the reference's argument checks first: one error on every path
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    if rounding == "nearest" and rng is not None:
        raise ValueError("rng was given but rounding='nearest'; pass rounding='stochastic' to use it")
    axes = block_axes(x.ndim, axis, block) if x.ndim else ()
    axes_neg = tuple(a - x.ndim for a in axes)
    check_blockable(x.shape, axes)
    if scale_layout != "natural":
        check_scale_layout(scale_layout, axes_neg, block, x)
        return _quantize_blocked(x, fmt.dtype, scale_rounding, rounding, rng, implementation)
    variant, why = (
        _quantize_variant(x, axes_neg, block, fmt.dtype, scale_rounding, rounding) if x.ndim else (None, "rank 0")
    )
    path = _path(implementation, variant, why, "quantize")
    if path == "xla":
        return ref_quantize(
            x, axis=axis, block=block, dtype=dtype, scale_rounding=scale_rounding, rounding=rounding, rng=rng
        )
    x = jax.lax.stop_gradient(x)  # like the reference: not differentiable (zero gradient)
    data, scale = QUANTIZE.call(variant, path, x)
    return MXArray(data=data, scale=scale, axes=axes_neg, block=block)


def _quantize_blocked(x, dtype, scale_rounding: str, rounding: str, rng, implementation) -> MXArray:
    """quantize(x, axis=-1) with blocked scales: the Blackwell producer's "row" orientation on (G, R, K)."""
    *lead, r, k = x.shape
    x3 = x.reshape(-1, r, k)
    why = None if rounding == "nearest" else "the kernels round to nearest even only (rounding='stochastic': XLA)"
    why = why or ("no rows" if x3.size == 0 else None)
    why = why or gemm_operands_unsupported(x3.shape, x.dtype, dtype, scale_rounding, ("row",), "blocked")
    variant = find_variant(x.dtype, dtype, scale_rounding, ("row",), "blocked") if why is None else None
    path = _path(implementation, variant, why, "quantize")
    if path == "xla":
        kw = dict(dtype=dtype, scale_rounding=scale_rounding, rounding=rounding, rng=rng)
        return ref_quantize(x, axis=-1, scale_layout="blocked", **kw)
    x3 = jax.lax.stop_gradient(x3)  # like the reference: not differentiable (zero gradient)
    data, scale = gemm_operands(
        x3, dtype=dtype, scale_rounding=scale_rounding, orientations=("row",), path=path, layout="blocked"
    )["row"]
    return MXArray(data.reshape(x.shape), scale.reshape(*lead, *scale.shape[1:]), (-1,), "row", scale_layout="blocked")


def quantize_rowcol(
    x,
    *,
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    implementation: str | None = None,
) -> tuple[MXArray, MXArray]:
    """(quantize(x, axis=-1), quantize(x, axis=-2)) from one pass over x on the kernel path.

    Bit-identical to the two reference calls. x: rank >= 2, last two dimensions multiples of 32.
    """
    impl.check(implementation)
    x = check_quantize_input(x)  # the reference's argument checks first: one error on every path
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    if x.ndim < 2:
        raise ValueError(f"quantize_rowcol needs an array of rank >= 2, got shape {x.shape}")
    check_blockable(x.shape, (x.ndim - 2, x.ndim - 1))
    variant, why = _quantize_variant(x, (-1,), "row", fmt.dtype, scale_rounding, "nearest", mode="rowcol")
    path = _path(implementation, variant, why, "quantize_rowcol")
    if path == "xla":
        kw = dict(dtype=dtype, scale_rounding=scale_rounding)
        return ref_quantize(x, axis=-1, **kw), ref_quantize(x, axis=-2, **kw)
    rd, rs, cd, cs = QUANTIZE_ROWCOL.call(variant, path, jax.lax.stop_gradient(x))
    return (MXArray(data=rd, scale=rs, axes=(-1,), block="row"), MXArray(data=cd, scale=cs, axes=(-2,), block="row"))


def dequantize(a: MXArray, dtype=jnp.float32, *, implementation: str | None = None) -> jax.Array:
    """jax_mxfp8.dequantize with an `implementation` switch."""
    impl.check(implementation)
    if not isinstance(a, MXArray):
        raise ValueError(f"a must be an MXArray, got {type(a).__name__}")
    a = check_consistent(a, "a").natural()  # blocked scales: re-laid in XLA (the kernels read the natural layout)
    block = {("row", (-1,)): "row", ("row", (-2,)): "col", ("square", (-2, -1)): "square"}.get(
        (a.block, tuple(sorted(a.axes)))
    )
    out_name = np.dtype(dtype).name
    variant, why = None, None
    if a.ndim < 2 or block is None:
        why = f"the kernels dequantize blocks along the last axis, the second-to-last, or both; got {a!r}"
    elif a.shape[-1] % 32 or a.shape[-2] % 32:
        why = f"the kernels need the last two dimensions to be multiples of 32, got shape {a.shape}"
    else:
        variant = registry.find(
            registry.DequantizeConfig, elem_dtype=np.dtype(a.dtype).name, block=block, out_dtype=out_name
        )
        if variant is None:
            why = f"no dequantize kernel for {np.dtype(a.dtype).name} -> {out_name}"
    path = _path(implementation, variant, why, "dequantize")
    if path == "xla":
        return ref_dequantize(a, dtype)
    return DEQUANTIZE.call(variant, path, a.data, a.scale)
