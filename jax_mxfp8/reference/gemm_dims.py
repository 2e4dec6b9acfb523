"""The MX GEMM in dot_general's own layout: free dimensions are never flattened (sharding-friendly).

reference/gemm.py computes every GEMM in a normalised (B, M, K) layout. Flattening two free dimensions
into M is a reshape that GSPMD/Shardy can only partition by all-gathering when both are sharded (batch
over "data" and sequence over "model", say), and that Explicit-axis meshes refuse outright; lax.dot_general
needs neither. Here the operands keep their dimensions, only transposed to (batch..., free..., K):

* forward: each operand quantized along K (its flattened contracting axes: a trailing merge only), one
  dot_general contracting K with the batch dimensions leading -- the output is already in lax's layout;
* dgrad dA = Q(G along N) @ Q(B along N): the rhs free dimensions merge into N (trailing in G);
* wgrad dB = Q(G along M)^T @ Q(A along M): the contract's blocks run along the flattened M; when the last
  lhs free dimension is a multiple of the block (32, or the Hadamard block), every block lies inside one
  index of the other free dimensions, so blocks along that last dimension are the same blocks and the
  GEMM contracts all free dimensions without a reshape. Otherwise (a ragged last free dimension) M is
  flattened as in the 3-D path.

Numerics are reference/gemm.py's, value for value: the same blocks, the same float32 accumulation of
exact products (summation order is the backend's either way). Stochastic gradient rounding and the random
Hadamard transform draw random bits per array shape, so those configs keep the 3-D layout (their streams
stay as they were).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.formats import BLOCK_SIZE, MXArray
from jax_mxfp8.formats.quantize import dequantize_products
from jax_mxfp8.reference.gemm import (
    DEFAULT_OPERANDS,
    DGRAD,
    FWD,
    HIGHEST,
    WGRAD,
    OperandLayout,
    matmul_3d,
    mx_dot_backward,
    mx_dot_forward,
    operand_dtype,
    prequantized_3d,
    quantized_3d,
    quantized_in_place,
)


def keeps_dims(config: MXDotConfig) -> bool:
    """Whether this config runs in the operands' own layout (else the 3-D layout, module docstring)."""
    return config.grad_rounding != "stochastic" and config.hadamard_seed is None


def _three_d(lhs: jax.Array, rhs: jax.Array, lhs_l: OperandLayout, rhs_l: OperandLayout) -> bool:
    """Whether the 3-D path serves this call as well: it merges no dimensions other than the contracting
    ones (at most one batch and one free axis per operand; its reshapes then only add unit axes) and the
    operands live on no Explicit-axis mesh (whose backward GEMMs must name their output sharding). It runs
    bit for bit the reference's GEMMs, and XLA:CPU's bf16 GEMM covers exactly those layouts."""
    plain = len(lhs_l.batch) <= 1 and len(lhs_l.free) <= 1 and len(rhs_l.free) <= 1
    return plain and explicit_sharding(lhs) is None and explicit_sharding(rhs) is None


def _to_nd(x: jax.Array, layout: OperandLayout) -> jax.Array:
    """(batch..., free..., K): transposed, the contracting axes merged into one trailing K."""
    y = jnp.transpose(x, layout.perm)
    k = math.prod(layout.dims(layout.contract))
    if len(layout.contract) != 1:
        y = y.reshape(y.shape[: y.ndim - len(layout.contract)] + (k,))
    return y


def _from_nd(y: jax.Array, layout: OperandLayout) -> jax.Array:
    """Inverse of _to_nd: (batch..., free..., K) -> the operand's own layout."""
    y = y.reshape(layout.dims(layout.batch) + layout.dims(layout.free) + layout.dims(layout.contract))
    return jnp.transpose(y, np.argsort(layout.perm))


