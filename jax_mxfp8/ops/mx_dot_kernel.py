"""The kernel path of `mx_dot_general`: the forward, dgrad and wgrad GEMMs on an MX GEMM kernel.

The dataflow below is arch-neutral; a Backend holds what differs per arch: the operand producer, the GEMM
and its quantize epilogue, the operand formats, what the kernels cover. SM90 (here) runs the Hopper MX GEMM
on aligned operands; SM100 (ops/mx_dot_sm100.py) the Blackwell one on blocked-scale operands.

Every operand is viewed by a FREE reshape as a 3-D matrix, (G, X, K) ("k last", e.g. activations
(B, T, D) contracting D) or (G, K, X) ("k first", e.g. a Flax kernel (D, F) contracting D); only layouts
that are neither are transposed by XLA first. One producer pass per operand (primitives/gemm_operands.py)
reads it once and writes the orientations the GEMMs need, quantized per the contract (blocks of 32 along
the contracting axis) and aligned to one exponent per 128 K (reference/gemm_align.py): the forward needs
each operand blocked along K, the backward blocks x along M and w along N, so the forward writes both and
keeps the backward ones (FP8 + float32 scales, smaller than the inputs) as residuals. The incoming
gradient G (G, M, N) gets both orientations in one pass too. Then (primitives/mx_gemm.py, K-major
operands, c = a @ b^T per batch):

  forward  y  (G, M, N) = mx_gemm(x along K (G, M, K), w along K (G, N, K))
  dgrad    dx (G, M, K) = mx_gemm(G along N (G, M, N), w along N (G, K, N))   [or its transpose for k first]
  wgrad    dw (G, N, K) = mx_gemm(G along M (G, N, M), x along M (G, K, M))   [or its transpose for k first]

so every result is written in its operand's natural layout (no transpose after the kernel).

Numerics (SM90): the contract's (reference/gemm.py) except that a 128-K run of 4 blocks shares one exponent
(exact unless an element of a smaller block lands in E4M3 subnormals, reference/gemm_align.py) and the
summation order is the kernel's (FP32, promoted every 128 K). `path="emulated"` runs the same dataflow
with every FFI call replaced by its XLA emulation (any machine; the tests' view of the kernel numerics).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.formats import MXArray
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives.gemm_operands import gemm_operands, gemm_operands_unsupported
from jax_mxfp8.primitives.mx_gemm import mx_gemm, mx_gemm_unsupported
from jax_mxfp8.primitives.mx_gemm_epilogue import mx_gemm_quantized, mx_gemm_quantized_unsupported
from jax_mxfp8.reference.gemm import OperandLayout, matmul_3d
from jax_mxfp8.reference.gemm_align import align128, padded

KERNEL_OUT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float32))
ARCHS = registry.MX_GEMM_VARIANTS[0].archs  # the Hopper MX GEMM kernel's (sm_90a); Blackwell: ops/mx_dot_sm100.py


@dataclasses.dataclass(frozen=True)
class MatrixView:
    """One dot_general operand as a 3-D matrix: (G, X, K) when `k_last`, else (G, K, X).

    `natural` says whether the view is a free reshape of the operand (no transpose in XLA).
    """

    layout: OperandLayout
    k_last: bool
    natural: bool

    @classmethod
    def of(cls, layout: OperandLayout) -> MatrixView:
        ndim = len(layout.shape)
        identity = tuple(range(ndim))
        if layout.batch + layout.free + layout.contract == identity:
            return cls(layout, k_last=True, natural=True)
        if layout.batch + layout.contract + layout.free == identity:
            return cls(layout, k_last=False, natural=True)
        return cls(layout, k_last=True, natural=False)

    @property
    def sizes(self) -> tuple[int, int, int]:
        """(G, X, K) of the operand."""
        lo = self.layout
        return tuple(int(np.prod(lo.dims(a), dtype=np.int64)) for a in (lo.batch, lo.free, lo.contract))

    @property
    def shape3(self) -> tuple[int, int, int]:
        g, x, k = self.sizes
        return (g, x, k) if self.k_last else (g, k, x)

    def to_3d(self, x: jax.Array) -> jax.Array:
        if not self.natural:
            return self.layout.to_3d(x)
        return x.reshape(self.shape3)

    def from_3d(self, x3: jax.Array) -> jax.Array:
        """Inverse of to_3d."""
        if not self.natural:
            return self.layout.from_3d(x3)
        return x3.reshape(self.layout.shape)

    def orientation(self, along: str) -> str:
        """gemm_operands' orientation that blocks this view along "k" (its contracting axis) or "x"."""
        contract_last = (along == "k") == self.k_last
        return "row" if contract_last else "col"


