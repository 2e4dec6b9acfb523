"""Attention with dK and dV returned as MXArrays for the QKV projection's backward GEMMs (opt-in).

A custom_vjp cannot change a cotangent's type, so this is a function-level API in the style of jax.vjp:

  out, vjp = dot_product_attention_vjp(query, key, value, **dot_product_attention_kwargs)
  out, vjp = varlen_attention_vjp(q, k, v, cu_seqlens_q, cu_seqlens_k, **varlen_attention_kwargs)
  dq, dk, dv = vjp(d_out)       # dq in the inputs' dtype; dk, dv MXGradient (row + col MXArrays)

An MXGradient holds the gradient G of a projection output Y = X W as the 2-D (tokens, features) matrix the
projection's GEMMs see (tokens = B * S rows, or the packed T_total_k rows; features = K * H), quantized
both ways mx_dot_general's backward quantizes its incoming gradient:
  row: E4M3 + E8M0, 32-blocks along features (axis -1): the lhs of dX = G W^T, which contracts features;
  col: E4M3 + E8M0, 32-blocks along tokens (axis -2): the rhs of dW = X^T G, which contracts tokens.
They are produced by QUANTIZE_ROWCOL (one pass over G, kernels/sm90; its emulation / the reference
elsewhere) right after the attention backward, from the input-dtype dK, dV the ordinary path returns, so
the MXArrays equal quantize(dK) along each axis bit for bit (tests/attention/test_attention_mx_grads.py). On
compute capability 10.x with bfloat16 inputs, dot_product_attention_vjp runs the sm100 backward's MX dK / dV
variant instead, whose epilogue writes the same MXArrays of the bfloat16 dK, dV (ops/attention_bwd_sm100.py).

Use (a QKV block with its own VJP, e.g. inside a Flax module through nn.custom_vjp / jax.custom_vjp):
  k = mx_dot_general(x, w_k, (((1,), (0,)), ((), ()))).reshape(S, K, H)        # x (S, D), w_k (D, K*H)
  out, vjp = dot_product_attention_vjp(q, k, v)
  dq, dk, dv = vjp(d_out)
  dx_k = mx_dot_general(dk.row, w_k, (((1,), (1,)), ((), ())))                  # (S, D), no re-quantization
  dw_k = mx_dot_general(x, dk.col, (((0,), (0,)), ((), ())))                    # (D, K*H)
which gives what autodiff through mx_dot_general gives (the same MX operands), without the bfloat16 dK
round trip through a second quantization.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import check_float32_range
from jax_mxfp8.ops.attention import dot_product_attention, prepare_call
from jax_mxfp8.ops.attention_bwd_sm100 import mx_variant, sm100_backward_variant, sm100_mx_backward
from jax_mxfp8.ops.attention_core import mx_attention_fwd
from jax_mxfp8.ops.varlen_attention import varlen_attention
from jax_mxfp8.primitives.quantize import quantize_rowcol

__all__ = ["MXGradient", "dot_product_attention_vjp", "varlen_attention_vjp"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MXGradient:
    """A (tokens, features) gradient quantized for the two backward GEMMs of the projection producing it.

    row: (tokens, features) MXArray blocked along features (axes (-1,)), for dX = G W^T.
    col: (tokens, features) MXArray blocked along tokens (axes (-2,)), for dW = X^T G.
    """

    row: MXArray
    col: MXArray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.row.shape


def _mx_gradient(g: jax.Array, name: str, scale_rounding: str, implementation: str | None) -> MXGradient:
    """(..., K, H) gradient -> MXGradient of its (tokens, K * H) matrix; tokens = the leading axes' product."""
    *lead, n_kv, h = g.shape
    tokens = math.prod(lead)
    if tokens % BLOCK_SIZE:
        raise ValueError(
            f"{name} has {tokens} token rows; MX gradients block them in 32s for dW = X^T G: pad the packed "
            f"{name} to a multiple of {BLOCK_SIZE} rows"
        )
    if tokens == 0:  # no key rows (a batch of 0, or packed k without rows): empty MXArrays of the shapes
        f = n_kv * h
        data = jnp.zeros((0, f), jnp.float8_e4m3fn)
        return MXGradient(
            MXArray(data, jnp.zeros((0, f // BLOCK_SIZE), jnp.uint8), (-1,), "row"),
            MXArray(data, jnp.zeros((0, f), jnp.uint8), (-2,), "row"),
        )
    quant_impl = "emulated" if implementation == "emulated" else implementation
    row, col = quantize_rowcol(g.reshape(tokens, n_kv * h), scale_rounding=scale_rounding, implementation=quant_impl)
    return MXGradient(row, col)


def _check_options(scale_rounding: str, kwargs: dict, operands) -> None:
    for name, x in operands:
        if isinstance(x, MXArray) and name[0] in "kv":
            raise ValueError(f"{name} is an MXArray; MX gradients need float key and value (MXArrays get none)")
        # before jax.vjp converts the operands: float64 beyond float32 would become Inf there, unchecked
        if not isinstance(x, MXArray):
            check_float32_range(x, name)
    if scale_rounding not in ("up", "floor"):
        raise ValueError(f"scale_rounding={scale_rounding!r} must be 'up' or 'floor'")
    if kwargs.get("return_residual"):
        raise ValueError("return_residual is not supported with MX gradients (the vjp takes d_out only)")
    if kwargs.get("bias") is not None:
        raise ValueError("bias is not supported with MX gradients (its gradient would be dropped)")


def _with_mx_kv_grads(fn, q, k, v, scale_rounding: str, implementation: str | None):
    out, vjp_fn = jax.vjp(fn, q, k, v)

    def vjp(d_out: jax.Array) -> tuple[jax.Array, MXGradient, MXGradient]:
        d_out = jnp.asarray(d_out)
        if d_out.shape != out.shape:
            raise ValueError(f"d_out must have the output's shape {out.shape}; got {d_out.shape}")
        dq, dk, dv = vjp_fn(d_out.astype(out.dtype))
        return (
            dq,
            _mx_gradient(dk, "key", scale_rounding, implementation),
            _mx_gradient(dv, "value", scale_rounding, implementation),
        )

    return out, vjp


def dot_product_attention_vjp(query, key, value, *, grad_scale_rounding: str = "up", **kwargs):
    """dot_product_attention(query, key, value, **kwargs) and a vjp returning dK, dV as MXGradients.

    Args:
      query, key, value, kwargs: as for dot_product_attention (float arrays; no bias, no return_residual).
      grad_scale_rounding: the E8M0 rule of the gradients' blocks ("up", mx_dot_general's default, or
        "floor"); match the projection's MXDotConfig.scale_rounding.

    Returns:
      (out, vjp): out as dot_product_attention returns it; vjp(d_out) -> (dq like query, dk, dv MXGradient
      of the (B * S, K * H) matrices (or (S, K * H) for rank-3 inputs)). B * S must be a multiple of 32.
    """
    _check_options(grad_scale_rounding, kwargs, (("query", query), ("key", key), ("value", value)))
    routed = _sm100_mx_route(query, key, value, grad_scale_rounding, kwargs)
    if routed is not None:
        return routed
    fn = lambda q, k, v: dot_product_attention(q, k, v, **kwargs)
    return _with_mx_kv_grads(fn, query, key, value, grad_scale_rounding, kwargs.get("implementation"))


_fwd_jit = jax.jit(mx_attention_fwd, static_argnums=(0,))


def _sm100_mx_route(query, key, value, grad_scale_rounding: str, kwargs: dict):
    """(out, vjp) on the sm100 backward's MX dK / dV variant, whose epilogue writes the MXGradients (no bfloat16
    dK round trip, no quantize pass), or None where the call does not take it: it needs the sm100 forward and
    backward (compute capability 10.x, ops/attention_bwd_sm100.py), bfloat16 inputs (the kernel quantizes bfloat16(dK),
    which is then exactly the gradient this function quantizes on every other route), grad_scale_rounding
    "up" and a registered variant (p_scale "const", dq_accum "fp32", not deterministic)."""
    if grad_scale_rounding != "up":
        return None
    call_kw = {name: x for name, x in kwargs.items() if name != "return_residual"}
    call = prepare_call(query, key, value, **call_kw)
    static = call.static
    if static is None or static.out_dtype != jnp.bfloat16 or any(static.is_mx):
        return None
    h = call.args[0].shape[-1]
    if sm100_backward_variant(static, h) is None or mx_variant(static, h) is None:
        return None
    (o, _), res = _fwd_jit(static, *call.args)
    out = o[0] if call.unbatched else o

    def vjp(d_out: jax.Array) -> tuple[jax.Array, MXGradient, MXGradient]:
        d_out = jnp.asarray(d_out)
        if d_out.shape != out.shape:
            raise ValueError(f"d_out must have the output's shape {out.shape}; got {d_out.shape}")
        do = d_out.astype(o.dtype).reshape(o.shape)
        dq, dk, dv = sm100_mx_backward(static, res, do)
        return (dq[0] if call.unbatched else dq), MXGradient(*dk), MXGradient(*dv)

    return out, vjp


def varlen_attention_vjp(q, k, v, cu_seqlens_q, cu_seqlens_k, *, grad_scale_rounding: str = "up", **kwargs):
    """varlen_attention(...) and a vjp returning dK, dV of the packed (T_total_k, K * H) rows as MXGradients.

    Arguments as for varlen_attention plus grad_scale_rounding (see dot_product_attention_vjp). The token
    blocks of `col` run over the packed rows (they may span sequence boundaries: dW = X^T G sums over all
    tokens, so any 32-row grouping is a valid MX operand; it is the one mx_dot_general's backward would use).
    T_total_k must be a multiple of 32.
    """
    _check_options(grad_scale_rounding, kwargs, (("q", q), ("k", k), ("v", v)))
    if getattr(k, "shape", (0,))[0] % BLOCK_SIZE:  # before the forward runs: the vjp could not block dK
        raise ValueError(
            f"k has {k.shape[0]} packed rows; MX gradients block the token rows in 32s for dW = X^T G: pad "
            f"the packed k, v to a multiple of {BLOCK_SIZE} rows (rows in no sequence get zero gradients)"
        )
    fn = lambda q_, k_, v_: varlen_attention(q_, k_, v_, cu_seqlens_q, cu_seqlens_k, **kwargs)
    return _with_mx_kv_grads(fn, q, k, v, grad_scale_rounding, kwargs.get("implementation"))
