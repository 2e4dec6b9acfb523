"""Public `quantize` / `dequantize` (exported as jax_mxfp8.quantize / jax_mxfp8.dequantize): the layer-1
functions of jax_mxfp8.formats with an `implementation` switch that can route them to the CuTe DSL
kernels (jax_mxfp8.primitives.quantize)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats import MXArray
from jax_mxfp8.formats import dequantize as ref_dequantize
from jax_mxfp8.formats import quantize as ref_quantize
from jax_mxfp8.ops.scope import named_op
from jax_mxfp8.primitives import quantize as quantize_primitive


@named_op("quantize")
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
    implementation: str | None = None,
) -> MXArray:
    """Quantizes `x` to MXFP8: FP8 elements with one E8M0 scale per block.

    Same arguments and results as `jax_mxfp8.formats.quantize` (see there), plus:
    concrete float64 input holding finite values beyond float32's range raises a ValueError (under jit
    their blocks become NaN blocks; docs/numerics.md "Float32 range").

    Args:
      implementation: None (default) uses the CuTe DSL kernel when the kernel library is built, the
        default backend is an NVIDIA GPU of compute capability 9.x / 10.x (Hopper, Blackwell) and the
        kernels cover the arguments (float32 / bfloat16 input of rank >= 2 whose last two dimensions
        are multiples of 32; row blocks along the last or second-to-last axis, or 32x32 square blocks
        over the last two; round to nearest), and the XLA reference otherwise. "xla" always uses the
        reference. "cuda" always uses the kernel: RuntimeError when the library or a suitable GPU is
        missing, ValueError when the kernels do not cover the arguments. "emulated" runs the kernel
        call's XLA emulation through the same partitioning and batching (any machine; for tests).
      scale_layout: "natural" (default) or "blocked": row blocks along the last axis of a rank >= 2 x with
        the scales in the 128x4 layout of Blackwell's block-scaled MMA (MXArray.scale_layout), the operand
        form of the sm100 MX GEMM (the Blackwell producer kernel on sm_100f, the reference elsewhere).

    The kernel and the reference give bit-identical results (tests/quantize/test_quantize_kernels_gpu.py).
    """
    if implementation == "xla":
        return ref_quantize(
            x, axis=axis, block=block, dtype=dtype, scale_rounding=scale_rounding, rounding=rounding, rng=rng,
            scale_layout=scale_layout,
        )  # fmt: skip
    return quantize_primitive.quantize(
        x,
        axis=axis,
        block=block,
        dtype=dtype,
        scale_rounding=scale_rounding,
        rounding=rounding,
        rng=rng,
        implementation=implementation,
        scale_layout=scale_layout,
    )


@named_op("dequantize")
def dequantize(a: MXArray, dtype=jnp.float32, *, implementation: str | None = None) -> jax.Array:
    """Returns element * 2**(scale - 127) in `dtype` (default float32); NaN where the scale is 0xFF.

    `implementation` as for `quantize` (the kernels cover row / column / square blocks over the last
    two axes of rank >= 2 arrays, to float32 / bfloat16); bit-identical either way. A finite MX value beyond
    the output dtype's range (2**128 is reached near float32's maximum under scale_rounding="up") saturates
    to +-the dtype's largest finite value, in the reference and the kernels alike (docs/numerics.md
    "Float32 range"); Inf elements (E5M2) stay Inf and NaN blocks NaN.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"dtype={dtype!r} is not a dtype") from e
    if not jnp.issubdtype(dt, jnp.floating) or np.dtype(dt).itemsize < 2:
        raise ValueError(f"dtype={dt.name}: dequantize outputs float32 (default), bfloat16 or float16")
    if implementation == "xla":
        return ref_dequantize(a, dtype)
    return quantize_primitive.dequantize(a, dtype, implementation=implementation)
