"""Shared pieces of the bad-input probe (tests/bad_inputs/test_bad_inputs.py): operands, the kinds of bad input every
public name must be reached with, the list of public names, and the (name, kind) pairs that do not apply.

The cases themselves live in bad_inputs_{formats,gemm,attention,flax}_testutil.py as two tables keyed by
(public name, kind, detail):
  RAISES[key]  = (fn, match): fn() raises a ValueError whose message matches `match` (names the argument);
  RESULTS[key] = fn: fn() runs the call and asserts its documented result itself (empty shapes, NaN in
                 place, 0 for a fully masked row, traced == concrete, ...).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8
import jax_mxfp8.flax as mf
import jax_mxfp8.parallel
from jax_mxfp8.flax.policy import LayerPrecision
from jax_mxfp8.ops import attention_grads, mx_dot_quantized

KINDS = ("dtype", "rank", "shape", "axis", "option", "special", "zero-size", "traced")
"""dtype: a wrong element type; rank: too few / many axes; shape: sizes that do not fit (blocks of 32,
mismatched operands); axis: an axis or dimension-number argument; option: a string / enum / config option;
special: NaN, Inf, huge and tiny values; zero-size: an axis of size 0; traced: arguments under jax.jit."""

F32 = jnp.float32
X = jnp.asarray(np.linspace(-2, 2, 4 * 64, dtype=np.float32).reshape(4, 64))  # (M, K)
W64 = jnp.ones((64,), F32)
WM = jnp.asarray(np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32))  # (K, N)
DN = (((1,), (0,)), ((), ()))
Q = jnp.asarray(np.linspace(-1, 1, 32 * 2 * 32, dtype=np.float32).reshape(1, 32, 2, 32))  # (B, T, N, H)
KV = Q[:, :, :1]  # (B, S, K, H)
P = Q[0]  # packed (T_total, N, H)
CU = jnp.asarray([0, 10, 32], jnp.int32)


def rand(shape, seed=0, dtype=np.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def shapes(tree) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype name) of every leaf, in tree order."""
    return [(tuple(a.shape), np.dtype(a.dtype).name) for a in jax.tree_util.tree_leaves(tree)]


def grads_like(fn, *args):
    """Asserts jax.grad of sum(fn(*args)) (float32) exists and has the arguments' shapes and dtypes, all
    zero when the output is empty; returns the gradients."""
    out = fn(*args)
    gs = jax.grad(lambda *a: jnp.sum(jnp.asarray(fn(*a), jnp.float32)), tuple(range(len(args))))(*args)
    assert shapes(gs) == shapes(args)
    if np.size(out) == 0:
        assert not any(np.any(np.asarray(g)) for g in gs)
    return gs


def assert_same(a, b):
    """Bit-identical leaves (NaN equal to NaN)."""
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(
            np.asarray(x.astype(F32) if x.dtype == jnp.bfloat16 else x),
            np.asarray(y.astype(F32) if y.dtype == jnp.bfloat16 else y),
        )


# ------------------------------------------------------------------------------------- the public names
def _listed(prefix: str, module) -> list[tuple[str, object]]:
    return [(f"{prefix}{n}", getattr(module, n)) for n in module.__all__]


def public_objects() -> dict[str, object]:
    """Every public name: jax_mxfp8.__all__, the Flax layer (jax_mxfp8.flax.__all__, linen's modules), the
    parallel helpers, and the ops of the public submodules jax_mxfp8.ops.attention_grads / mx_dot_quantized."""
    out = dict(_listed("", jax_mxfp8))
    for name, obj in _listed("flax.", mf):
        if name == "flax.linen":  # a namespace: its modules
            linen = {
                f"linen.{n}": v for n, v in vars(obj).items() if inspect.isclass(v) and v.__module__ == obj.__name__
            }
            out |= linen
        else:
            out[name] = obj
    out |= dict(_listed("parallel.", jax_mxfp8.parallel))
    out |= dict(_listed("attention_grads.", attention_grads))
    out |= dict(_listed("mx_dot_quantized.", mx_dot_quantized))
    return out


def public_names() -> list[str]:
    """The public names the bad-input cases must reach: public_objects() less NOT_OPS."""
    objs = public_objects()
    for name, obj in objs.items():  # constants and result carriers are listed in NOT_OPS by kind
        if isinstance(obj, LayerPrecision) or name in CARRIERS:
            assert name in NOT_OPS, name
    return sorted(n for n in objs if n not in NOT_OPS)


