"""`mx_dot_general_quantized`: mx_dot_general whose output also leaves as an MXArray (the quantize epilogue).

  y, y_q = mx_dot_general_quantized(lhs, rhs, dimension_numbers, activation="gelu", bias=b)
  y, y_q, y_w = mx_dot_general_quantized(..., orientations=("row", "col"))     (or ("row", "wgrad"))
  out = mx_dot_general_handoff(y, w2, dn2, lhs_quantized=y_q, lhs_wgrad=y_w)   the next GEMM

y = activation(lhs . rhs (+ bias)) in the output dtype (differentiable) and y_q its MXArray, row blocks of
32 along the output's last axis, ready to be the next GEMM's `lhs_quantized` (no separate quantize pass).
With "col" also y_w, a WgradOperand: the COLUMN orientation of the same quantized value (blocks of 32
along the output's rows M = the tokens, aligned to one exponent per 128 M and transposed, gemm_operands'
"col" form: exactly what the next GEMM's weight gradient dW = y^T dOut contracts over M). The next GEMM
takes it through mx_dot_general_handoff, whose backward then skips quantizing y for its wgrad.
"wgrad" is the training form of "col": y_w is computed only when the call is differentiated (the custom
VJP's forward rule); the undifferentiated primal returns a NaN-filled placeholder (never a silent value;
XLA removes it when, as in mx_dot_general_handoff's primal, nothing reads it), so inference pays nothing.

Numerics (docs/numerics.md "Quantize epilogues"): with p = the float32 GEMM result (+ bias), the float32
value before any rounding to the output dtype,
  y_q = quantize(activation(p), axis=-1, dtype=config.dtype, scale_rounding=config.scale_rounding)
  y   = activation(p.astype(out_dtype))   (in out_dtype: the high-precision value the gradient flows through)
  gradient: autodiff of y through the activation (in out_dtype), then mx_dot_general's backward GEMMs.
  y_w = align128(quantize(activation(p), axis=-2), axis=-2) (as (G, N, Mp) / (G, Mp/128, N), G the batch
        dims, M the lhs free dims, N the rhs free dim; reference/gemm_align.py)
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
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.formats import BLOCK_SIZE, MXArray
from jax_mxfp8.kernels import registry
from jax_mxfp8.ops import mx_dot_kernel
from jax_mxfp8.ops.cotangents import remat_safe
from jax_mxfp8.ops.mx_dot_general import check_dot_arguments, mx_dot_general
from jax_mxfp8.ops.mx_dot_sm100 import SM100
from jax_mxfp8.ops.no_second_order import guard_bwd, guard_fwd
from jax_mxfp8.ops.quantize import quantize
from jax_mxfp8.ops.scope import named_op
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.gemm_operands import gemm_operands, gemm_operands_unsupported
from jax_mxfp8.primitives.mx_gemm_epilogue import ACTIVATIONS
from jax_mxfp8.reference.gemm import operand_layouts

__all__ = ["MXHandoff", "WgradOperand", "mx_dot_general_handoff", "mx_dot_general_quantized"]

ARCHS = mx_dot_kernel.ARCHS
ORIENTATIONS = (("row",), ("row", "col"), ("row", "wgrad"))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WgradOperand:
    """The column orientation of a GEMM output y (..., M, N) as the next GEMM's wgrad operand, in the form the
    kernel path of this GPU reads (its backend's wgrad_avals).

    Hopper (SM90, aligned):
      data  (G, N, Mp) float8_e4m3fn   align128(quantize(y, axis=-2)) transposed: K-major along M (the
                                       tokens), Mp = M rounded up to 128 (padding +0)
      scale (G, Mp/128, N) float32     one power-of-two scale per 128 rows and column (NaN for a NaN block)
    Blackwell (SM100, blocked):
      data  (G, N, M) float8_e4m3fn    quantize(y, axis=-2) transposed: K-major along M
      scale (G, ceil(N/128), ceil(M/128), 512) uint8   its E8M0 scales in the 128x4 blocked layout
    G = the dot's batch dims, M = the lhs free dims, N = the rhs free dim (a free reshape of y's layout).
    A non-differentiable carrier (its cotangent is zero), like MXArray."""

    data: jax.Array
    scale: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MXHandoff:
    """What a GEMM hands the next GEMM: its output's row MXArray (the next forward's lhs_quantized) and its
    column orientation (the next weight gradient's operand). flax/functional.py's linear takes it as
    x_quantized (the MLP's up -> GELU -> down)."""

    row: MXArray
    wgrad: WgradOperand


def _act(x: jax.Array, activation: str) -> jax.Array:
    return jax.nn.gelu(x, approximate=True) if activation == "gelu" else x


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _kernel_dot(lhs, rhs, lhs_q, rhs_q, kernel, activation, col, bias):
    # "wgrad": the primal runs the row-only kernel; the column outputs are NaN placeholders (module docstring)
    outs = _kernel_fwd(lhs, rhs, lhs_q, rhs_q, kernel, activation, col == "col", bias, residuals=False)[0]
    if col == "wgrad":
        g, m, _ = kernel.lhs.sizes
        (data, data_dt), (scale, scale_dt) = kernel.backend.wgrad_avals(g, kernel.rhs.sizes[1], m, jnp.float8_e4m3fn)
        fill = 0xFF if scale_dt == np.uint8 else jnp.nan  # a NaN scale (E8M0 0xFF): no silent value
        outs = (*outs, jnp.full(data, jnp.nan, data_dt), jnp.full(scale, fill, scale_dt))
    return outs


def _kernel_fwd(lhs, rhs, lhs_q, rhs_q, kernel, activation, col, bias, residuals=True):
    (q, s, pre, *qc), res = kernel.forward_quantized(
        lhs, rhs, lhs_q, rhs_q, activation, residuals=residuals, bias=bias, store_col=bool(col)
    )
    bias_like = None if bias is None else jnp.zeros((0,) * bias.ndim, bias.dtype)
    return (_act(pre, activation), q, s, *qc), (res, pre, bias_like)


def _kernel_bwd(kernel, activation, col, res, cts):
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


def _fwd_rule(lhs, rhs, lhs_q, rhs_q, kernel, activation, col, bias):
    return _kernel_fwd(lhs, rhs, lhs_q, rhs_q, kernel, activation, bool(col), bias)


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
    orientations: tuple[str, ...] = ("row",),
    **options,
) -> tuple[jax.Array, MXArray] | tuple[jax.Array, MXArray, WgradOperand]:
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
      orientations: ("row",), ("row", "col") or ("row", "wgrad") (module docstring): also return y_w.

    Returns:
      (y, y_q): y of lax.dot_general's output shape (batch, lhs free, rhs free dims) in the output dtype
      (default: the operands' result type); y_q an MXArray of the same shape, config.dtype elements, uint8
      scales of shape y.shape[:-1] + (N // 32,), axes (-1,), block "row". y is differentiable (the
      gradient flows through the activation into both operands and the bias); y_q is not (a carrier).
      With "col" / "wgrad" a third result y_w (WgradOperand; "wgrad": NaN unless differentiated).
    """
    impl.check(implementation)
    orientations = tuple(orientations)
    if orientations not in ORIENTATIONS:
        raise ValueError(f"orientations={orientations!r} is not one of {ORIENTATIONS}")
    col = orientations[1] if len(orientations) == 2 else ""
    activation = activation or ""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of (None, 'gelu')")
    config = dataclasses.replace(config or MXDotConfig(), **options)
    args = check_dot_arguments(
        lhs, rhs, dimension_numbers, config, rng, lhs_quantized, rhs_quantized, preferred_element_type, bias
    )  # mx_dot_general's checks, before any path is chosen: one error for a bad argument on every path
    lhs, rhs, lhs_l, rhs_l, lhs_quantized, rhs_quantized, out_dtype, bias = args
    out_shape = lhs_l.dims(lhs_l.batch) + lhs_l.dims(lhs_l.free) + rhs_l.dims(rhs_l.free)
    if not out_shape or out_shape[-1] % 32 or out_shape[-1] == 0:
        raise ValueError(
            f"the output's last axis (shape {out_shape}) must be a positive multiple of 32: y_q is blocked along it"
        )
    common = dict(config=config, rng=rng, lhs_quantized=lhs_quantized, rhs_quantized=rhs_quantized)
    if math.prod(out_shape) == 0:  # G or M is 0: nothing to compute, on any implementation
        y = mx_dot_general(lhs, rhs, dimension_numbers, preferred_element_type=out_dtype, bias=bias,
                           implementation=implementation, **common)  # fmt: skip
        return _empty_results(y, mx_dot_kernel.MatrixView.of(lhs_l).sizes, config, col)
    path, why, backend = _path(implementation, lhs, rhs, lhs_l, rhs_l, config, out_dtype, activation, bias, common)
    if path in ("cuda", "emulated"):
        views = mx_dot_kernel.MatrixView.of(lhs_l), mx_dot_kernel.MatrixView.of(rhs_l)
        kernel = mx_dot_kernel.KernelDot(*views, np.dtype(lhs.dtype), np.dtype(rhs.dtype), config, path, backend)
        bias = None if bias is None else jnp.asarray(bias)
        y, q, s, *w = _kernel_dot(lhs, rhs, lhs_quantized, rhs_quantized, kernel, activation, col, bias)
        y_q = MXArray(data=q, scale=s, axes=(-1,), block="row", scale_layout=backend.scale_layout)
        return (y.astype(out_dtype), y_q) + ((WgradOperand(*w),) if col else ())
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
    out = (_act(p.astype(out_dtype), activation), y_q)
    if not col:
        return out
    z = _act(jax.lax.stop_gradient(p), activation)
    g, m, _ = mx_dot_kernel.MatrixView.of(lhs_l).sizes
    z3 = z.astype(jnp.float32).reshape(g, m, out_shape[-1])
    # M (the tokens) need not be a multiple of 32 here (a packed jagged batch of 100 tokens; the kernel path
    # needs it, the two-pass path does not): zero rows up to the next block, as the reference's backward GEMMs
    # pad (reference/gemm.py quantized_3d): the last partial block's scale comes from its valid rows, and the
    # padded rows are the +0 that the (G, N, Mp) column form holds past M anyway (a no-op when M % 32 == 0).
    z3 = jnp.pad(z3, ((0, 0), (0, -m % BLOCK_SIZE), (0, 0)))
    # the producer kernel where it covers z3 (a float32 activation, the case that lands here on a GPU), else
    # the reference; both give the same bits. The form is the one the next GEMM's kernel path reads: aligned
    # (Hopper) or blocked (Blackwell: backend SM100)
    layout = "blocked" if backend is SM100 else "aligned"
    why = gemm_operands_unsupported(z3.shape, z3.dtype, config.dtype, config.scale_rounding, ("col",), layout)
    producer = registry.BlockedOperandsConfig if backend is SM100 else registry.GemmOperandsConfig
    family = (producer.op,) if backend is SM100 else ()
    col_path = impl.resolve(inner, why, producer.archs, op="mx_dot_general_quantized", family=family)
    w = gemm_operands(
        z3, dtype=config.dtype, scale_rounding=config.scale_rounding, orientations=("col",), path=col_path,
        layout=layout,
    )  # fmt: skip
    return out + (WgradOperand(*w["col"]),)


def _empty_results(y: jax.Array, lhs_sizes: tuple[int, int, int], config: MXDotConfig, col: str) -> tuple:
    """mx_dot_general_quantized's results for an empty output y (..., N) (mx_dot_general's, with its
    checks and zero gradients): y_q and y_w of the shapes the module docstring gives (y_w in the form this
    device's kernel path reads, WgradOperand), holding no element."""
    n = y.shape[-1]
    scale = jnp.zeros(y.shape[:-1] + (n // BLOCK_SIZE,), jnp.uint8)
    y_q = MXArray(jnp.zeros(y.shape, config.dtype), scale, (-1,), "row")
    if not col:
        return y, y_q
    g, m, _ = lhs_sizes
    (data, data_dt), (scale, scale_dt) = _backend().wgrad_avals(g, n, m, config.dtype)
    return y, y_q, WgradOperand(jnp.zeros(data, data_dt), jnp.zeros(scale, scale_dt))


def _backend() -> mx_dot_kernel.Backend:
    """The kernel path's backend of this machine's GPU: SM100 on cc 10.0 / 10.3, else SM90."""
    return SM100 if library.gpu_arch() in SM100.archs else mx_dot_kernel.SM90


def _path(implementation, lhs, rhs, lhs_l, rhs_l, config, out_dtype, activation, bias, common):
    """(the path: "cuda", "emulated" or "two-pass"; the reason the epilogue kernel does not cover the call
    or ""; the kernel path's backend, SM90 or SM100 by the device's arch, or None)."""
    if implementation == "xla":
        return "two-pass", "implementation='xla'", None
    backend = _backend()
    views = mx_dot_kernel.MatrixView.of(lhs_l), mx_dot_kernel.MatrixView.of(rhs_l)
    why = backend.unsupported(*views, config, common["lhs_quantized"], common["rhs_quantized"])
    if why is None:
        why = backend.unsupported_quantized(*views, config, out_dtype, activation, bias is not None)
    # no fallback warning: without the epilogue kernel the two-pass path runs mx_dot_general and quantize with
    # implementation=None (their kernels on a GPU; each warns for itself if it falls back), not the reference
    path = impl.resolve(
        implementation, why, backend.archs, op="mx_dot_general_quantized", warn=False, family=backend.families
    )
    return (path if path in ("cuda", "emulated") else "two-pass"), why or "", backend


# ------------------------------------------------------------------------------ the next GEMM's side
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _handoff_dot(lhs, rhs, lhs_q, w_data, w_scale, kernel, out_dtype, bias):
    return kernel.forward(lhs, rhs, lhs_q, None, out_dtype, residuals=False, bias=bias)[0]


def _handoff_fwd(lhs, rhs, lhs_q, w_data, w_scale, kernel, out_dtype, bias):
    out, res = kernel.forward(lhs, rhs, lhs_q, None, out_dtype, residuals=True, bias=bias, lhs_x=(w_data, w_scale))
    bias_like = None if bias is None else jnp.zeros((0,) * bias.ndim, bias.dtype)
    return out, (res, bias_like)


def _handoff_bwd(kernel, out_dtype, res, g):
    operands, bias_like = res
    d_lhs, d_rhs = kernel.backward(operands, g)
    d_bias = None
    if bias_like is not None:
        d_bias = jnp.sum(g.astype(jnp.float32), axis=tuple(range(g.ndim - bias_like.ndim))).astype(bias_like.dtype)
    return d_lhs, d_rhs, None, None, None, d_bias


_handoff_dot.defvjp(
    *remat_safe(
        guard_fwd(_handoff_fwd, "mx_dot_general_handoff", argnums=(0, 1)),
        guard_bwd(_handoff_bwd, "mx_dot_general_handoff"),
    )
)


def handoff_unsupported(
    lhs, rhs, dimension_numbers, config: MXDotConfig, lhs_quantized, lhs_wgrad, backend=mx_dot_kernel.SM90
) -> str | None:
    """Why mx_dot_general_handoff cannot run the kernel path of `backend` with lhs_wgrad as its wgrad residual
    (None: it can): the kernel path's reasons, or lhs_wgrad not the column orientation of lhs (G batch, M
    free, K contracting) in config.dtype in the backend's form (backend.wgrad_avals: SM90 (G, K, Mp) /
    (G, Mp/128, K) float32, SM100 (G, K, M) / (G, ceil(K/128), ceil(M/128), 512) uint8)."""
    lhs_l, rhs_l = operand_layouts(lhs.shape, rhs.shape, dimension_numbers)
    views = mx_dot_kernel.MatrixView.of(lhs_l), mx_dot_kernel.MatrixView.of(rhs_l)
    why = backend.unsupported(*views, config, lhs_quantized, None)
    if why:
        return why
    if not views[0].k_last or config.weight_grad != "mxfp8":
        return "the wgrad operand is the column orientation of a k-last lhs with weight_grad='mxfp8'"
    g, m, k = views[0].sizes
    want = backend.wgrad_avals(g, k, m, config.dtype)
    got = ((tuple(lhs_wgrad.data.shape), np.dtype(lhs_wgrad.data.dtype)),
           (tuple(lhs_wgrad.scale.shape), np.dtype(lhs_wgrad.scale.dtype)))  # fmt: skip
    if got != want:
        return f"lhs_wgrad is {got}; lhs of shape {tuple(lhs.shape)} needs {want}"
    return None


@named_op("mx_dot_general_handoff")
def mx_dot_general_handoff(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers,
    *,
    lhs_quantized: MXArray,
    lhs_wgrad: WgradOperand | None,
    preferred_element_type=None,
    config: MXDotConfig | None = None,
    rng: jax.Array | None = None,
    bias: jax.Array | None = None,
    implementation: str | None = None,
    **options,
) -> jax.Array:
    """mx_dot_general(lhs, rhs, ..., lhs_quantized=...) whose weight gradient takes lhs's column
    orientation from `lhs_wgrad` (the previous GEMM's epilogue wrote it: mx_dot_general_quantized with
    orientations ("row", "col" / "wgrad")) instead of quantizing lhs again.

    Same numerics as mx_dot_general with lhs_quantized, except the wgrad's lhs operand: quantize(the
    previous GEMM's float32 value) along M, where mx_dot_general quantizes lhs itself (its out_dtype
    rounding, e.g. bf16 gelu(bf16 pre)). Calls the kernel path does not cover (and lhs_wgrad None) are
    mx_dot_general's, lhs_wgrad ignored (implementation "cuda" / "emulated": ValueError with the reason).
    Arguments as mx_dot_general; returns its output."""
    impl.check(implementation)
    config = dataclasses.replace(config or MXDotConfig(), **options)
    if isinstance(lhs, MXArray):
        raise ValueError("lhs must be a float array for mx_dot_general_handoff; pass its MXArray as lhs_quantized")
    leaves = () if not isinstance(lhs_wgrad, WgradOperand) else (lhs_wgrad.data, lhs_wgrad.scale)
    if lhs_wgrad is not None and (
        not isinstance(lhs_wgrad, WgradOperand) or not all(hasattr(x, "shape") and hasattr(x, "dtype") for x in leaves)
    ):
        raise ValueError(
            f"lhs_wgrad must be a WgradOperand (mx_dot_general_quantized's third result with orientations "
            f"('row', 'col') or ('row', 'wgrad'), with array leaves) or None; got {lhs_wgrad!r}"
        )
    # mx_dot_general's checks (lhs_quantized: an MXArray of lhs's shape, consistent, blocked along K)
    args = check_dot_arguments(
        lhs, rhs, dimension_numbers, config, rng, lhs_quantized, None, preferred_element_type, bias
    )
    lhs, rhs, lhs_l, rhs_l, _, rhs_q, out_dtype, bias = args
    common = dict(preferred_element_type=out_dtype, config=config, rng=rng, bias=bias, rhs_quantized=rhs_q)
    if lhs_wgrad is None or implementation == "xla" or 0 in lhs.shape or 0 in rhs.shape:
        # mx_dot_general's path (an empty operand: its empty result or ValueError, on every implementation)
        return mx_dot_general(lhs, rhs, dimension_numbers, lhs_quantized=lhs_quantized, implementation=implementation,
                              **common)  # fmt: skip
    backend = _backend()
    why = handoff_unsupported(lhs, rhs, dimension_numbers, config, lhs_quantized, lhs_wgrad, backend)
    if why is None and rhs_q is not None:
        why = "rhs is an MXArray: the handoff kernel path quantizes rhs itself"
    path = impl.resolve(implementation, why, backend.archs, op="mx_dot_general_handoff", family=backend.families)
    if path not in ("cuda", "emulated"):
        return mx_dot_general(lhs, rhs, dimension_numbers, lhs_quantized=lhs_quantized, **common)
    views = mx_dot_kernel.MatrixView.of(lhs_l), mx_dot_kernel.MatrixView.of(rhs_l)
    kernel = mx_dot_kernel.KernelDot(*views, np.dtype(lhs.dtype), np.dtype(rhs.dtype), config, path, backend)
    w = jax.lax.stop_gradient((lhs_wgrad.data, lhs_wgrad.scale))
    return _handoff_dot(lhs, rhs, lhs_quantized, w[0], w[1], kernel, out_dtype, bias)
