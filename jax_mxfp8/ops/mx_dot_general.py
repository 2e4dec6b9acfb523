"""`mx_dot_general`: a drop-in `lax.dot_general` that multiplies in MXFP8 forward and backward."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.formats import MXArray, dequantize
from jax_mxfp8.formats.mxarray import check_consistent
from jax_mxfp8.formats.quantize import check_float32_range
from jax_mxfp8.ops import mx_dot_kernel
from jax_mxfp8.ops.cotangents import remat_safe, zero_cotangent
from jax_mxfp8.ops.mx_dot_blackwell import cudnn_dot_general, cudnn_unsupported
from jax_mxfp8.ops.mx_dot_sm100 import SM100
from jax_mxfp8.ops.mx_dot_sm100 import kernel_unsupported as sm100_unsupported
from jax_mxfp8.ops.no_second_order import guard_bwd, guard_fwd
from jax_mxfp8.ops.scope import named_op
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library
from jax_mxfp8.reference import gemm_dims
from jax_mxfp8.reference.gemm import OperandLayout, operand_layouts

IMPLEMENTATIONS = impl.IMPLEMENTATIONS


def choose_path(
    implementation: str | None,
    kernel_why_not: str | None,
    cudnn_why_not: str | None,
    sm100_why_not: str | None = None,
) -> tuple[str, mx_dot_kernel.Backend | None]:
    """(path, backend) of one call: path "xla", "emulated", "cuda" (an MX GEMM kernel path) or "cudnn";
    backend SM90 / SM100 (ops/mx_dot_kernel.py, ops/mx_dot_sm100.py) on the kernel paths, else None.

    The device's arch picks the kernel path (library.gpu_arch; library.forced_gpu in tests): on a compute
    capability 10.0 / 10.3 GPU (sm_100f) the Blackwell MX GEMM (SM100, `sm100_why_not` = why it does not
    cover the call), whose kernel families run their first-use self-test before the first call; with
    implementation=None a call it does not take (or whose kernels are disabled) goes to
    jax.nn.scaled_dot_general (cuDNN's block-scaled GEMM, ops/mx_dot_blackwell.py) when that covers it
    (`cudnn_why_not`), else to the XLA reference; "cuda" raises instead. Everywhere else the one policy of
    jax_mxfp8.primitives.implementation applies to the Hopper kernel (`kernel_why_not`): sm_90a runs it,
    other GPUs (consumer Blackwell, cc 12.x, among them) and CPUs the reference.
    """
    impl.check(implementation)
    if implementation != "xla" and library.gpu_arch() in SM100.archs:
        if implementation is None:
            why = impl.kernel_blocker(sm100_why_not, SM100.archs, SM100.families)
            if why is not None and cudnn_why_not is None:
                reason = f"Blackwell: jax.nn.scaled_dot_general (cuDNN); our sm100 kernel path does not run: {why}"
                impl.note("mx_dot_general", implementation, "cudnn", reason)
                if "disabled" in why:
                    impl.warn_once("mx_dot_general", "self-test", f"jax_mxfp8.mx_dot_general: {reason}. Fix: "
                                   f"{impl.FIX_SELF_TEST}.")  # fmt: skip
                return "cudnn", None
        path = impl.resolve(implementation, sm100_why_not, SM100.archs, op="mx_dot_general", family=SM100.families)
        return path, (SM100 if path != "xla" else None)
    path = impl.resolve(implementation, kernel_why_not, mx_dot_kernel.ARCHS, op="mx_dot_general")
    return path, (mx_dot_kernel.SM90 if path != "xla" else None)


def _check_prequantized(name: str, q: MXArray | None, layout: OperandLayout, shape) -> None:
    if q is None:
        return
    if not isinstance(q, MXArray):
        raise ValueError(f"{name} must be an MXArray, got {type(q).__name__}")
    check_consistent(q, name)
    if tuple(q.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {q.shape}, but its operand has shape {tuple(shape)}")
    if len(layout.contract) != 1 or (layout.contract[0] not in q.positive_axes()):
        raise ValueError(
            f"{name} is blocked along axes {q.positive_axes()}, but the GEMM contracts axes {layout.contract}: "
            "pre-quantized operands must be blocked along their single contracting axis"
        )


class DotArguments(NamedTuple):
    """mx_dot_general's checked arguments (check_dot_arguments)."""

    lhs: jax.Array
    rhs: jax.Array
    lhs_l: OperandLayout
    rhs_l: OperandLayout
    lhs_quantized: MXArray | None
    rhs_quantized: MXArray | None
    out_dtype: np.dtype
    bias: jax.Array | None


def check_dot_arguments(
    lhs,
    rhs,
    dimension_numbers,
    config: MXDotConfig,
    rng,
    lhs_quantized,
    rhs_quantized,
    preferred_element_type,
    bias,
    names: tuple[str, str] = ("lhs", "rhs"),
) -> DotArguments:
    """The argument checks of mx_dot_general, shared by every GEMM entry point (mx_dot_general_quantized,
    mx_dot_general_handoff, fsdp_mx_dot) so that a bad argument gets one ValueError, naming it (`names`:
    the caller's names of lhs and rhs; their MXArray forms are `name`_quantized), on every path. An MXArray
    lhs / rhs becomes its dequantized value (no gradient) plus the pre-quantized operand."""
    ln, rn = names
    if isinstance(lhs, MXArray):
        lhs, lhs_quantized = jax.lax.stop_gradient(dequantize(check_consistent(lhs, ln))), lhs
    if isinstance(rhs, MXArray):
        rhs, rhs_quantized = jax.lax.stop_gradient(dequantize(check_consistent(rhs, rn))), rhs
    check_float32_range(lhs, ln)
    check_float32_range(rhs, rn)
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    for name, x in ((ln, lhs), (rn, rhs)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} has dtype {x.dtype}; MX GEMMs take floating-point operands")
    lhs_l, rhs_l = operand_layouts(lhs.shape, rhs.shape, dimension_numbers)
    _check_prequantized(f"{ln}_quantized", lhs_quantized, lhs_l, lhs.shape)
    _check_prequantized(f"{rn}_quantized", rhs_quantized, rhs_l, rhs.shape)
    if config.hadamard_seed is not None and (lhs_quantized is not None or rhs_quantized is not None):
        raise ValueError("hadamard_seed cannot be combined with pre-quantized operands (they are not rotated)")
    if config.grad_rounding == "stochastic" and rng is None:
        raise ValueError("grad_rounding='stochastic' needs rng=jax.random.key(...)")
    try:
        out_dtype = np.dtype(preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype))
    except TypeError as e:
        raise ValueError(f"preferred_element_type={preferred_element_type!r} is not a dtype") from e
    if bias is not None:
        bias = jnp.asarray(bias)
        if not jnp.issubdtype(bias.dtype, jnp.floating) or bias.shape != rhs_l.dims(rhs_l.free):
            raise ValueError(
                f"bias must be a float array of the rhs free dims' shape {rhs_l.dims(rhs_l.free)}, "
                f"got {bias.dtype} {bias.shape}"
            )
    return DotArguments(lhs, rhs, lhs_l, rhs_l, lhs_quantized, rhs_quantized, out_dtype, bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _mx_dot(lhs, rhs, lhs_q, rhs_q, rng, dimension_numbers, out_dtype, config, kernel, bias):
    if kernel is not None:  # the primal alone: only the forward orientations, no residuals
        return kernel.forward(lhs, rhs, lhs_q, rhs_q, out_dtype, residuals=False, bias=bias)[0]
    out, _ = _mx_dot_fwd(lhs, rhs, lhs_q, rhs_q, rng, dimension_numbers, out_dtype, config, kernel, bias)
    return out


def _mx_dot_fwd(lhs, rhs, lhs_q, rhs_q, rng, dimension_numbers, out_dtype, config, kernel, bias):
    # the bias cotangent's rank and dtype, as an empty array (residuals are arrays)
    bias_like = None if bias is None else jnp.zeros((0,) * bias.ndim, bias.dtype)
    if kernel is not None:
        out, res = kernel.forward(lhs, rhs, lhs_q, rhs_q, out_dtype, residuals=True, bias=bias)
        return out, (res, rng, bias_like)
    lhs_l, rhs_l = operand_layouts(lhs.shape, rhs.shape, dimension_numbers)
    # in the operands' own layout (reference/gemm_dims.py): no flattening of sharded free dimensions
    out = gemm_dims.forward(lhs, rhs, lhs_l, rhs_l, config, lhs_q=lhs_q, rhs_q=rhs_q)
    if bias is not None:  # added to the float32 product before the one rounding to out_dtype
        out = out + bias.astype(jnp.float32)  # bias has the rhs free dims' shape: the trailing output axes
    # No MXArray in the residuals (the backward re-quantizes lhs / rhs and returns None for them): under
    # jax.checkpoint an FP8 residual is corrupted (ops/cotangents.py; remat_safe covers the kernel's)
    return out.astype(out_dtype), ((lhs, rhs), rng, bias_like)


def _mx_dot_bwd(dimension_numbers, out_dtype, config, kernel, res, g):
    operands, rng, bias_like = res
    zeros = None, None, zero_cotangent(rng)  # None: zero cotangents for the MXArrays
    d_bias = None  # the cotangent summed in float32 over every axis but the rhs free ones (bias's axes)
    if bias_like is not None:
        lead = tuple(range(g.ndim - bias_like.ndim))
        d_bias = jnp.sum(g.astype(jnp.float32), axis=lead).astype(bias_like.dtype)
    if kernel is not None:
        return kernel.backward(operands, g) + zeros + (d_bias,)
    lhs, rhs = operands
    lhs_l, rhs_l = operand_layouts(lhs.shape, rhs.shape, dimension_numbers)
    d_lhs, d_rhs = gemm_dims.backward(lhs, rhs, g, lhs_l, rhs_l, config, rng)
    return (d_lhs.astype(lhs.dtype), d_rhs.astype(rhs.dtype)) + zeros + (d_bias,)


# grad of grad would be silently zero (quantized operands): raise instead (ops/no_second_order.py)
# FP8 residuals (the kernel path's quantized operands) travel as bits: remat-safe (ops/cotangents.py)
_mx_dot.defvjp(
    *remat_safe(guard_fwd(_mx_dot_fwd, "mx_dot_general", argnums=(0, 1)), guard_bwd(_mx_dot_bwd, "mx_dot_general"))
)


@named_op("mx_dot_general")
def mx_dot_general(
    lhs: jax.Array | MXArray,
    rhs: jax.Array | MXArray,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    *,
    config: MXDotConfig | None = None,
    rng: jax.Array | None = None,
    lhs_quantized: MXArray | None = None,
    rhs_quantized: MXArray | None = None,
    implementation: str | None = None,
    bias: jax.Array | None = None,
    out_sharding=None,
    **options,
) -> jax.Array:
    """`lax.dot_general` with MXFP8 operands in the forward and both backward GEMMs.

    Forward: lhs and rhs are quantized in row blocks of 32 along their (flattened) contracting axes and
    multiplied with FP32 accumulation. Backward (matches jax.nn.scaled_dot_general with mxfp8 configs):
    d_lhs = Q(G along N) @ Q(rhs along N), d_rhs = Q(G along M)^T @ Q(lhs along M).

    Args:
      lhs, rhs: float arrays (any float dtype), or MXArrays already quantized along their single
        contracting axis (pre-quantized activations; an MXArray operand gets no gradient and its
        backward GEMM re-quantizes its dequantized values along the other axis).
      dimension_numbers: ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch)) as in lax.dot_general.
        The flattened contracted size must be a multiple of 32; the free sizes M and N need not be (the
        backward GEMMs, which contract over them, treat a partial last block by its valid elements).
      precision: accepted for lax.dot_general compatibility and ignored (MX fixes the precision).
      preferred_element_type: output dtype; default: the result type of the (dequantized) operands.
      config: an MXDotConfig; keyword `options` (e.g. weight_grad="bf16", grad_rounding="stochastic",
        hadamard_seed=0, dtype=jnp.float8_e5m2) override its fields.
      rng: PRNG key for grad_rounding="stochastic".
      lhs_quantized, rhs_quantized: optional MXArray forms of lhs / rhs (e.g. from rms_norm_quantize):
        the forward GEMM uses them instead of quantizing again, while the gradient still flows to the
        high-precision lhs / rhs.
      implementation: None (default: the fastest path that covers the call), "xla" (the XLA reference),
        "emulated" (the kernel path with its FFI calls emulated in XLA, any machine) or "cuda" (the MX GEMM
        kernel path of this GPU: Hopper's ops/mx_dot_kernel.py, Blackwell's ops/mx_dot_sm100.py; with None
        a call the Blackwell kernels do not take runs jax.nn.scaled_dot_general). See choose_path.
      bias: optional float array of the rhs free dims' shape (e.g. (F,) for x (..., D) @ w (D, F)), added
        in float32 to the float32 product before the one rounding to the output dtype (the kernel adds it
        in its epilogue); it gets a gradient (the cotangent summed over the other output axes).
      out_sharding: accepted for lax.dot_general compatibility; must be None.

    Returns:
      Array of lax.dot_general's output shape: batch dims, lhs free dims, rhs free dims. An empty output
      (a batch or free size 0) comes back without running anything, on every implementation, and the
      operands' gradients are zeros of their shapes.
    """
    impl.check(implementation)
    if out_sharding is not None:
        raise ValueError("out_sharding is not supported by mx_dot_general; shard the inputs instead")
    del precision
    config = dataclasses.replace(config or MXDotConfig(), **options)
    args = check_dot_arguments(
        lhs, rhs, dimension_numbers, config, rng, lhs_quantized, rhs_quantized, preferred_element_type, bias
    )
    lhs, rhs, lhs_l, rhs_l, lhs_quantized, rhs_quantized, out_dtype, bias = args
    out_shape = lhs_l.dims(lhs_l.batch) + lhs_l.dims(lhs_l.free) + rhs_l.dims(rhs_l.free)
    if math.prod(out_shape) == 0:
        # nothing to compute: lax.dot_general's empty output on every implementation, zero gradients of the
        # operands' shapes (docs/numerics.md "Zero-size inputs")
        return jnp.zeros(out_shape, out_dtype)
    dn = ((lhs_l.contract, rhs_l.contract), (lhs_l.batch, rhs_l.batch))
    path, backend = _path(implementation, lhs_l, rhs_l, config, lhs_quantized, rhs_quantized)
    if path == "cudnn":
        if bias is None:
            return cudnn_dot_general(lhs, rhs, dn, out_dtype)
        return (cudnn_dot_general(lhs, rhs, dn, jnp.float32) + bias.astype(jnp.float32)).astype(out_dtype)
    kernel = None
    if path in ("cuda", "emulated"):
        views = mx_dot_kernel.MatrixView.of(lhs_l), mx_dot_kernel.MatrixView.of(rhs_l)
        kernel = mx_dot_kernel.KernelDot(*views, np.dtype(lhs.dtype), np.dtype(rhs.dtype), config, path, backend)
    else:  # the reference reads natural scales
        lhs_quantized = None if lhs_quantized is None else lhs_quantized.natural()
        rhs_quantized = None if rhs_quantized is None else rhs_quantized.natural()
    return _mx_dot(lhs, rhs, lhs_quantized, rhs_quantized, rng, dn, out_dtype, config, kernel, bias)


def _path(implementation, lhs_l, rhs_l, config, lhs_q, rhs_q) -> tuple[str, mx_dot_kernel.Backend | None]:
    if implementation == "xla":
        return "xla", None
    g, m, k = (int(np.prod(lhs_l.dims(a), dtype=np.int64)) for a in (lhs_l.batch, lhs_l.free, lhs_l.contract))
    n = int(np.prod(rhs_l.dims(rhs_l.free), dtype=np.int64))
    views = mx_dot_kernel.MatrixView.of(lhs_l), mx_dot_kernel.MatrixView.of(rhs_l)
    kernel_why_not = mx_dot_kernel.kernel_unsupported(*views, config, lhs_q=lhs_q, rhs_q=rhs_q)
    sm100_why_not = sm100_unsupported(*views, config, lhs_q, rhs_q)
    cudnn_why_not = cudnn_unsupported(config, sizes=(g, m, n, k), prequantized=lhs_q is not None or rhs_q is not None)
    return choose_path(implementation, kernel_why_not, cudnn_why_not, sm100_why_not)
