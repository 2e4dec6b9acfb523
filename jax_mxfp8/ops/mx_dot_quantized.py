"""`mx_dot_general_quantized`: mx_dot_general whose output also leaves as an MXArray (the quantize epilogue).

  y, y_q = mx_dot_general_quantized(lhs, rhs, dimension_numbers, activation="gelu", bias=b)

y = activation(lhs . rhs (+ bias)) in the output dtype (differentiable) and y_q its MXArray, row blocks of
32 along the output's last axis, ready to be the next GEMM's `lhs_quantized` (no separate quantize pass).

Numerics (docs/numerics.md "Quantize epilogues"): with p = the float32 GEMM result (+ bias), the float32
value before any rounding to the output dtype,
  y_q = quantize(activation(p), axis=-1, dtype=config.dtype, scale_rounding=config.scale_rounding)
  y   = activation(p.astype(out_dtype))   (in out_dtype: the high-precision value the gradient flows through)
  gradient: autodiff of y through the activation (in out_dtype), then mx_dot_general's backward GEMMs.
The reference ("xla") computes exactly this by mx_dot_general(preferred_element_type=float32) and
quantize; the kernel path ("cuda", "emulated") runs the forward GEMM with the quantize epilogue
(primitives/mx_gemm_epilogue.py): y_q from the kernel's float32 accumulator (bits as quantize of it; the
GELU's tanh is the hardware's), p.astype(bf16) written beside it. Calls the epilogue does not cover fall back
(implementation=None) to the two-pass path, mx_dot_general then quantize, with the reason recorded
(implementation="cuda" raises ValueError with it).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats import MXArray
from jax_mxfp8.ops import mx_dot_kernel
from jax_mxfp8.ops.cotangents import remat_safe
from jax_mxfp8.ops.mx_dot_general import mx_dot_general
from jax_mxfp8.ops.no_second_order import guard_bwd, guard_fwd
from jax_mxfp8.ops.quantize import quantize
from jax_mxfp8.ops.scope import named_op
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.mx_gemm_epilogue import ACTIVATIONS
from jax_mxfp8.reference.gemm import operand_layouts
from jax_mxfp8.reference.gemm_config import MXDotConfig

ARCHS = mx_dot_kernel.ARCHS


def _act(x: jax.Array, activation: str) -> jax.Array:
    return jax.nn.gelu(x, approximate=True) if activation == "gelu" else x


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _kernel_dot(lhs, rhs, lhs_q, rhs_q, kernel, activation, bias):
    return _kernel_fwd(lhs, rhs, lhs_q, rhs_q, kernel, activation, bias, residuals=False)[0]


def _kernel_fwd(lhs, rhs, lhs_q, rhs_q, kernel, activation, bias, residuals=True):
    (q, s, pre), res = kernel.forward_quantized(lhs, rhs, lhs_q, rhs_q, activation, residuals=residuals, bias=bias)
    bias_like = None if bias is None else jnp.zeros((0,) * bias.ndim, bias.dtype)
    return (_act(pre, activation), q, s), (res, pre, bias_like)


def _kernel_bwd(kernel, activation, res, cts):
    operands, pre, bias_like = res
    g = cts[0]
    if activation:  # d_pre = activation'(pre) * d_y in pre's dtype (bf16): autodiff of y = act(pre)
        _, vjp = jax.vjp(lambda p: _act(p, activation), pre)
        g = vjp(g.astype(pre.dtype))[0]
    d_lhs, d_rhs = kernel.backward(operands, g)
    d_bias = None
    if bias_like is not None:
        lead = tuple(range(g.ndim - bias_like.ndim))
        d_bias = jnp.sum(g.astype(jnp.float32), axis=lead).astype(bias_like.dtype)
    return d_lhs, d_rhs, None, None, d_bias


def _fwd_rule(lhs, rhs, lhs_q, rhs_q, kernel, activation, bias):
    return _kernel_fwd(lhs, rhs, lhs_q, rhs_q, kernel, activation, bias)


_kernel_dot.defvjp(
    *remat_safe(
        guard_fwd(_fwd_rule, "mx_dot_general_quantized", argnums=(0, 1)),
        guard_bwd(_kernel_bwd, "mx_dot_general_quantized"),
    )
)


@named_op("mx_dot_general_quantized")
def mx_dot_general_quantized(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers,
    *,
    activation: str | None = None,
    preferred_element_type=None,
    config: MXDotConfig | None = None,
    rng: jax.Array | None = None,
    lhs_quantized: MXArray | None = None,
    rhs_quantized: MXArray | None = None,
    bias: jax.Array | None = None,
    implementation: str | None = None,
    **options,
) -> tuple[jax.Array, MXArray]:
    """`mx_dot_general` (+ bias) (-> activation) returning its output and the output's MXArray.

    Args:
      lhs, rhs, dimension_numbers, preferred_element_type, config, rng, lhs_quantized, rhs_quantized,
        bias, **options: as for mx_dot_general (lhs, rhs float arrays; the output's last axis, of size N,
        must be a positive multiple of 32).
      activation: None or "gelu" (jax.nn.gelu's default tanh form), applied in float32 to the GEMM result
        (+ bias) before the quantization.
      implementation: None (the epilogue kernel when it covers the call, else the two-pass path:
        mx_dot_general then quantize, each choosing its own implementation), "xla" (the reference: both
        in XLA), "emulated" (the kernel path in XLA, any machine) or "cuda" (the kernel; ValueError naming
        why when it does not cover the call).

    Returns:
      (y, y_q): y of lax.dot_general's output shape (batch, lhs free, rhs free dims) in the output dtype
      (default: the operands' result type); y_q an MXArray of the same shape, config.dtype elements, uint8
      scales of shape y.shape[:-1] + (N // 32,), axes (-1,), block "row". y is differentiable (the
      gradient flows through the activation into both operands and the bias); y_q is not (a carrier).
    """
    impl.check(implementation)
    activation = activation or ""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of (None, 'gelu')")
    config = dataclasses.replace(config or MXDotConfig(), **options)
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    lhs_l, rhs_l = operand_layouts(lhs.shape, rhs.shape, dimension_numbers)
    out_shape = lhs_l.dims(lhs_l.batch) + lhs_l.dims(lhs_l.free) + rhs_l.dims(rhs_l.free)
    if not out_shape or out_shape[-1] % 32 or out_shape[-1] == 0:
        raise ValueError(
            f"the output's last axis (shape {out_shape}) must be a positive multiple of 32: y_q is blocked along it"
        )
    try:
        out_dtype = np.dtype(preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype))
    except TypeError as e:
        raise ValueError(f"preferred_element_type={preferred_element_type!r} is not a dtype") from e
    common = dict(config=config, rng=rng, lhs_quantized=lhs_quantized, rhs_quantized=rhs_quantized)
    path, why = _path(implementation, lhs, rhs, lhs_l, rhs_l, config, out_dtype, activation, bias, common)
    if path in ("cuda", "emulated"):
        views = mx_dot_kernel.MatrixView.of(lhs_l), mx_dot_kernel.MatrixView.of(rhs_l)
        kernel = mx_dot_kernel.KernelDot(*views, np.dtype(lhs.dtype), np.dtype(rhs.dtype), config, path)
        bias = None if bias is None else jnp.asarray(bias)
        y, q, s = _kernel_dot(lhs, rhs, lhs_quantized, rhs_quantized, kernel, activation, bias)
        return y.astype(out_dtype), MXArray(data=q, scale=s, axes=(-1,), block="row")
    # the two-pass path (the reference when implementation="xla")
    inner = "xla" if implementation == "xla" else None
    p = mx_dot_general(
        lhs, rhs, dimension_numbers, preferred_element_type=jnp.float32, bias=bias, implementation=inner, **common
    )
    y_q = quantize(
        _act(jax.lax.stop_gradient(p), activation),
        axis=-1,
        dtype=config.dtype,
        scale_rounding=config.scale_rounding,
        implementation=inner,
    )
    return _act(p.astype(out_dtype), activation), y_q


def _path(implementation, lhs, rhs, lhs_l, rhs_l, config, out_dtype, activation, bias, common) -> tuple[str, str]:
    """(the path: "cuda", "emulated" or "two-pass"; the reason the epilogue kernel does not cover the call
    or "")."""
    if implementation == "xla":
        return "two-pass", "implementation='xla'"
    views = mx_dot_kernel.MatrixView.of(lhs_l), mx_dot_kernel.MatrixView.of(rhs_l)
    why = mx_dot_kernel.kernel_unsupported(*views, config, lhs_q=common["lhs_quantized"], rhs_q=common["rhs_quantized"])
    if why is None:
        why = mx_dot_kernel.kernel_unsupported_quantized(*views, config, out_dtype, activation, bias is not None)
    if why is None and (not jnp.issubdtype(lhs.dtype, jnp.floating) or not jnp.issubdtype(rhs.dtype, jnp.floating)):
        why = "non-float operands (mx_dot_general names them)"
    if why is None and implementation is None and library.gpu_major() == 10:
        why = "Blackwell: the epilogue kernel is Hopper's (sm_90a); the GEMM runs in cuDNN"
    path = impl.resolve(implementation, why, ARCHS, op="mx_dot_general_quantized")
    return (path if path in ("cuda", "emulated") else "two-pass"), why or ""