@dataclasses.dataclass(frozen=True)
class Backend:
    """What the kernel path runs on one arch (module docstring). Hashable (a KernelDot field).

    Attributes:
      name: "sm90" or "sm100".
      archs: the GEMM kernel's registry archs.
      families: the kernel families the path launches that have a first-use self-test (primitives/self_test.py).
      scale_layout: the layout of the MX output's scales (MXArray.scale_layout).
      operands: (view, x, along, dtype, config, path) -> {along: (data, scale)}: one producer pass over an
        operand, blocked along its contracting axis ("k") and/or its free axis ("x"), contracted axis last.
      prequantized: (view, MXArray) -> (data, scale): a caller's MXArray as the GEMM's operand.
      gemm: (a, b, out_dtype, path, bias) -> c (G, M, N) = a @ b^T per batch (+ bias) in out_dtype.
      gemm_quantized: (a, b, bias, activation, store_col, path) -> (q, s, pre[, qc, sc]): the forward GEMM
        with the quantize epilogue, in the kernel's layouts.
      unsupported: (lhs_view, rhs_view, config, lhs_q, rhs_q) -> why the path does not cover a call, or None.
      unsupported_quantized: (lhs_view, rhs_view, config, out_dtype, activation, has_bias) -> the same for
        the quantize epilogue (after `unsupported`).
      row_scale: (s, out_shape) -> the quantized output's MXArray scale (its data has out_shape).
      wgrad_avals: (g, n, m, dtype) -> ((data shape, dtype), (scale shape, dtype)) of the column orientation
        (WgradOperand) of an (G, M, N) output: the next GEMM's wgrad operand.
    """

    name: str
    archs: tuple[str, ...]
    families: tuple[str, ...]
    scale_layout: str
    operands: Callable
    prequantized: Callable
    gemm: Callable
    gemm_quantized: Callable
    unsupported: Callable
    unsupported_quantized: Callable
    row_scale: Callable
    wgrad_avals: Callable


def kernel_input(x: jax.Array) -> jax.Array:
    # the reference quantizes from float32 (reference/gemm.py quantized_3d): bfloat16 and float32 go to the
    # kernel as they are (bfloat16 -> float32 is exact), anything else is cast to float32 first, as there
    return x if x.dtype in (jnp.bfloat16, jnp.float32) else x.astype(jnp.float32)


def kernel_unsupported(
    lhs_view: MatrixView,
    rhs_view: MatrixView,
    config: MXDotConfig,
    *,
    lhs_q: MXArray | None,
    rhs_q: MXArray | None,
) -> str | None:
    """Why the MX GEMM kernel path does not cover a call (None when it does)."""
    why = config_unsupported(config)
    if why:
        return why
    g, m, k = lhs_view.sizes
    _, n, _ = rhs_view.sizes
    for name, view in (("lhs", lhs_view), ("rhs", rhs_view)):
        why = gemm_operands_unsupported(view.shape3, jnp.float32)
        if why:
            return f"{name}: {why}"
    why = gemm_operands_unsupported((g, m, n), jnp.float32)
    if why:
        return f"the output gradient (G, M, N) = {(g, m, n)}: {why}"
    mp, np_, kp = padded(m), padded(n), padded(k)
    gemms = (
        ("forward", (g, m, kp), (g, n, kp), config.dtype, config.dtype),
        ("dgrad", (g, m, np_), (g, k, np_), config.grad_dtype, config.dtype),
        ("wgrad", (g, n, mp), (g, k, mp), config.grad_dtype, config.dtype),
    )
    for name, a_shape, b_shape, a_dt, b_dt in gemms:
        why = mx_gemm_unsupported(a_shape, b_shape, a_dt, b_dt, jnp.float32, False)
        if why:
            return f"the {name} GEMM: {why}"
    return prequantized_unsupported(lhs_view, rhs_view, lhs_q, rhs_q)


