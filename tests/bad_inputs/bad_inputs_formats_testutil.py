"""Bad-input cases of quantize, dequantize, MXArray, random_hadamard, rms_norm_quantize and the option
objects (AttentionConfig, MXDotConfig): the RAISES / RESULTS tables of tests/bad_inputs/bad_inputs_testutil.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8 as mx
from tests.bad_inputs.bad_inputs_testutil import F32, W64, X, assert_same, grads_like, shapes

E4 = jnp.float8_e4m3fn


def _q(**kw):
    return mx.quantize(kw.pop("x", X), **kw)


def _deq(dtype=F32, a=None, **kw):
    return mx.dequantize(mx.quantize(X) if a is None else a, dtype, **kw)


def _rms(x=X, w=W64, **kw):
    return mx.rms_norm_quantize(x, w, **kw)


def _mxa(**kw):
    a = mx.quantize(X)
    return mx.MXArray(**(dict(data=a.data, scale=a.scale, axes=a.axes, block=a.block) | kw))


def _tree_mapped(kind: str) -> mx.MXArray:
    """An MXArray that jax.tree_util.tree_map made inconsistent (tree_map does not re-validate)."""
    a = mx.quantize(X)
    fn = {
        "scale sliced": lambda x: x[:, :1] if x.dtype == jnp.uint8 else x,
        "data reshaped": lambda x: x.reshape(2, 128) if x.dtype == E4 else x,
        "data transposed": lambda x: x.T if x.dtype == E4 else x,
    }[kind]
    return jax.tree_util.tree_map(fn, a)


def _special_quantize():
    # NaN / Inf blocks -> scale 0xFF and NaN; float32's max round-trips saturated; tiny stays finite
    x = np.ones((32, 64), np.float32)  # 32 rows: the kernel path ("emulated") covers it
    x[0, 3], x[1, 40], x[2, 0], x[3, 0] = np.nan, np.inf, np.finfo(np.float32).max, 1e-45
    for impl in ("xla", "emulated"):
        q = mx.quantize(jnp.asarray(x), implementation=impl)
        d = np.asarray(mx.dequantize(q))
        assert np.asarray(q.scale)[0, 0] == 0xFF and np.asarray(q.scale)[1, 1] == 0xFF, impl
        assert np.all(np.isnan(d[0, :32])) and np.all(np.isnan(d[1, 32:])) and np.all(d[0, 32:] == 1)
        assert d[2, 0] == np.finfo(np.float32).max and np.all(np.isfinite(d[2:, 1:])) and np.isfinite(d[3, 0])
        assert np.asarray(mx.dequantize(q, jnp.bfloat16))[2, 0] == jnp.finfo(jnp.bfloat16).max


def _zero_rows_quantize():
    for impl in ("xla", "emulated"):
        for block, axis in (("row", -1), ("row", -2)):
            x = jnp.zeros((0, 64)) if axis == -1 else jnp.zeros((64, 0))
            e = mx.quantize(x, axis=axis, block=block, implementation=impl)
            want = (
                [((0, 64), "float8_e4m3fn"), ((0, 2), "uint8")]
                if axis == -1
                else [((64, 0), "float8_e4m3fn"), ((2, 0), "uint8")]
            )
            assert shapes(e) == want, (impl, axis)
            assert mx.dequantize(e, implementation=impl).shape == x.shape


def _traced_quantize():
    key = jax.random.key(0)
    f = lambda x, k: mx.quantize(x, rounding="stochastic", rng=k)
    assert_same(jax.jit(f)(X, key), f(X, key))
    assert_same(
        jax.jit(lambda x: mx.quantize(x, block="square", axis=(0, 1)))(X[:, :64].repeat(8, 0)),
        mx.quantize(X[:, :64].repeat(8, 0), block="square", axis=(0, 1)),
    )


def _traced_mxarray():
    a = mx.quantize(X)
    bad = jnp.zeros((4, 1), jnp.uint8)
    try:
        jax.jit(lambda d, s: mx.MXArray(d, s, (-1,), "row").dequantize())(a.data, bad)
        raise AssertionError("no ValueError")
    except ValueError as e:
        assert "scale has shape" in str(e)
    assert_same(jax.jit(lambda d, s: mx.dequantize(mx.MXArray(d, s, (-1,), "row")))(a.data, a.scale), mx.dequantize(a))
    # tree_map under jit and vmap (tracer leaves): consistent results pass the consumers' checks
    stacked = jax.vmap(mx.quantize)(jnp.stack([X, 2 * X]))
    assert_same(
        jax.vmap(lambda q: jax.tree_util.tree_map(lambda v: v, q).dequantize())(stacked)[1],
        mx.dequantize(mx.quantize(2 * X)),
    )


def _traced_mxarray_tree_map_inconsistent():
    a = mx.quantize(X)
    f = jax.jit(lambda q: mx.dequantize(jax.tree_util.tree_map(lambda x: x[:, :1] if x.dtype == jnp.uint8 else x, q)))
    f(a)


def _special_dequantize():
    a = mx.quantize(jnp.full((2, 64), 3.0e38).at[1].set(jnp.nan))
    d = np.asarray(mx.dequantize(a, jnp.float16))
    assert np.all(d[0] == np.finfo(np.float16).max) and np.all(np.isnan(d[1]))


def _zero_size_rms():
    for impl in ("xla", "emulated"):
        y, q = _rms(x=jnp.zeros((0, 64)), implementation=impl)
        assert shapes((y, q)) == [((0, 64), "float32"), ((0, 64), "float8_e4m3fn"), ((0, 2), "uint8")]
        grads_like(lambda x, w, impl=impl: _rms(x=x, w=w, implementation=impl)[0], jnp.zeros((0, 64)), W64)


def _special_rms():
    # a zero row is zero (not NaN); a NaN row stays NaN and leaves the other rows alone; tiny rows normalise
    x = jnp.zeros((3, 64)).at[1, 5].set(jnp.nan).at[2].set(1e-30)
    for impl in ("xla", "emulated"):
        y, q = _rms(x=x, implementation=impl)
        y, d = np.asarray(y), np.asarray(mx.dequantize(q))
        assert not np.any(y[0]) and not np.any(d[0]) and np.all(np.isnan(y[1])), impl
        np.testing.assert_allclose(y[2], 1e-30 / np.sqrt(1e-60 + 1e-6), rtol=1e-6)  # eps dominates: x / sqrt(eps)


def _traced_rms():
    f = jax.jit(lambda x, w: _rms(x=x, w=w))
    assert_same(f(X, W64), _rms())


def _traced_hadamard():
    key = jax.random.key(3)
    assert_same(jax.jit(lambda k: mx.random_hadamard(X, k))(key), mx.random_hadamard(X, key))


def _special_hadamard():
    # a NaN stays within its Hadamard block (the transform mixes 32 elements, no more); huge values stay finite
    y = np.asarray(mx.random_hadamard(X.at[0, 3].set(jnp.nan).at[1].set(1e37), 0))
    assert np.all(np.isnan(y[0, :32])) and not np.any(np.isnan(y[0, 32:])) and np.all(np.isfinite(y[1:]))


def _zero_size_hadamard():
    for x in (jnp.zeros((0, 64)), jnp.zeros((4, 0))):
        assert mx.random_hadamard(x, 0).shape == x.shape


def _int_fields_normalised():
    for cfg, want in (
        (
            mx.AttentionConfig(kv_tile=np.int64(64), dq_fp16_scale_log2=np.int32(3), deterministic=np.True_),
            mx.AttentionConfig(kv_tile=64, dq_fp16_scale_log2=3, deterministic=True),
        ),
        (
            mx.MXDotConfig(hadamard_block=np.int64(64), hadamard_seed=np.uint32(7)),
            mx.MXDotConfig(hadamard_block=64, hadamard_seed=7),
        ),
    ):
        assert cfg == want and hash(cfg) == hash(want) and repr(cfg) == repr(want)
    cfg = mx.AttentionConfig(kv_tile=np.int64(64))
    assert type(cfg.kv_tile) is int and type(mx.MXDotConfig(hadamard_block=np.int8(32)).hadamard_block) is int


def _traced_config(make):
    def run():
        jax.jit(lambda v: make(v) and 0)(jnp.int32(64))

    return run


RAISES = {
    # quantize
    ("quantize", "dtype", "int"): (lambda: _q(x=X.astype(jnp.int32)), "x has dtype int32"),
    ("quantize", "dtype", "fp8"): (lambda: _q(x=X.astype(E4)), "x has dtype"),
    ("quantize", "dtype", "MXArray"): (lambda: _q(x=mx.quantize(X)), "x is an MXArray"),
    ("quantize", "dtype", "str"): (lambda: _q(x="abc"), "x must be a float array"),
    ("quantize", "dtype", "int emulated"): (
        lambda: _q(x=X.astype(jnp.int32), implementation="emulated"),
        "x has dtype",
    ),
    ("quantize", "option", "dtype"): (lambda: _q(dtype=jnp.float16), "dtype"),
    ("quantize", "option", "dtype str"): (lambda: _q(dtype="abc"), "dtype"),
    ("quantize", "rank", "0"): (lambda: _q(x=jnp.float32(1)), "axis"),
    ("quantize", "axis", "range"): (lambda: _q(axis=2), "axis=2"),
    ("quantize", "axis", "float"): (lambda: _q(axis=1.0), "axis=1.0"),
    ("quantize", "axis", "None"): (lambda: _q(axis=None), "axis=None"),
    ("quantize", "axis", "str"): (lambda: _q(axis="a"), "axis='a'"),
    ("quantize", "axis", "square one axis"): (lambda: _q(block="square", axis=(1,)), "axis="),
    ("quantize", "option", "block"): (lambda: _q(block="bogus"), "block='bogus'"),
    ("quantize", "option", "scale_rounding"): (lambda: _q(scale_rounding="bogus"), "scale_rounding"),
    ("quantize", "option", "rounding"): (lambda: _q(rounding="bogus"), "rounding"),
    ("quantize", "option", "no rng"): (lambda: _q(rounding="stochastic"), "rng|PRNG"),
    ("quantize", "option", "bad rng"): (lambda: _q(rounding="stochastic", rng="abc"), "rng="),
    ("quantize", "option", "implementation"): (lambda: _q(implementation="bogus"), "implementation"),
    ("quantize", "shape", "48"): (lambda: _q(x=X[:, :48]), "axis 1 of x has size 48"),
    ("quantize", "shape", "48 emulated"): (
        lambda: _q(x=X[:, :48], implementation="emulated"),
        "axis 1 of x has size 48",
    ),
    ("quantize", "zero-size", "blocked axis"): (lambda: _q(x=X[:, :0]), "axis 1 of x has size 0"),
    ("quantize", "zero-size", "blocked axis emulated"): (
        lambda: _q(x=X[:, :0], implementation="emulated"),
        "axis 1 of x",
    ),
    ("quantize", "zero-size", "square"): (lambda: _q(x=X[:0], block="square", axis=(0, 1)), "axis 0 of x has size 0"),
    ("quantize", "special", "float64 beyond float32"): (
        lambda: _q(x=np.asarray(X, np.float64) * 1e300),
        "x holds .* beyond float32",
    ),
    # dequantize
    ("dequantize", "dtype", "array"): (lambda: mx.dequantize(X), "MXArray"),
    ("dequantize", "dtype", "int32"): (lambda: _deq(jnp.int32), "dtype=int32"),
    ("dequantize", "dtype", "bool"): (lambda: _deq(jnp.bool_), "dtype=bool"),
    ("dequantize", "dtype", "fp8"): (lambda: _deq(E4), "dtype=float8"),
    ("dequantize", "dtype", "str"): (lambda: _deq("abc"), "dtype='abc'"),
    ("dequantize", "option", "implementation"): (lambda: _deq(implementation="bogus"), "implementation"),
    ("dequantize", "shape", "tree_map scale sliced"): (
        lambda: _deq(a=_tree_mapped("scale sliced")),
        r"a scale has shape \(4, 1\)",
    ),
    ("dequantize", "shape", "tree_map scale emulated"): (
        lambda: _deq(a=_tree_mapped("scale sliced"), implementation="emulated"),
        "a scale has shape",
    ),
    ("dequantize", "shape", "tree_map data transposed"): (
        lambda: _deq(a=_tree_mapped("data transposed")),
        "a data has shape|a scale has shape",
    ),
    ("dequantize", "shape", "tree_map method"): (
        lambda: _tree_mapped("scale sliced").dequantize(),
        "MXArray scale has shape",
    ),
    ("dequantize", "shape", "tree_map None leaves"): (
        lambda: _deq(a=jax.tree_util.tree_map(lambda _: None, mx.quantize(X))),
        "a data must be an array",
    ),
    ("dequantize", "traced", "tree_map under jit"): (_traced_mxarray_tree_map_inconsistent, "a scale has shape"),
    # MXArray fields
    ("MXArray", "dtype", "scale"): (lambda: _mxa(scale=jnp.zeros((4, 2), F32)), "scale has dtype"),
    ("MXArray", "dtype", "data"): (lambda: _mxa(data=X), "data has dtype"),
    ("MXArray", "shape", "scale"): (lambda: _mxa(scale=jnp.zeros((4, 1), jnp.uint8)), "scale has shape"),
    ("MXArray", "rank", "axes beyond data"): (lambda: _mxa(axes=(-3,)), "axes=.*out of range"),
    ("MXArray", "option", "block"): (lambda: _mxa(block="bogus"), "block="),
    ("MXArray", "option", "square one axis"): (lambda: _mxa(block="square"), "axes="),
    ("MXArray", "axis", "positive"): (lambda: _mxa(axes=(5,)), "axes="),
    ("MXArray", "zero-size", "blocked axis of 16"): (
        lambda: mx.MXArray(jnp.zeros((0, 16), E4), jnp.zeros((0, 0), jnp.uint8), (-1,), "row"),
        "not a multiple",
    ),
    # random_hadamard
    ("random_hadamard", "dtype", "int"): (lambda: mx.random_hadamard(X.astype(jnp.int32), 0), "x has dtype int32"),
    ("random_hadamard", "dtype", "fp8"): (lambda: mx.random_hadamard(X.astype(E4), 0), "x has dtype float8"),
    ("random_hadamard", "rank", "0"): (lambda: mx.random_hadamard(jnp.float32(1), 0), "x must have rank"),
    ("random_hadamard", "axis", "range"): (lambda: mx.random_hadamard(X, 0, axis=5), "axis=5"),
    ("random_hadamard", "axis", "float"): (lambda: mx.random_hadamard(X, 0, axis=1.0), "axis=1.0"),
    ("random_hadamard", "shape", "block 0"): (lambda: mx.random_hadamard(X, 0, block_size=0), "block_size=0"),
    ("random_hadamard", "shape", "block 48"): (lambda: mx.random_hadamard(X, 0, block_size=48), "block_size=48"),
    ("random_hadamard", "shape", "block > axis"): (lambda: mx.random_hadamard(X, 0, block_size=128), "block_size=128"),
    ("random_hadamard", "option", "block str"): (lambda: mx.random_hadamard(X, 0, block_size="a"), "block_size='a'"),
    ("random_hadamard", "option", "key str"): (lambda: mx.random_hadamard(X, "abc"), "key='abc'"),
    ("random_hadamard", "option", "key float"): (lambda: mx.random_hadamard(X, 1.5), "key=1.5"),
    ("random_hadamard", "option", "inverse str"): (lambda: mx.random_hadamard(X, 0, inverse="yes"), "inverse='yes'"),
    # rms_norm_quantize
    ("rms_norm_quantize", "option", "eps negative"): (lambda: _rms(eps=-1.0), "eps=-1"),
    ("rms_norm_quantize", "option", "eps str"): (lambda: _rms(eps="abc"), "eps='abc'"),
    ("rms_norm_quantize", "special", "eps nan"): (lambda: _rms(eps=float("nan")), "eps=nan"),
    ("rms_norm_quantize", "special", "eps inf"): (lambda: _rms(eps=float("inf")), "eps=inf"),
    ("rms_norm_quantize", "dtype", "int"): (lambda: _rms(x=X.astype(jnp.int32)), "x has dtype"),
    ("rms_norm_quantize", "rank", "0"): (lambda: _rms(x=jnp.float32(1)), "x must have rank"),
    ("rms_norm_quantize", "shape", "weight"): (lambda: _rms(w=jnp.ones((32,))), "weight has shape"),
    ("rms_norm_quantize", "shape", "D 48"): (lambda: _rms(x=X[:, :48], w=W64[:48]), "axis 1 of x"),
    ("rms_norm_quantize", "zero-size", "D 0"): (lambda: _rms(x=X[:, :0], w=W64[:0]), "axis 1 of x has size 0"),
    ("rms_norm_quantize", "option", "scale_rounding"): (lambda: _rms(scale_rounding="bogus"), "scale_rounding"),
    ("rms_norm_quantize", "option", "dtype"): (lambda: _rms(dtype=jnp.int8), "dtype"),
    ("rms_norm_quantize", "option", "implementation"): (lambda: _rms(implementation="bogus"), "implementation"),
    ("rms_norm_quantize", "traced", "eps"): (lambda: jax.jit(lambda e: _rms(eps=e))(1e-6), "eps=.* must be a concrete"),
    # option objects: one rule for every integer field (ints and NumPy integers; no bools, no floats)
    ("AttentionConfig", "option", "qkv_blocks"): (lambda: mx.AttentionConfig(qkv_blocks="bogus"), "qkv_blocks"),
    ("AttentionConfig", "option", "p_scale"): (lambda: mx.AttentionConfig(p_scale="bogus"), "p_scale"),
    ("AttentionConfig", "option", "dq_accum"): (lambda: mx.AttentionConfig(dq_accum="bf16"), "dq_accum"),
    ("AttentionConfig", "option", "kv_tile 48"): (lambda: mx.AttentionConfig(kv_tile=48), "kv_tile=48"),
    ("AttentionConfig", "option", "dq_fp16_scale_log2 16"): (
        lambda: mx.AttentionConfig(dq_fp16_scale_log2=16),
        "dq_fp16_scale_log2=16",
    ),
    ("AttentionConfig", "option", "deterministic str"): (
        lambda: mx.AttentionConfig(deterministic="yes"),
        "deterministic",
    ),
    ("AttentionConfig", "option", "causal_safe int"): (lambda: mx.AttentionConfig(causal_safe=1), "causal_safe=1"),
    ("AttentionConfig", "dtype", "kv_tile float"): (lambda: mx.AttentionConfig(kv_tile=64.0), "kv_tile=64.0"),
    ("AttentionConfig", "dtype", "kv_tile np float"): (lambda: mx.AttentionConfig(kv_tile=np.float32(64)), "kv_tile="),
    ("AttentionConfig", "dtype", "kv_tile bool"): (lambda: mx.AttentionConfig(kv_tile=True), "kv_tile=True"),
    ("AttentionConfig", "dtype", "dq_fp16_scale_log2 float"): (
        lambda: mx.AttentionConfig(dq_fp16_scale_log2=3.0),
        "dq_fp16_scale_log2=3.0",
    ),
    ("AttentionConfig", "dtype", "dq_fp16_scale_log2 bool"): (
        lambda: mx.AttentionConfig(dq_fp16_scale_log2=np.True_),
        "dq_fp16_scale_log2=",
    ),
    ("AttentionConfig", "zero-size", "kv_tile 0"): (lambda: mx.AttentionConfig(kv_tile=0), "kv_tile=0"),
    ("AttentionConfig", "traced", "kv_tile"): (_traced_config(lambda v: mx.AttentionConfig(kv_tile=v)), "kv_tile="),
    ("MXDotConfig", "option", "weight_grad"): (lambda: mx.MXDotConfig(weight_grad="fp16"), "weight_grad"),
    ("MXDotConfig", "option", "hadamard_seed str"): (lambda: mx.MXDotConfig(hadamard_seed="a"), "hadamard_seed='a'"),
    ("MXDotConfig", "option", "hadamard_block 48"): (lambda: mx.MXDotConfig(hadamard_block=48), "hadamard_block=48"),
    ("MXDotConfig", "option", "hadamard_block str"): (lambda: mx.MXDotConfig(hadamard_block="a"), "hadamard_block='a'"),
    ("MXDotConfig", "dtype", "element dtype"): (lambda: mx.MXDotConfig(dtype=jnp.float16), "dtype"),
    ("MXDotConfig", "dtype", "hadamard_block float"): (
        lambda: mx.MXDotConfig(hadamard_block=32.0),
        "hadamard_block=32.0",
    ),
    ("MXDotConfig", "dtype", "hadamard_block bool"): (
        lambda: mx.MXDotConfig(hadamard_block=True),
        "hadamard_block=True",
    ),
    ("MXDotConfig", "dtype", "hadamard_seed float"): (lambda: mx.MXDotConfig(hadamard_seed=1.0), "hadamard_seed=1.0"),
    ("MXDotConfig", "zero-size", "hadamard_block 0"): (lambda: mx.MXDotConfig(hadamard_block=0), "hadamard_block=0"),
    ("MXDotConfig", "traced", "hadamard_seed"): (
        _traced_config(lambda v: mx.MXDotConfig(hadamard_seed=v)),
        "hadamard_seed=",
    ),
}

RESULTS = {
    ("quantize", "special", "NaN Inf huge tiny"): _special_quantize,
    ("quantize", "zero-size", "no rows"): _zero_rows_quantize,
    ("quantize", "traced", "jit equals eager"): _traced_quantize,
    ("dequantize", "special", "saturates, NaN blocks"): _special_dequantize,
    ("dequantize", "zero-size", "no rows"): _zero_rows_quantize,
    ("dequantize", "traced", "MXArray leaves under jit and vmap"): _traced_mxarray,
    ("MXArray", "traced", "validated at trace time"): _traced_mxarray,
    ("MXArray", "zero-size", "no rows"): lambda: _mxa(data=jnp.zeros((0, 64), E4), scale=jnp.zeros((0, 2), jnp.uint8)),
    ("random_hadamard", "special", "NaN stays in its block"): _special_hadamard,
    ("random_hadamard", "zero-size", "empty axes"): _zero_size_hadamard,
    ("random_hadamard", "traced", "traced key"): _traced_hadamard,
    ("rms_norm_quantize", "special", "zero, NaN, tiny rows"): _special_rms,
    ("rms_norm_quantize", "zero-size", "no rows, gradients"): _zero_size_rms,
    ("rms_norm_quantize", "traced", "jit equals eager"): _traced_rms,
    ("AttentionConfig", "option", "NumPy integers normalised"): _int_fields_normalised,
    ("MXDotConfig", "option", "NumPy integers normalised"): _int_fields_normalised,
}
