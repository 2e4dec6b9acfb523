"""The Blackwell backend of mx_dot_general's kernel path (ops/mx_dot_kernel.py): SM100.

The same dataflow as the Hopper path (one producer pass per operand writing the orientations the forward,
dgrad and wgrad GEMMs contract; the gradient G's two orientations from one pass), on:
  producer  primitives/gemm_operands.py, layout "blocked" (kernels/sm100/blocked_operands.py): data
            quantized per the contract, contracting axis last (the "col" orientation transposed), E8M0
            scales in the 128x4 blocked layout the tcgen05 MMA reads -- no 128-run alignment, no padding
  GEMM      primitives/mx_gemm_sm100.py: c = a @ b^T per batch (+ bias), plain epilogue; the forward of
            mx_dot_general_quantized with the row (or row + column) quantize epilogue
So on this path the forward, dgrad and wgrad GEMMs compute the contract's numerics (reference/gemm.py):
the same quantized operands, each 32-block's product exact, summed in float32 (the kernel in ascending
block order; the reference in XLA's dot order: the same bits wherever the sums are exact).

Hand-offs: a caller's MXArray (rms_norm_quantize, mx_dot_general_quantized) whose scales are already blocked
(MXArray.scale_layout "blocked") goes to the GEMM as it is when its rows flatten freely into the GEMM's M
(the blocked tiles of every leading index whole: the row axis a multiple of 128, or one leading index);
otherwise, and for natural scales, its scales are re-laid (an XLA transpose of the scale bytes).
The quantize epilogue's row output is a blocked MXArray, its column orientation (WgradOperand) the wgrad
operand (G, N, M) E4M3 + (G, ceil(N/128), ceil(M/128), 512) scales.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.formats import MXArray, from_blocked_scales, to_blocked_scales
from jax_mxfp8.ops.mx_dot_kernel import (
    KERNEL_OUT_DTYPES,
    Backend,
    MatrixView,
    config_unsupported,
    operands,
    prequantized_unsupported,
)
from jax_mxfp8.primitives import mx_gemm_sm100 as sm100
from jax_mxfp8.primitives.gemm_operands import gemm_operands_unsupported

E4M3 = np.dtype(jnp.float8_e4m3fn)
FAMILIES = (sm100.FAMILY, "blocked_operands")
"""The kernel families this path launches (each with a first-use self-test, primitives/sm100_self_tests.py)."""


def _tiles(x: int) -> int:
    return -(-x // 128)


def _blocked_rows(scale: jax.Array, lead: tuple[int, ...], rows: int, cols: int, g: int, x: int) -> jax.Array:
    """A blocked scale of data (*lead, rows, K) (scale (*lead, ceil(rows/128), ceil(cols/4), 512)) as the
    blocked scale of the same data viewed as (g, x, K): a free reshape when every leading index holds whole
    128-row tiles (rows % 128 == 0) or there is one per g; else re-laid through the natural layout."""
    if rows % 128 == 0 or math.prod(lead) == g:
        return scale.reshape(g, _tiles(x), *scale.shape[-2:])
    natural = from_blocked_scales(scale, rows, cols).reshape(g, x, cols)
    return to_blocked_scales(natural)


def _prequantized(view: MatrixView, q: MXArray):
    """A caller's MXArray (row blocks along the single, last, contracting axis) as the GEMM's (data (G, X, K),
    blocked scale (G, ceil(X/128), ceil(K/128), 512))."""
    g, x, k = view.sizes
    data = q.data.reshape(g, x, k)
    if q.scale_layout == "blocked":
        *lead, rows, _ = q.shape
        return data, _blocked_rows(q.scale, tuple(lead), rows, k // 32, g, x)
    return data, to_blocked_scales(q.scale.reshape(g, x, k // 32))


def _gemm(a, b, out_dtype, path: str, bias: jax.Array | None = None) -> jax.Array:
    """c = a @ b^T (+ bias, float32) per batch in `out_dtype` (computed in float32 unless bfloat16 / float32)."""
    kernel_dtype = out_dtype if np.dtype(out_dtype) in KERNEL_OUT_DTYPES else jnp.float32
    bias = None if bias is None else bias.astype(jnp.float32).reshape(-1)
    (c,) = sm100.mx_gemm_sm100(a[0], b[0], a[1], b[1], bias, out_dtype=kernel_dtype, path=path)
    return c.astype(out_dtype)


def _gemm_quantized(a, b, bias, activation: str, store_col: bool, path: str):
    """(q, s, pre[, qc, sc]): the row (rowcol) epilogue, pre = c in bfloat16."""
    c, *rest = sm100.mx_gemm_sm100(
        a[0], b[0], a[1], b[1], bias, out_dtype=jnp.bfloat16, epilogue="rowcol" if store_col else "row",
        activation=activation, path=path,
    )  # fmt: skip
    q, s, *col = rest
    return (q, s, c, *col)


def _row_scale(s: jax.Array, out_shape: tuple[int, ...]) -> jax.Array:
    """The epilogue's s (G, ceil(M/128), ceil(N/128), 512) as the blocked scale of the output (*lead, R, N)."""
    *lead, rows, n = out_shape
    g = s.shape[0]
    if rows % 128 == 0 or math.prod(lead) == g:
        return s.reshape(*lead, _tiles(rows), _tiles(n), 512)
    m = math.prod(lead) * rows // g
    natural = from_blocked_scales(s, m, n // 32).reshape(*lead, rows, n // 32)
    return to_blocked_scales(natural)


def _wgrad_avals(g: int, n: int, m: int, dtype):
    return ((g, n, m), np.dtype(dtype)), ((g, _tiles(n), _tiles(m), 512), np.dtype(jnp.uint8))


def kernel_unsupported(
    lhs_view: MatrixView, rhs_view: MatrixView, config: MXDotConfig, lhs_q: MXArray | None, rhs_q: MXArray | None
) -> str | None:
    """Why the Blackwell kernel path does not cover a call (None when it does)."""
    why = config_unsupported(config)
    if why:
        return why
    if np.dtype(config.dtype) != E4M3 or np.dtype(config.grad_dtype) != E4M3:
        return "the Blackwell MX GEMM takes float8_e4m3fn operands and gradients (config.dtype, grad_dtype)"
    g, m, k = lhs_view.sizes
    n = rhs_view.sizes[1]
    for name, shape in (("lhs", lhs_view.shape3), ("rhs", rhs_view.shape3), ("the output gradient", (g, m, n))):
        why = gemm_operands_unsupported(shape, jnp.float32, E4M3, config.scale_rounding, ("row", "col"), "blocked")
        if why:
            return f"{name}: {why}"
    gemms = (("forward", (g, m, k), (g, n, k)), ("dgrad", (g, m, n), (g, k, n)), ("wgrad", (g, n, m), (g, k, m)))
    for name, a_shape, b_shape in gemms:
        why = sm100.mx_gemm_sm100_unsupported(a_shape, b_shape, E4M3, E4M3, jnp.float32, False)
        if why:
            return f"the {name} GEMM: {why}"
    return prequantized_unsupported(lhs_view, rhs_view, lhs_q, rhs_q)


def kernel_unsupported_quantized(
    lhs_view: MatrixView, rhs_view: MatrixView, config: MXDotConfig, out_dtype, activation: str, has_bias: bool
) -> str | None:
    """Why the quantize epilogue does not cover a call that kernel_unsupported accepts (None when it does)."""
    if len(rhs_view.layout.free) != 1:
        return f"the quantized output needs one rhs free dim (the output's last axis), got {rhs_view.layout.free}"
    if len(lhs_view.layout.batch) + len(lhs_view.layout.free) < 1:
        return "the quantized output's blocked scales need an output of rank >= 2"
    if config.scale_rounding != "up":
        return "the epilogue quantizes with scale_rounding='up' (the config asks otherwise)"
    if np.dtype(out_dtype) != np.dtype(jnp.bfloat16):
        return f"the epilogue's high-precision output is bfloat16, not {np.dtype(out_dtype).name}"
    g, m, k = lhs_view.sizes
    n = rhs_view.sizes[1]
    why = sm100.mx_gemm_sm100_unsupported((g, m, k), (g, n, k), E4M3, E4M3, jnp.bfloat16, has_bias, "row", activation)
    return f"the forward GEMM's epilogue: {why}" if why else None


SM100 = Backend(
    name="sm100",
    archs=sm100.ARCHS,
    families=FAMILIES,
    scale_layout="blocked",
    operands=functools.partial(operands, layout="blocked"),
    prequantized=_prequantized,
    gemm=_gemm,
    gemm_quantized=_gemm_quantized,
    unsupported=kernel_unsupported,
    unsupported_quantized=kernel_unsupported_quantized,
    row_scale=_row_scale,
    wgrad_avals=_wgrad_avals,
)
"""The Blackwell MX GEMM (sm_100f: compute capability 10.0 and 10.3) on blocked-scale operands."""