def config_unsupported(config: MXDotConfig) -> str | None:
    """What of an MXDotConfig no kernel path covers (the Hadamard transform, stochastic rounding), or None."""
    if config.hadamard_seed is not None:
        return "hadamard_seed (the random Hadamard transform) runs in the XLA reference only"
    if config.grad_rounding != "nearest":
        return f"grad_rounding={config.grad_rounding!r} (stochastic rounding) runs in the XLA reference only"
    return None


def prequantized_unsupported(
    lhs_view: MatrixView, rhs_view: MatrixView, lhs_q: MXArray | None, rhs_q: MXArray | None
) -> str | None:
    """Why a kernel path cannot take the caller's MXArray operands (None when it can): only with their single
    contracting axis last (their data is then the GEMM's K-major operand as it is)."""
    for name, q, view in (("lhs_quantized", lhs_q, lhs_view), ("rhs_quantized", rhs_q, rhs_view)):
        if q is not None and not (view.natural and view.k_last and len(view.layout.contract) == 1):
            return f"{name}: a pre-quantized operand takes the kernel path only with its contracting axis last"
    return None


def kernel_unsupported_quantized(
    lhs_view: MatrixView, rhs_view: MatrixView, config: MXDotConfig, out_dtype, activation: str, has_bias: bool
) -> str | None:
    """Why the quantize-epilogue GEMM does not cover a call that kernel_unsupported accepts (None when it
    does): the MX output is E4M3 with scale_rounding "up" in row blocks of N, the rhs's single free dim."""
    if len(rhs_view.layout.free) != 1:
        return f"the quantized output needs one rhs free dim (the output's last axis), got {rhs_view.layout.free}"
    if np.dtype(config.dtype) != np.dtype(jnp.float8_e4m3fn) or config.scale_rounding != "up":
        return "the epilogue quantizes to float8_e4m3fn with scale_rounding='up' (the config asks otherwise)"
    if np.dtype(out_dtype) != np.dtype(jnp.bfloat16):
        return f"the epilogue's high-precision output is bfloat16, not {np.dtype(out_dtype).name}"
    g, m, _ = lhs_view.sizes
    n = rhs_view.sizes[1]
    why = mx_gemm_quantized_unsupported((g, m, 128), (g, n, 128), config.dtype, config.dtype, has_bias, activation)
    return f"the forward GEMM's epilogue: {why}" if why else None


def operands(
    view: MatrixView,
    x: jax.Array,
    along: tuple[str, ...],
    dtype,
    config: MXDotConfig,
    path: str,
    layout: str = "aligned",
) -> dict[str, tuple[jax.Array, jax.Array]]:
    """{along: (data, scale)} for the GEMMs that contract `view` along "k" and/or "x", one producer pass
    (primitives/gemm_operands.py in `layout`: "aligned" for the Hopper GEMM, "blocked" for the Blackwell one)."""
    orient = {a: view.orientation(a) for a in along}
    out = gemm_operands(
        kernel_input(view.to_3d(x)),
        dtype=dtype,
        scale_rounding=config.scale_rounding,
        orientations=tuple(orient.values()),
        path=path,
        layout=layout,
    )
    return {a: out[o] for a, o in orient.items()}