def explicit_sharding(x: jax.Array):
    """x's sharding when it lives on a mesh with Explicit axes (jax.make_mesh's default), else None.

    A backward GEMM that contracts sharded dimensions (the weight gradient over batch and sequence) must
    name its output sharding there, as lax.dot_general's own transpose rule does: the primal operand's."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not any(t == jax.sharding.AxisType.Explicit for t in getattr(mesh, "axis_types", ())):
        return None
    return sharding


def _matmul(a: jax.Array, b: jax.Array, n_contract: int, n_batch: int, out_sharding=None) -> jax.Array:
    """dot_general contracting the last n_contract axes of both, batch = the first n_batch; float32 out."""
    ca = tuple(range(a.ndim - n_contract, a.ndim))
    cb = tuple(range(b.ndim - n_contract, b.ndim))
    batch = tuple(range(n_batch))
    if n_contract == 1 and n_batch <= 1 and a.ndim == b.ndim == n_batch + 2 and out_sharding is None:
        # a plain (B, M, K) x (B, N, K) GEMM: exactly reference/gemm.matmul_3d (same backend GEMM, same bits)
        if n_batch == 0:
            return matmul_3d(a[None], b[None])[0]
        return matmul_3d(a, b)
    if a.dtype == jnp.bfloat16 and n_contract > 1 and jax.default_backend() == "cpu":
        # XLA:CPU's generic dot thunk refuses bf16 x bf16 -> f32 for the weight gradient's contraction over
        # several free axes (single-axis contractions go to YNNPACK). MX values are exact in float32 too,
        # so the products are the same (the sums are float32 either way).
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    precision = HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(
        a,
        b,
        ((ca, cb), (batch, batch)),
        precision=precision,
        preferred_element_type=jnp.float32,
        out_sharding=out_sharding,
    )


def _in_place(x: jax.Array, layout: OperandLayout, config: MXDotConfig, operands: str) -> jax.Array | None:
    """reference/gemm.quantized_in_place, except for bfloat16 operands on XLA:CPU: there the operand it leaves
    transposed (an lhs stored (K, M), say) reaches a dot that only the generic DotThunk takes, which refuses
    bf16 x bf16 -> f32 ("Unsupported element type"); the transposed 3-D operand keeps to YNNPACK's layouts.
    The values are the same either way (tests/gemm/test_gemm_reference_bf16.py)."""
    if operands == "bfloat16" and jax.default_backend() == "cpu":
        return None
    return quantized_in_place(x, layout, config, operands=operands)


def _prequantized(a: MXArray, layout: OperandLayout, operands: str) -> jax.Array:
    return _to_nd(dequantize_products(a, operand_dtype(operands)), layout)


def forward(
    lhs: jax.Array,
    rhs: jax.Array,
    lhs_l: OperandLayout,
    rhs_l: OperandLayout,
    config: MXDotConfig,
    *,
    lhs_q: MXArray | None = None,
    rhs_q: MXArray | None = None,
    operands: str = DEFAULT_OPERANDS,
) -> jax.Array:
    """Q(lhs along K) x Q(rhs along K) in float32, in lax.dot_general's output layout (batch, lhs free,
    rhs free). lhs_q / rhs_q: pre-quantized operands (MXArrays blocked along the single contracting axis)."""
    if not keeps_dims(config) or _three_d(lhs, rhs, lhs_l, rhs_l):

        def operand3(x, x_q, layout):
            if x_q is not None:
                return prequantized_3d(x_q, layout, operands=operands)
            q = _in_place(x, layout, config, operands)
            return None if q is None else layout.to_3d(q)

        out3 = mx_dot_forward(
            lhs_l.to_3d(lhs),
            rhs_l.to_3d(rhs),
            config,
            lhs_q3=operand3(lhs, lhs_q, lhs_l),
            rhs_q3=operand3(rhs, rhs_q, rhs_l),
            operands=operands,
        )
        return out3.reshape(lhs_l.dims(lhs_l.batch) + lhs_l.dims(lhs_l.free) + rhs_l.dims(rhs_l.free))
    dt = operand_dtype(operands)

    def operand(x, x_q, layout):
        if x_q is not None:
            return _prequantized(x_q, layout, operands)
        q = _in_place(x, layout, config, operands)  # blocks along K in x's own layout
        if q is not None:
            return _to_nd(q, layout)
        return quantized_3d(_to_nd(x, layout), config, FWD, operands=operands)

    a, b = operand(lhs, lhs_q, lhs_l), operand(rhs, rhs_q, rhs_l)
    nb = len(lhs_l.batch)
    # (batch, lhs free, K) x (batch, rhs free, K): dot_general puts batch, lhs free, rhs free
    return _matmul(a.astype(dt), b.astype(dt), 1, nb)


def backward(
    lhs: jax.Array,
    rhs: jax.Array,
    g: jax.Array,
    lhs_l: OperandLayout,
    rhs_l: OperandLayout,
    config: MXDotConfig,
    rng: jax.Array | None,
    *,
    operands: str = DEFAULT_OPERANDS,
    rhs_dgrad_q: MXArray | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(d_lhs, d_rhs) float32 in the operands' own layouts for the output cotangent g (batch, lhs free,
    rhs free); the numerics of reference/gemm.mx_dot_backward.

    rhs_dgrad_q: optional pre-quantized rhs for the dgrad GEMM, in rhs's own layout and blocked along its
    single free axis N (config.dtype, config.scale_rounding): exactly the operand the dgrad would quantize
    itself (FSDP gathers it as MXFP8 bytes instead of gathering rhs: parallel/fsdp.py). Only used where
    the operands keep their dims (keeps_dims) and rhs has one free axis."""
    nb, nm, nn = len(lhs_l.batch), len(lhs_l.free), len(rhs_l.free)
    three_d = _three_d(lhs, rhs, lhs_l, rhs_l) and rhs_dgrad_q is None  # (FSDP's dgrad copy: this path)
    if not keeps_dims(config) or nm == 0 or nn == 0 or three_d:
        b, m, n = (math.prod(d) for d in (lhs_l.dims(lhs_l.batch), lhs_l.dims(lhs_l.free), rhs_l.dims(rhs_l.free)))
        d_lhs3, d_rhs3 = mx_dot_backward(
            lhs_l.to_3d(lhs), rhs_l.to_3d(rhs), g.reshape(b, m, n), config, rng, operands=operands
        )
        return lhs_l.from_3d(d_lhs3), rhs_l.from_3d(d_rhs3)
    dt = operand_dtype(operands)
    a = _to_nd(lhs, lhs_l)  # (batch, M..., K)
    w = _to_nd(rhs, rhs_l)  # (batch, N..., K)
    batch, m_dims, n_dims = g.shape[:nb], g.shape[nb : nb + nm], g.shape[nb + nm :]
    n = math.prod(n_dims)

    # dgrad: contract N (the rhs free dimensions, trailing in g; merged when there are several)
    g_n = g.reshape(batch + m_dims + (n,))
    if rhs_dgrad_q is not None and nn == 1:
        w_n = jnp.moveaxis(_prequantized(rhs_dgrad_q, rhs_l, operands), -1, nb)  # (batch, K, N), MX along N
    else:
        w_n = quantized_3d(jnp.moveaxis(w, -1, nb).reshape(batch + (w.shape[-1], n)), config, DGRAD, operands=operands)
    d_a = _matmul(
        quantized_3d(g_n, config, DGRAD, grad=True, operands=operands).astype(dt),
        w_n.astype(dt),
        1,
        nb,
        explicit_sharding(a),
    )  # (batch, M..., K)

    # wgrad: contract M (the lhs free dimensions)
    g_m = jnp.moveaxis(g, tuple(range(nb, nb + nm)), tuple(range(g.ndim - nm, g.ndim)))  # (batch, N..., M...)
    a_m = jnp.moveaxis(a, -1, nb)  # (batch, K, M...)
    w_sharding = explicit_sharding(w)
    if config.weight_grad == "bf16":
        # bf16-rounded operands; float32 ones on XLA:CPU, whose bf16 dot refuses these transposed layouts
        wdt = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
        g_b, a_b = (v.astype(jnp.bfloat16).astype(wdt) for v in (g_m, a_m))
        d_w = _matmul(g_b, a_b, nm, nb, w_sharding)
    elif m_dims[-1] % BLOCK_SIZE == 0:
        # blocks along the flattened M lie inside one index of the outer free dims: along the last one
        d_w = _matmul(
            quantized_3d(g_m, config, WGRAD, grad=True, operands=operands).astype(dt),
            quantized_3d(a_m, config, WGRAD, operands=operands).astype(dt),
            nm,
            nb,
            w_sharding,
        )
    else:  # ragged last free dimension: blocks straddle it, so M is flattened as in the 3-D path
        m = math.prod(m_dims)
        g_flat, a_flat = g_m.reshape(g_m.shape[: nb + nn] + (m,)), a_m.reshape(a_m.shape[: nb + 1] + (m,))
        d_w = _matmul(
            quantized_3d(g_flat, config, WGRAD, grad=True, operands=operands).astype(dt),
            quantized_3d(a_flat, config, WGRAD, operands=operands).astype(dt),
            1,
            nb,
            w_sharding,
        )
    # d_w: (batch, N..., K)
    return _from_nd(d_a, lhs_l), _from_nd(d_w, rhs_l)
