"""MX quantize / dequantize with the numerics of docs/numerics.md (pure jnp, any backend)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats.blocks import merge_blocks, split_blocks, split_shape
from jax_mxfp8.formats.decode import decode_mx
from jax_mxfp8.formats.elements import BLOCK_SIZE, SCALE_BIAS, SCALE_NAN, element_format
from jax_mxfp8.formats.mxarray import BLOCK_KINDS, MXArray, check_consistent, check_scale_layout
from jax_mxfp8.formats.rounding import round_to_elements
from jax_mxfp8.formats.scales import check_scale_rounding, decode_scale, mul_pow2, saturate, scale_bits
from jax_mxfp8.formats.stochastic import stochastic_round

ROUNDINGS = ("nearest", "stochastic")


def block_axes(ndim: int, axis: int | Sequence[int], block: str) -> tuple[int, ...]:
    """Normalises `axis` for `block` to a sorted tuple of non-negative axes.

    Row blocks take one axis. Square blocks take two axes; an int `axis` of -1 (the default) means the
    last two axes.

    Raises:
      ValueError: naming `block` or `axis` when they are invalid for an array of rank `ndim`.
    """
    if not isinstance(block, str) or block not in BLOCK_KINDS:
        raise ValueError(f"block={block!r} is not one of {BLOCK_KINDS}")
    axis = _axis_ints(axis)
    if block == "row":
        if not isinstance(axis, (int, np.integer)):
            if len(axis) != 1:
                raise ValueError(f"axis={axis!r}: row blocks take exactly one axis")
            axis = axis[0]
        axes = (int(axis),)
    else:
        if isinstance(axis, (int, np.integer)):
            if axis != -1:
                raise ValueError(f"axis={axis!r}: square blocks take two axes, e.g. axis=(-2, -1)")
            axes = (-2, -1)
        else:
            axes = tuple(int(a) for a in axis)
            if len(axes) != 2:
                raise ValueError(f"axis={axis!r}: square blocks take exactly two axes")
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis={axis!r} is out of range for an array of rank {ndim}")
    pos = tuple(sorted(a % ndim for a in axes))
    if len(set(pos)) != len(pos):
        raise ValueError(f"axis={axis!r} names the same axis twice")
    return pos


def _axis_ints(axis):
    """axis as an int or a tuple of ints; ValueError naming `axis` for anything else (floats, None, str)."""
    if isinstance(axis, (bool, np.bool_)):
        raise ValueError(f"axis={axis!r} must be an int or a sequence of ints")
    if isinstance(axis, (int, np.integer)):
        return int(axis)
    if isinstance(axis, (str, bytes)) or not hasattr(axis, "__len__"):
        raise ValueError(f"axis={axis!r} must be an int or a sequence of ints")
    try:
        return tuple(operator.index(a) for a in axis)
    except TypeError as e:
        raise ValueError(f"axis={axis!r} must be an int or a sequence of ints") from e


def check_blockable(shape: Sequence[int], axes: Sequence[int], name: str = "x") -> None:
    """Raises ValueError naming the axis when a blocked axis is not a positive multiple of 32."""
    for a in axes:
        if shape[a] % BLOCK_SIZE or shape[a] == 0:
            raise ValueError(
                f"axis {a} of {name} has size {shape[a]}, which is not a positive multiple of the MX block size "
                f"{BLOCK_SIZE} (shape {tuple(shape)})"
            )


def _check_key(rng) -> None:
    """ValueError naming rng unless it is a typed PRNG key or a legacy uint32 key array."""
    dt = getattr(rng, "dtype", None)
    if dt is not None and jax.dtypes.issubdtype(dt, jax.dtypes.prng_key) and np.shape(rng) == ():
        return
    if dt is not None and np.dtype(dt) == np.uint32 and np.ndim(rng) == 1:
        return
    raise ValueError(f"rng={rng!r} must be one PRNG key (jax.random.key(...)), for rounding='stochastic'")


def check_float32_range(x, name: str = "x") -> None:
    """ValueError naming `name` when concrete input holds finite values that overflow float32.

    The contract computes amax (and the scaled elements) in float32, so x is converted to float32 first. A
    finite float64 value at or above 2**128 - 2**103 (x64 mode, or a NumPy float64 array) converts to Inf,
    and its block would silently become a NaN block. Concrete input raises instead; traced input (under jit,
    where values cannot be inspected) keeps the contract's answer: that block dequantizes to NaN (scale
    0xFF), the loud result (docs/numerics.md "Float32 range"). Only 64-bit (and wider) floats are looked at:
    float32 / bfloat16 / float16 input always fits.
    """
    if isinstance(x, jax.core.Tracer):
        return
    dt = getattr(x, "dtype", None)
    if dt is None:
        try:
            dt = np.asarray(x).dtype
        except Exception:
            return  # not array-like: the dtype check that follows names it
    if not jnp.issubdtype(dt, jnp.floating) or np.dtype(dt).itemsize <= 4:
        return
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return  # values on other hosts: treated like traced input
    v = np.asarray(x)
    with np.errstate(over="ignore", invalid="ignore"):
        over = np.isfinite(v) & np.isinf(v.astype(np.float32))
    if over.any():
        big = float(np.max(np.abs(v[over])))
        raise ValueError(
            f"{name} holds {int(over.sum())} finite {np.dtype(dt).name} value(s) beyond float32's range (largest "
            f"|{name}| = {big:.6g}; float32's maximum is {float(np.finfo(np.float32).max):.8g}): jax_mxfp8 computes "
            f"in float32 (MX quantization takes float32 amaxes), where they would be Inf and give NaN blocks. "
            f"Scale {name} down first."
        )


def check_quantize_input(x) -> jax.Array:
    """x as a float32 / bfloat16 / float16 array; ValueError naming x otherwise (check_float32_range too)."""
    if isinstance(x, MXArray):
        raise ValueError("x is an MXArray (already quantized); quantize takes a float array (dequantize it first)")
    check_float32_range(x)
    try:
        x = jnp.asarray(x)
    except (TypeError, ValueError) as e:  # None, str, objects
        raise ValueError(f"x must be a float array; got {type(x).__name__}") from e
    if not jnp.issubdtype(x.dtype, jnp.floating) or np.dtype(x.dtype).itemsize < 2:
        raise ValueError(f"x has dtype {x.dtype}; quantize takes float32, bfloat16 or float16 input")
    return x


def _scaled_blocks(x: jax.Array, axis, block: str, fmt, scale_rounding: str):
    """The part quantize and quantize_dequantize share: (axes, split, inner, finite, b, y) with x split into
    blocks, `finite` (per block, keepdims) false where a block holds NaN or Inf, `b` the int32 scale byte
    (0xFF for those) and `y` the float32 block scaled by 2^(127 - b) and clipped to +-fmt.max.

    One abs-max reduction per block also tells the non-finite blocks: a NaN counts as Inf (XLA:CPU's max
    reduction does not propagate NaN), so amax is Inf exactly for them; finite blocks get their true amax."""
    axes = block_axes(x.ndim, axis, block)
    check_blockable(x.shape, axes)
    split, inner = split_shape(x.shape, axes)
    xb = split_blocks(x.astype(jnp.float32), split, axes)
    amax = jnp.max(jnp.where(jnp.isnan(xb), jnp.inf, jnp.abs(xb)), axis=inner, keepdims=True)
    finite = jnp.isfinite(amax)
    b = jnp.where(finite, scale_bits(jnp.where(finite, amax, 0.0), fmt, scale_rounding), SCALE_NAN)
    y = jnp.clip(mul_pow2(xb, SCALE_BIAS - jnp.minimum(b, 254)), -fmt.max, fmt.max)
    return axes, split, inner, finite, b, y


def quantize(
    x: jax.Array,
    *,
    axis: int | Sequence[int] = -1,
    block: str = "row",
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    rounding: str = "nearest",
    rng: jax.Array | None = None,
    scale_layout: str = "natural",
) -> MXArray:
    """Quantizes `x` to MXFP8: FP8 elements with one E8M0 scale per block.

    Args:
      x: float32 / bfloat16 / float16 array of any shape; blocked axes must be multiples of 32.
      axis: for block="row", the axis along which 32 consecutive elements share a scale (default last).
        For block="square", two axes (default: the last two) tiled in 32x32 blocks.
      block: "row" or "square".
      dtype: element dtype, jnp.float8_e4m3fn (default, max 448) or jnp.float8_e5m2 (max 57344).
      scale_rounding: "up" (default; bit-identical to jax.nn's mxfp8 quantize) or "floor" (OCP v1.0).
      rounding: "nearest" (round-to-nearest-even, default) or "stochastic" (needs `rng`).
      rng: a PRNG key, required for rounding="stochastic".
      scale_layout: "natural" (default) or "blocked" (row blocks along the last axis of a rank >= 2 x only:
        the scales in the 128x4 layout of Blackwell's block-scaled MMA, MXArray.scale_layout).

    Returns:
      MXArray with data of x's shape and uint8 scales with each blocked axis divided by 32 (or, blocked,
      (..., ceil(R / 128), ceil(K / 128), 512)). Blocks of zeros get scale 0 and zero data; blocks holding
      NaN or Inf get scale 0xFF (NaN) and NaN data.

    Not differentiable: the gradient with respect to `x` is zero. FP8 leaves cannot carry an exact
    cotangent (autodiff through the FP8 cast would round, flush or overflow it to NaN depending on the
    block scale). For a straight-through estimator use `fake_quantize`.
    """
    x = jax.lax.stop_gradient(check_quantize_input(x))
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={rounding!r} is not one of {ROUNDINGS}")
    if rounding == "stochastic" and rng is None:
        raise ValueError("rounding='stochastic' needs a PRNG key: pass rng=jax.random.key(...)")
    if rng is not None:
        _check_key(rng)
    if rounding == "nearest" and rng is not None:
        raise ValueError("rng was given but rounding='nearest'; pass rounding='stochastic' to use it")
    axes, split, inner, finite, b, y = _scaled_blocks(x, axis, block, fmt, scale_rounding)
    if rounding == "stochastic":
        y = stochastic_round(y, fmt, rng)
    data = merge_blocks(jnp.where(finite, y, jnp.nan).astype(fmt.dtype), x.shape, x)
    scale = merge_blocks(b.astype(jnp.uint8), [d for i, d in enumerate(split) if i not in inner], x)
    out = MXArray(data=data, scale=scale, axes=tuple(a - x.ndim for a in axes), block=block)
    if scale_layout == "natural":
        return out
    check_scale_layout(scale_layout, out.axes, block, data)
    return out.blocked()


def quantize_dequantize(
    x: jax.Array,
    *,
    axis: int | Sequence[int] = -1,
    block: str = "row",
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    out_dtype=jnp.float32,
    saturated: bool = False,
) -> jax.Array:
    """dequantize_products(quantize(x, ...), out_dtype) -- or, with saturated=True, dequantize(quantize(x,
    ...), out_dtype) -- bit for bit, without FP8 elements in between.

    The MX values a GEMM multiplies (round-to-nearest rounding only), in about a quarter of the round
    trip's elementwise ops: the elements rounded in float32 (formats/rounding.py) instead of converted to
    FP8 and decoded back. The XLA GEMM references
    (reference/gemm.py) spend most of their operand preparation here. Arguments as `quantize`; x is not
    differentiated (stop_gradient, as in quantize).
    """
    x = jax.lax.stop_gradient(check_quantize_input(x))
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    _, _, _, _, b, y = _scaled_blocks(x, axis, block, fmt, scale_rounding)
    elements = round_to_elements(y, fmt)
    out = decode_scale(b, elements)  # NaN where b == 0xFF
    if saturated:
        out = saturate(out, elements, out_dtype)  # elements are finite (|y| <= max); NaN blocks stay NaN
    return merge_blocks(out, x.shape, x).astype(out_dtype)


def dequantize(a: MXArray, dtype=jnp.float32) -> jax.Array:
    """Returns element * 2**(scale - 127) in `dtype` (default float32); NaN where the scale is 0xFF.

    A finite element whose product exceeds the output dtype's range (2**128 is reachable: under
    scale_rounding="up" the element of a block with amax near float32's maximum rounds up to 256 at scale
    2**120) saturates to +-the dtype's largest finite value (float32 3.4028235e38, bfloat16 3.3895314e38,
    float16 65504): finite MX values stay finite. Inf elements (E5M2) stay Inf. Either scale_layout.
    """
    _check_mx(a)
    a = a.natural()
    return decode_mx(a.data, a.scale, a.positive_axes(), dtype, saturated=True)


def dequantize_products(a: MXArray, dtype=jnp.float32) -> jax.Array:
    """element * 2**(scale - 127) as IEEE float32 products (an MX value beyond float32 overflows to +-Inf),
    then cast to `dtype`; NaN where the scale is 0xFF.

    The GEMM references' operand values: a GEMM forms these products in float32 (the MX GEMM kernel
    multiplies the FP8 products by the scales), so they keep IEEE overflow rather than `dequantize`'s
    saturation, and the bfloat16-operand path stays bit-identical to the float32 one.
    """
    _check_mx(a)
    a = a.natural()
    return decode_mx(a.data, a.scale, a.positive_axes(), dtype, saturated=False)


def _check_mx(a) -> None:
    if not isinstance(a, MXArray):
        raise ValueError(f"a must be an MXArray, got {type(a).__name__}")
    check_consistent(a, "a")


def fake_quantize(x: jax.Array, **kwargs) -> jax.Array:
    """dequantize(quantize(x, **kwargs), x.dtype): the values an MX GEMM actually sees.

    Differentiable with a straight-through estimator: the cotangent passes to `x` unchanged.
    """
    x = check_quantize_input(x)
    rng = kwargs.pop("rng", None)
    static = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()))
    return _fake_quantize_ste(x, rng, static)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _fake_quantize_ste(x, rng, static):
    return dequantize(quantize(x, rng=rng, **dict(static)), x.dtype)


def _fake_quantize_fwd(x, rng, static):
    return _fake_quantize_ste(x, rng, static), None


def _fake_quantize_bwd(static, _, g):
    return g, None


_fake_quantize_ste.defvjp(_fake_quantize_fwd, _fake_quantize_bwd)