def _prequantized(view: MatrixView, q: MXArray):
    """A caller's MXArray (blocked along the single, last, contracting axis) as aligned (data, scale)."""
    g, x, k = view.sizes
    return align128(q.data.reshape(g, x, k), q.scale.reshape(g, x, k // 32), axis=-1)


def _gemm(a, b, out_dtype, path: str, bias: jax.Array | None = None) -> jax.Array:
    """c = a @ b^T (+ bias, float32) per batch on aligned operands, in `out_dtype` (computed in float32
    unless bfloat16 / float32; the kernel adds the bias in its epilogue, before the one rounding)."""
    kernel_dtype = out_dtype if np.dtype(out_dtype) in KERNEL_OUT_DTYPES else jnp.float32
    bias = None if bias is None else bias.astype(jnp.float32).reshape(-1)
    c = mx_gemm(a[0], b[0], a[1], b[1], bias, out_dtype=kernel_dtype, path=path)
    return c.astype(out_dtype)


def _gemm_quantized(a, b, bias, activation: str, store_col: bool, path: str):
    return mx_gemm_quantized(
        a[0], b[0], a[1], b[1], bias, activation=activation, store_pre=True, store_col=store_col, path=path
    )


def _row_scale(s, out_shape):
    return s.reshape(out_shape[:-1] + (out_shape[-1] // 32,))


def _wgrad_avals(g: int, n: int, m: int, dtype):
    mp = padded(m)
    return ((g, n, mp), np.dtype(dtype)), ((g, mp // 128, n), np.dtype(jnp.float32))


SM90 = Backend(
    name="sm90",
    archs=ARCHS,
    families=(),
    scale_layout="natural",
    operands=operands,
    prequantized=_prequantized,
    gemm=_gemm,
    gemm_quantized=_gemm_quantized,
    unsupported=lambda lhs, rhs, config, lhs_q, rhs_q: kernel_unsupported(lhs, rhs, config, lhs_q=lhs_q, rhs_q=rhs_q),
    unsupported_quantized=kernel_unsupported_quantized,
    row_scale=_row_scale,
    wgrad_avals=_wgrad_avals,
)
"""The Hopper MX GEMM (sm_90a) on aligned operands (primitives/gemm_operands.py, primitives/mx_gemm.py)."""


@dataclasses.dataclass(frozen=True)
class KernelDot:
    """The static description of one kernel-path mx_dot_general: operand views and dtypes, config, path and
    the arch's backend (SM90 or ops/mx_dot_sm100.py's SM100)."""

    lhs: MatrixView
    rhs: MatrixView
    lhs_dtype: np.dtype
    rhs_dtype: np.dtype
    config: MXDotConfig
    path: str
    backend: Backend = SM90

    @property
    def out_shape(self) -> tuple[int, ...]:
        lo, ro = self.lhs.layout, self.rhs.layout
        return lo.dims(lo.batch) + lo.dims(lo.free) + ro.dims(ro.free)

    def _forward_operands(self, lhs, rhs, lhs_q, rhs_q, residuals: bool, lhs_x=None):
        """(a_k, b_k): the forward GEMM's aligned operands; residuals (or None): what backward needs.
        lhs_x: the caller's aligned lhs blocked along "x" (data, scale) (ops/mx_dot_quantized.py: the
        previous GEMM's epilogue wrote it), used as the wgrad residual instead of quantizing lhs."""
        cfg, be = self.config, self.backend
        need_bwd = ("x",) if residuals else ()
        lhs_bwd = () if lhs_x is not None else need_bwd
        if lhs_q is not None:
            a_k = be.prequantized(self.lhs, lhs_q)
            a = be.operands(self.lhs, lhs, lhs_bwd, cfg.dtype, cfg, self.path) if lhs_bwd else {}
        else:
            a = be.operands(self.lhs, lhs, ("k",) + lhs_bwd, cfg.dtype, cfg, self.path)
            a_k = a["k"]
        if rhs_q is not None:
            b_k = be.prequantized(self.rhs, rhs_q)
            b = be.operands(self.rhs, rhs, need_bwd, cfg.dtype, cfg, self.path) if need_bwd else {}
        else:
            b = be.operands(self.rhs, rhs, ("k",) + need_bwd, cfg.dtype, cfg, self.path)
            b_k = b["k"]
        if not residuals:
            return a_k, b_k, None
        # the bf16 weight gradient multiplies the unquantized lhs: keep it (bf16) instead of its FP8 copy
        lhs_res = lhs.astype(jnp.bfloat16) if cfg.weight_grad == "bf16" else (a["x"] if lhs_x is None else lhs_x)
        return a_k, b_k, (lhs_res, b["x"])

    def forward(self, lhs, rhs, lhs_q, rhs_q, out_dtype, *, residuals: bool, bias=None, lhs_x=None):
        """y (+ bias) in `out_dtype` (lax.dot_general's output layout) and, when `residuals`, what backward
        needs (lhs_x: _forward_operands)."""
        a_k, b_k, res = self._forward_operands(lhs, rhs, lhs_q, rhs_q, residuals, lhs_x)
        return self.backend.gemm(a_k, b_k, out_dtype, self.path, bias).reshape(self.out_shape), res

    def forward_quantized(
        self, lhs, rhs, lhs_q, rhs_q, activation: str, *, residuals: bool, bias=None, store_col: bool = False
    ):
        """The forward GEMM with the quantize epilogue (primitives/mx_gemm_epilogue.py, or the sm100 GEMM's):
        (q, s, pre) in the output layout (q (..., N) E4M3 and s its scales, quantize(activation(acc + bias))
        along the last axis, in the backend's scale_layout (backend.row_scale); pre (..., N) bf16 = acc +
        bias) [+ (qc, sc) with store_col: the column orientation in the backend's "x" operand form of a next
        GEMM's lhs, backend.wgrad_avals] and, when `residuals`, what backward needs. The rhs has one free
        dim (N: kernel_unsupported_quantized)."""
        a_k, b_k, res = self._forward_operands(lhs, rhs, lhs_q, rhs_q, residuals)
        bias = None if bias is None else bias.astype(jnp.float32).reshape(-1)
        q, s, pre, *col = self.backend.gemm_quantized(a_k, b_k, bias, activation, store_col, self.path)
        shape = self.out_shape
        return (q.reshape(shape), self.backend.row_scale(s, shape), pre.reshape(shape), *col), res

    def backward(self, res, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(d_lhs, d_rhs) in the operands' shapes and dtypes from forward's residuals and the cotangent g."""
        lhs_dtype, rhs_dtype = self.lhs_dtype, self.rhs_dtype
        lhs_x, rhs_x = res
        gg, m, _ = self.lhs.sizes
        n = self.rhs.sizes[1]
        g3 = kernel_input(g.reshape(gg, m, n))
        cfg = self.config
        along = ("k", "x") if cfg.weight_grad == "mxfp8" else ("k",)  # G along N (dgrad) and along M (wgrad)
        g_view = MatrixView.of(OperandLayout(batch=(0,), free=(1,), contract=(2,), shape=(gg, m, n)))
        g_ops = self.backend.operands(g_view, g3, along, cfg.grad_dtype, cfg, self.path)
        # dgrad: contract N. k last: (G, M, K) = G_row @ w_x^T; k first: (G, K, M) = w_x @ G_row^T
        pair = (g_ops["k"], rhs_x) if self.lhs.k_last else (rhs_x, g_ops["k"])
        d_lhs = self.lhs.from_3d(self.backend.gemm(*pair, lhs_dtype, self.path))
        if cfg.weight_grad == "bf16":
            lhs3 = self.lhs.layout.to_3d(lhs_x)  # (G, M, K) bf16
            d_rhs3 = matmul_3d(jnp.swapaxes(g3, 1, 2).astype(jnp.bfloat16), jnp.swapaxes(lhs3, 1, 2))
            d_rhs = self.rhs.layout.from_3d(d_rhs3).astype(rhs_dtype)
        else:
            # wgrad: contract M. k last: (G, N, K) = G_col @ x_x^T; k first: (G, K, N) = x_x @ G_col^T
            pair = (g_ops["x"], lhs_x) if self.rhs.k_last else (lhs_x, g_ops["x"])
            d_rhs = self.rhs.from_3d(self.backend.gemm(*pair, rhs_dtype, self.path))
        return d_lhs, d_rhs
