"""Bad-input cases of the GEMMs: mx_dot_general, mx_dot_general_quantized, mx_dot_general_handoff and the
FSDP helpers: the RAISES / RESULTS tables of tests/bad_inputs/bad_inputs_testutil.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp8 as mx
from jax_mxfp8.ops.mx_dot_quantized import WgradOperand, mx_dot_general_handoff, mx_dot_general_quantized
from jax_mxfp8.parallel import fsdp_mx_dot, gather_quantized
from tests.bad_inputs.bad_inputs_testutil import DN, F32, WM, assert_same, grads_like, rand, shapes

IMPLS = ("xla", "emulated")
X = rand((32, 64), 1)  # (M, K): M a multiple of 32, so the kernel path ("emulated") covers the calls
XB, WB = X.astype(jnp.bfloat16), WM.astype(jnp.bfloat16)  # the quantize epilogue writes bfloat16
BDN = (((2,), (1,)), ((0,), (0,)))  # (G, M, K) x (G, K, N)


def _dot(lhs=X, rhs=WM, dn=DN, **kw):
    return mx.mx_dot_general(lhs, rhs, dn, **kw)


def _dq(lhs=X, rhs=WM, dn=DN, **kw):
    return mx_dot_general_quantized(lhs, rhs, dn, **kw)


def _handoff(lhs=X, **kw):
    if "lhs_quantized" not in kw:
        kw["lhs_quantized"] = mx.quantize(lhs)
    return mx_dot_general_handoff(lhs, WM, DN, **(dict(lhs_wgrad=None) | kw))


def _replicated():
    return NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("fsdp",)), P())


def _fsdp(x=X, w=WM, **kw):
    return jax.jit(lambda x, w: fsdp_mx_dot(x, w, _replicated(), **kw))(x, w)


def _scale_sliced(a):
    return jax.tree_util.tree_map(lambda x: x[:, :1] if x.dtype == jnp.uint8 else x, a)


def _empty_operands():
    """(lhs, rhs, dimension_numbers, expected output shape) with a batch or free size 0."""
    return (
        (jnp.zeros((0, 64)), WM, DN, (0, 32)),
        (X, jnp.zeros((64, 0)), DN, (32, 0)),
        (jnp.zeros((0, 32, 64)), jnp.zeros((0, 64, 32)), BDN, (0, 32, 32)),
    )


def _zero_size_dot():
    for impl in IMPLS:
        for lhs, rhs, dn, want in _empty_operands():
            bias = jnp.zeros(want[-1:])
            assert shapes(_dot(lhs, rhs, dn, implementation=impl)) == [(want, "float32")], impl
            grads_like(lambda a, b, c, dn=dn, impl=impl: _dot(a, b, dn, bias=c, implementation=impl), lhs, rhs, bias)


def _zero_size_dot_quantized():
    # M = 0 (and G = 0): y, y_q and y_w of the documented shapes, on every path; N = 0 is a blocked axis
    for impl in IMPLS:
        for lhs, rhs, dn, want in (_empty_operands()[0], _empty_operands()[2]):
            g, m, n = (1,) * (3 - len(want)) + want
            mp = -(-m // 128) * 128
            for orient in (("row",), ("row", "col"), ("row", "wgrad")):
                out = _dq(lhs, rhs, dn, orientations=orient, implementation=impl, activation="gelu")
                expect = [(want, "float32"), (want, "float8_e4m3fn"), (want[:-1] + (n // 32,), "uint8")]
                expect += [((g, n, mp), "float8_e4m3fn"), ((g, mp // 128, n), "float32")] if len(orient) == 2 else []
                assert shapes(out) == expect, (impl, orient, shapes(out))
                grads_like(
                    lambda a, b, dn=dn, o=orient, i=impl: _dq(a, b, dn, orientations=o, implementation=i)[0], lhs, rhs
                )


def _zero_size_handoff():
    lhs = jnp.zeros((0, 64))
    for impl in IMPLS:
        _, y_q, y_w = _dq(lhs, WM, DN, orientations=("row", "col"), implementation=impl)
        w2 = jnp.ones((32, 32))
        out = mx_dot_general_handoff(jnp.zeros((0, 32)), w2, DN, lhs_quantized=y_q, lhs_wgrad=y_w, implementation=impl)
        assert shapes(out) == [((0, 32), "float32")]


def _zero_size_fsdp():
    assert shapes(_fsdp(x=jnp.zeros((0, 64)))) == [((0, 32), "float32")]
    g = jax.jit(jax.grad(lambda x, w: jnp.sum(fsdp_mx_dot(x, w, _replicated())), (0, 1)))(jnp.zeros((0, 64)), WM)
    assert shapes(g) == [((0, 64), "float32"), ((64, 32), "float32")] and not np.any(np.asarray(g[1]))


def _special_dot():
    # NaN / Inf in an lhs row stay in that output row; huge finite values give finite products
    x = X.at[0, 3].set(jnp.nan).at[1, 40].set(jnp.inf).at[2].set(1e30)  # 1e30 * 1: finite
    for impl in IMPLS:
        y = np.asarray(_dot(lhs=x, rhs=WM, implementation=impl))
        assert np.all(np.isnan(y[:2])) and np.all(np.isfinite(y[2:])), impl


def _special_dot_quantized():
    x = XB.at[0, 3].set(jnp.nan)
    for impl in IMPLS:
        y, y_q = _dq(lhs=x, rhs=WB, implementation=impl)
        d = np.asarray(mx.dequantize(y_q))
        assert np.all(np.isnan(np.asarray(y.astype(F32))[0])) and np.all(np.isnan(d[0])), impl
        assert np.all(np.isfinite(d[1:])), impl


def _traced_dot():
    for impl in IMPLS:
        f = lambda a, b, impl=impl: _dot(a, b, implementation=impl)
        assert_same(jax.jit(f)(X, WM), f(X, WM))


def _traced_dot_quantized():
    for impl in IMPLS:
        g = lambda a, b, impl=impl: _dq(a, b, implementation=impl, orientations=("row", "col"))
        assert_same(jax.jit(g)(XB, WB), g(XB, WB))


def _traced_handoff():
    _, y_q, y_w = _dq(XB, WB, DN, orientations=("row", "col"), implementation="emulated")
    h, w2 = jnp.ones((32, 32), jnp.bfloat16), jnp.ones((32, 32), jnp.bfloat16)
    f = lambda h: mx_dot_general_handoff(h, w2, DN, lhs_quantized=y_q, lhs_wgrad=y_w, implementation="emulated")
    assert_same(jax.jit(f)(h), f(h))


def _traced_seed():
    jax.jit(lambda s: _dot(hadamard_seed=s))(1)


RAISES = {
    # mx_dot_general
    ("mx_dot_general", "dtype", "int"): (lambda: _dot(lhs=X.astype(jnp.int32)), "lhs has dtype"),
    ("mx_dot_general", "dtype", "int emulated"): (
        lambda: _dot(rhs=WM.astype(jnp.int32), implementation="emulated"),
        "rhs has dtype",
    ),
    ("mx_dot_general", "rank", "scalar lhs"): (lambda: _dot(lhs=jnp.float32(1)), "dimension_numbers"),
    ("mx_dot_general", "axis", "dn wrap"): (lambda: _dot(dn=(((5,), (0,)), ((), ()))), "dimension_numbers"),
    ("mx_dot_general", "axis", "dn negative"): (lambda: _dot(dn=(((-1,), (0,)), ((), ()))), "dimension_numbers"),
    ("mx_dot_general", "axis", "dn nonsense"): (lambda: _dot(dn="nonsense"), "dimension_numbers"),
    ("mx_dot_general", "shape", "dn sizes"): (lambda: _dot(dn=(((0,), (0,)), ((), ()))), "differ in size"),
    ("mx_dot_general", "shape", "K 48"): (lambda: _dot(lhs=X[:, :48], rhs=WM[:48]), "multiple of the MX block"),
    ("mx_dot_general", "shape", "bias"): (lambda: _dot(bias=jnp.ones((3,))), "bias must be"),
    ("mx_dot_general", "shape", "tree_map lhs"): (
        lambda: _dot(lhs=_scale_sliced(mx.quantize(X))),
        r"lhs scale has shape \(32, 1\)",
    ),
    ("mx_dot_general", "shape", "tree_map lhs_quantized"): (
        lambda: _dot(lhs_quantized=_scale_sliced(mx.quantize(X))),
        "lhs_quantized scale has shape",
    ),
    ("mx_dot_general", "zero-size", "K 0"): (lambda: _dot(lhs=X[:, :0], rhs=WM[:0]), "multiple of the MX block"),
    ("mx_dot_general", "option", "weight_grad"): (lambda: _dot(weight_grad="fp16"), "weight_grad"),
    ("mx_dot_general", "option", "dtype"): (lambda: _dot(dtype=jnp.float16), "dtype"),
    ("mx_dot_general", "option", "preferred type"): (
        lambda: _dot(preferred_element_type="abc"),
        "preferred_element_type",
    ),
    ("mx_dot_general", "option", "implementation"): (lambda: _dot(implementation="tpu"), "implementation"),
    ("mx_dot_general", "option", "stochastic no rng"): (lambda: _dot(grad_rounding="stochastic"), "rng"),
    ("mx_dot_general", "option", "hadamard_seed"): (lambda: _dot(hadamard_seed=1.5), "hadamard_seed=1.5"),
    ("mx_dot_general", "special", "float64 beyond float32"): (
        lambda: _dot(lhs=np.asarray(X, np.float64) * 1e300),
        "lhs holds",
    ),
    ("mx_dot_general", "traced", "hadamard_seed"): (_traced_seed, "hadamard_seed="),
    # mx_dot_general_quantized: mx_dot_general's checks on every path, then its own
    ("mx_dot_quantized.mx_dot_general_quantized", "dtype", "int"): (
        lambda: _dq(lhs=X.astype(jnp.int32)),
        "lhs has dtype",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "dtype", "int emulated"): (
        lambda: _dq(lhs=X.astype(jnp.int32), implementation="emulated"),
        "lhs has dtype",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "rank", "scalar"): (
        lambda: _dq(lhs=jnp.float32(1)),
        "dimension_numbers",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "axis", "dn"): (
        lambda: _dq(dn=(((3,), (0,)), ((), ()))),
        "dimension_numbers",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "shape", "N 48"): (
        lambda: _dq(rhs=WM[:, :16].repeat(3, 1)),
        "last axis",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "shape", "tree_map lhs_quantized"): (
        lambda: _dq(lhs_quantized=_scale_sliced(mx.quantize(X)), implementation="emulated"),
        "lhs_quantized scale",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "zero-size", "N 0"): (
        lambda: _dq(rhs=WM[:, :0]),
        "positive multiple of 32",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "option", "orientations"): (
        lambda: _dq(orientations=("col",)),
        "orientations=",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "option", "activation"): (
        lambda: _dq(activation="relu"),
        "activation='relu'",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "special", "float64 beyond float32"): (
        lambda: _dq(rhs=np.asarray(WM, np.float64) * 1e300, implementation="emulated"),
        "rhs holds",
    ),
    ("mx_dot_quantized.mx_dot_general_quantized", "traced", "hadamard_seed"): (
        lambda: jax.jit(lambda s: _dq(hadamard_seed=s))(1),
        "hadamard_seed=",
    ),
    # mx_dot_general_handoff
    ("mx_dot_quantized.mx_dot_general_handoff", "option", "lhs_wgrad str"): (
        lambda: _handoff(lhs_wgrad="x", implementation="emulated"),
        "lhs_wgrad must be a WgradOperand",
    ),
    ("mx_dot_quantized.mx_dot_general_handoff", "option", "lhs_wgrad None leaves"): (
        lambda: _handoff(lhs_wgrad=WgradOperand(None, None)),
        "lhs_wgrad must be",
    ),
    ("mx_dot_quantized.mx_dot_general_handoff", "option", "lhs_quantized str"): (
        lambda: _handoff(lhs_quantized="x"),
        "lhs_quantized must be an MXArray",
    ),
    ("mx_dot_quantized.mx_dot_general_handoff", "option", "lhs MXArray"): (
        lambda: _handoff(lhs=mx.quantize(X), lhs_quantized=mx.quantize(X)),
        "lhs must be a float array",
    ),
    ("mx_dot_quantized.mx_dot_general_handoff", "dtype", "int lhs"): (
        lambda: _handoff(lhs=X.astype(jnp.int32), lhs_quantized=mx.quantize(X)),
        "lhs has dtype",
    ),
    ("mx_dot_quantized.mx_dot_general_handoff", "rank", "lhs_quantized rank"): (
        lambda: _handoff(lhs_quantized=mx.quantize(X[None])),
        "lhs_quantized has shape",
    ),
    ("mx_dot_quantized.mx_dot_general_handoff", "shape", "tree_map lhs_quantized"): (
        lambda: _handoff(lhs_quantized=_scale_sliced(mx.quantize(X))),
        "lhs_quantized scale has shape",
    ),
    # FSDP
    ("parallel.fsdp_mx_dot", "dtype", "int x"): (lambda: _fsdp(x=X.astype(jnp.int32)), "x has dtype"),
    ("parallel.fsdp_mx_dot", "rank", "3-D weight"): (lambda: _fsdp(w=WM[None]), "fsdp_mx_dot covers"),
    ("parallel.fsdp_mx_dot", "shape", "K 48"): (lambda: _fsdp(x=X[:, :48], w=WM[:48]), "multiple of the MX block"),
    ("parallel.fsdp_mx_dot", "shape", "tree_map x_quantized"): (
        lambda: _fsdp(x_quantized=_scale_sliced(mx.quantize(X))),
        "x_quantized scale",
    ),
    ("parallel.fsdp_mx_dot", "option", "config"): (lambda: _fsdp(config="fast"), "config must be an MXDotConfig"),
    ("parallel.fsdp_mx_dot", "option", "stochastic"): (
        lambda: _fsdp(config=mx.MXDotConfig(grad_rounding="stochastic")),
        "nearest rounding",
    ),
    ("parallel.gather_quantized", "dtype", "int"): (
        lambda: gather_quantized(WM.astype(jnp.int32), _replicated()),
        "w has dtype",
    ),
    ("parallel.gather_quantized", "shape", "48"): (
        lambda: gather_quantized(WM[:48], _replicated()),
        "axis 0 of w has size 48",
    ),
    ("parallel.gather_quantized", "axis", "range"): (lambda: gather_quantized(WM, _replicated(), axis=3), "axis=3"),
    ("parallel.gather_quantized", "option", "scale_rounding"): (
        lambda: gather_quantized(WM, _replicated(), scale_rounding="x"),
        "scale_rounding",
    ),
    ("parallel.gather_quantized", "zero-size", "blocked axis"): (
        lambda: gather_quantized(WM[:0], _replicated()),
        "has size 0",
    ),
}

RESULTS = {
    ("mx_dot_general", "zero-size", "M, N, G = 0: lax's shapes, zero gradients"): _zero_size_dot,
    ("mx_dot_general", "special", "NaN stays in its row"): _special_dot,
    ("mx_dot_general", "traced", "jit equals eager"): _traced_dot,
    ("mx_dot_quantized.mx_dot_general_quantized", "zero-size", "M, G = 0 every orientation"): _zero_size_dot_quantized,
    ("mx_dot_quantized.mx_dot_general_quantized", "special", "NaN row"): _special_dot_quantized,
    ("mx_dot_quantized.mx_dot_general_quantized", "traced", "jit equals eager"): _traced_dot_quantized,
    ("mx_dot_quantized.mx_dot_general_handoff", "zero-size", "M = 0"): _zero_size_handoff,
    ("mx_dot_quantized.mx_dot_general_handoff", "traced", "jit equals eager"): _traced_handoff,
    ("parallel.fsdp_mx_dot", "zero-size", "M = 0"): _zero_size_fsdp,
}
