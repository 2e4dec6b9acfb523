"""`rms_norm_quantize`: RMSNorm whose output also comes back as an MXArray for the next MX GEMM."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats import MXArray, element_format
from jax_mxfp8.formats.mxarray import check_scale_layout
from jax_mxfp8.formats.quantize import check_blockable, check_float32_range
from jax_mxfp8.formats.scales import check_scale_rounding
from jax_mxfp8.kernels import registry
from jax_mxfp8.ops.checks import check_eps, check_rank
from jax_mxfp8.ops.scope import named_op
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import rms_norm_quantize as rms_primitive
from jax_mxfp8.primitives.mx_gemm_sm100 import preferred_scale_layout
from jax_mxfp8.reference.rms_norm import rms_norm_bwd, rms_norm_quantize_fwd


def _forward(x, weight, eps, dtype, scale_rounding, path, scale_layout):
    if path != "xla":  # "cuda" or "emulated": the kernel call (resolved already)
        return rms_primitive.rms_norm_quantize_fwd(
            x, weight, eps=eps, dtype=dtype, scale_rounding=scale_rounding, implementation=path,
            scale_layout=scale_layout,
        )  # fmt: skip
    y, q = rms_norm_quantize_fwd(x, weight, eps, dtype=dtype, scale_rounding=scale_rounding)
    return y, (q.blocked() if scale_layout == "blocked" else q)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _rms_norm_quantize(x, weight, eps, dtype, scale_rounding, path, scale_layout):
    return _forward(x, weight, eps, dtype, scale_rounding, path, scale_layout)


def _fwd(x, weight, eps, dtype, scale_rounding, path, scale_layout):
    return _forward(x, weight, eps, dtype, scale_rounding, path, scale_layout), (x, weight)


def _bwd(eps, dtype, scale_rounding, path, scale_layout, res, cts):
    x, weight = res
    dy, _ = cts  # the MXArray output is a non-differentiable carrier of y: its gradient reaches y's users
    return rms_norm_bwd(x, weight, eps, dy)


_rms_norm_quantize.defvjp(_fwd, _bwd)


@named_op("rms_norm_quantize")
def rms_norm_quantize(
    x: jax.Array,
    weight: jax.Array,
    *,
    eps: float = 1e-6,
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    implementation: str | None = None,
    scale_layout: str | None = None,
) -> tuple[jax.Array, MXArray]:
    """RMSNorm over the last axis, returning the output and its MX quantization in one op.

    Args:
      x: (..., D) float array; D a multiple of 32.
      weight: (D,) scale.
      eps: added to the mean square; a positive finite number (ValueError otherwise).
      dtype: MX element dtype of the quantized output.
      scale_rounding: "up" (default) or "floor".
      implementation: None (default) uses the fused CuTe DSL kernel when the kernel library is built,
        the default backend is an NVIDIA GPU of compute capability 9.x / 10.x and the kernel covers the
        arguments (bfloat16 / float32 x with D <= 32768 / 16384), and the XLA reference otherwise;
        "xla" always uses the reference; "emulated" runs the kernel call's XLA emulation (any machine);
        "cuda" always uses the kernel (RuntimeError when the library or a suitable GPU is missing,
        ValueError when the kernel does not cover the arguments).
      scale_layout: the MXArray's scale layout: "natural", "blocked" (x of rank >= 2: the 128x4 layout the
        Blackwell MX GEMM reads, MXArray.scale_layout) or None (default): "blocked" where the MX GEMMs of
        this device read it (a compute-capability 10.x GPU, implementation not "xla": the RMSNorm -> GEMM
        hand-off then needs no re-layout pass), "natural" elsewhere.

    Returns:
      (y, y_mx): y = x * rsqrt(mean(x^2) + eps) * weight in x.dtype (computed in float32), and
      y_mx = quantize(y, axis=-1) bit for bit. Pass y_mx to mx_dot_general(y, w, ...,
      lhs_quantized=y_mx) to skip a quantize pass while gradients still flow through y. The kernel's
      y can differ from the reference's in the last place where their float32 sums of squares (summed
      in different orders) differ; its y_mx is always quantize(y) of its own y. Gradients use the
      reference backward for either implementation.
    """
    impl.check(implementation)
    eps = check_eps(eps)
    check_float32_range(x, "x")
    check_float32_range(weight, "weight")
    x, weight = jnp.asarray(x), jnp.asarray(weight)
    check_rank(x, 1, "x")
    if not jnp.issubdtype(x.dtype, jnp.floating) or np.dtype(x.dtype).itemsize < 2:
        raise ValueError(f"x has dtype {x.dtype}; rms_norm_quantize takes float32, bfloat16 or float16")
    if x.ndim < 1 or weight.shape != (x.shape[-1],):
        raise ValueError(f"weight has shape {weight.shape}; expected ({x.shape[-1] if x.ndim else '?'},)")
    check_blockable(x.shape, (x.ndim - 1,), name="x")
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    if scale_layout is None:
        scale_layout = "blocked" if x.ndim >= 2 and preferred_scale_layout(implementation) == "blocked" else "natural"
    check_scale_layout(scale_layout, (-1,), "row", x)
    path = "xla"
    if implementation != "xla":
        variant, why = rms_primitive.kernel_variant(x, weight, fmt.dtype, scale_rounding, scale_layout)
        archs = variant.archs if variant is not None else registry.ARCHS
        family = ("rms_norm_quantize_blocked",) if scale_layout == "blocked" else ()
        path = impl.resolve(implementation, why, archs, op="rms_norm_quantize", family=family)
    return _rms_norm_quantize(x, weight, float(eps), np.dtype(dtype), scale_rounding, path, scale_layout)