CARRIERS = ("attention_grads.MXGradient", "mx_dot_quantized.WgradOperand", "mx_dot_quantized.MXHandoff")
NOT_OPS = {
    "flax.BF16": "a LayerPrecision constant (LayerPrecision's cases cover its construction)",
    "flax.MXFP8": "a LayerPrecision constant (LayerPrecision's cases cover its construction)",
    "attention_grads.MXGradient": "a result carrier the vjps build; its MXArrays are checked where consumed",
    "mx_dot_quantized.WgradOperand": "a result carrier; mx_dot_general_handoff checks it (its option cases)",
    "mx_dot_quantized.MXHandoff": "a result carrier of (MXArray, WgradOperand); the Flax linear checks it",
}

_CONFIG = "an options object: no array argument"
_NO_AXIS = "no axis argument: the layout is fixed (BTNH / packed (T, N, H) / (..., D))"
NOT_APPLICABLE = {
    **{(n, k): _CONFIG for n in ("AttentionConfig", "MXDotConfig") for k in ("rank", "shape", "axis", "special")},
    **{
        (n, k): _CONFIG
        for n in ("flax.LayerPrecision", "flax.PrecisionPolicy")
        for k in ("dtype", "rank", "shape", "axis", "special", "zero-size")
    },
    ("flax.LayerPrecision", "traced"): "static options (strings, bools); no array argument to trace",
    ("flax.PrecisionPolicy", "traced"): "static options (strings, patterns); no array argument to trace",
    ("MXArray", "special"): "a container: the values it holds are not inspected (dequantize's cases are)",
    ("dequantize", "rank"): "takes an MXArray, of any rank >= 1 (MXArray's rank case)",
    ("dequantize", "axis"): "no axis argument: the blocked axes are the MXArray's (MXArray's axis case)",
    **{
        (n, "axis"): _NO_AXIS
        for n in (
            "rms_norm_quantize",
            "dot_product_attention",
            "varlen_attention",
            "broadcast_query_attention",
            "attention_grads.dot_product_attention_vjp",
            "attention_grads.varlen_attention_vjp",
            "parallel.ring_attention",
            "flax.MXRMSNorm",
            "flax.MXAttention",
            "flax.MXMLP",
            "flax.TransformerBlock",
            "flax.MXLinear",
            "linen.MXDense",
            "linen.MXRMSNorm",
            "linen.MXAttention",
            "linen.TransformerBlock",
            "parallel.fsdp_mx_dot",
            "flax.attention_fn",
            "mx_dot_quantized.mx_dot_general_handoff",
        )
    },
    ("parallel.gather_quantized", "rank"): "quantize's rank case (it quantizes each shard with quantize)",
    ("parallel.gather_quantized", "special"): "quantize's special cases (the same quantize, per shard)",
    ("parallel.gather_quantized", "traced"): "runs under jax.jit by design (its with_sharding_constraint)",
    ("parallel.ring_attention", "special"): "dot_product_attention's special cases: the same reference per step",
    ("parallel.fsdp_mx_dot", "special"): "mx_dot_general's special cases: the same GEMM reference",
    ("parallel.fsdp_mx_dot", "traced"): "runs under jax.jit by design (gathers inside its custom VJP)",
    **{
        ("flax.use_quantized_gather", k): "takes a module and a function returning shardings: no array argument"
        for k in ("dtype", "rank", "shape", "axis", "special", "zero-size", "traced")
    },
    ("flax.dot_general", "rank"): "returns mx_dot_general with options bound (mx_dot_general's rank case)",
    ("flax.dot_general", "special"): "returns mx_dot_general with options bound (its special cases)",
    ("flax.attention_fn", "special"): "returns dot_product_attention with options bound (its special cases)",
    ("mx_dot_quantized.mx_dot_general_handoff", "special"): "mx_dot_general's GEMM with lhs_quantized (its cases)",
}


def covered(*tables: dict) -> set[tuple[str, str]]:
    """The (name, kind) pairs the tables' keys (name, kind, detail) reach."""
    return {(name, kind) for table in tables for name, kind, _ in table}
