"""Make differentiating a custom_vjp op's backward (second order) an error instead of a silent zero.

The MX ops' custom_vjp rules quantize their operands (a zero gradient: quantize stop_gradients its input) and
use the quantized residuals in the backward. Differentiating through them again (grad of grad,
Hessian-vector products, jacfwd of grad) would therefore give exactly zero, silently. These helpers wrap a
custom_vjp's fwd and bwd rules so that the inputs of either pass through a jax.custom_jvp identity whose
JVP raises NotImplementedError naming the op:

- the fwd rule is only ever JVP'd when an outer differentiation traces through an inner one (first-order
  jax.grad / jax.vjp / jax.linearize call the fwd rule on primal values; jax.jvp of a custom_vjp function is
  refused by JAX itself), so a non-zero tangent on the op's inputs there means second order;
- the bwd rule is JVP'd when the cotangent carries a tangent (jvp of vjp with respect to the cotangent).

A custom_jvp rule is skipped when every input tangent is a symbolic zero, so second derivatives with
respect to variables that do not reach the op are unaffected. First-order results are bit-identical: the
identity adds no operation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _differentiable(x) -> bool:
    """Float arrays of >= 16 bits (FP8 MXArray data and integer leaves carry no gradient here)."""
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.inexact) and x.dtype.itemsize >= 2


@functools.cache
def _guard(op: str):
    @jax.custom_jvp
    def guard(xs):
        return xs

    @guard.defjvp
    def guard_jvp(primals, tangents):
        raise NotImplementedError(
            f"{op}: second-order differentiation (differentiating its gradient: grad of grad, Hessian-vector "
            "products, jacfwd of grad) is not supported; its backward pass uses quantized operands, so the "
            "result would be silently zero. Differentiate a first-order function of it, or use lax ops "
            "where second derivatives are needed."
        )

    return guard


def first_order_only(tree, op: str):
    """`tree` unchanged, but its floating-point array leaves pass through a guard whose JVP raises."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    idx = [i for i, x in enumerate(leaves) if _differentiable(x)]
    if not idx:
        return tree
    guarded = _guard(op)(tuple(leaves[i] for i in idx))
    for i, g in zip(idx, guarded, strict=True):
        leaves[i] = g
    return jax.tree_util.tree_unflatten(treedef, leaves)


def guard_fwd(fwd, op: str, argnums: tuple[int, ...]):
    """Wraps a custom_vjp fwd rule: the arguments at `argnums` (positions in fwd's own signature) are guarded."""

    @functools.wraps(fwd)
    def wrapped(*args):
        args = list(args)
        picked = first_order_only(tuple(args[i] for i in argnums), op)
        for i, a in zip(argnums, picked, strict=True):
            args[i] = a
        return fwd(*args)

    return wrapped


def guard_bwd(bwd, op: str):
    """Wraps a custom_vjp bwd rule (..., res, g): the cotangent g is guarded."""

    @functools.wraps(bwd)
    def wrapped(*args):
        *head, g = args
        return bwd(*head, first_order_only(g, op))

    return wrapped
