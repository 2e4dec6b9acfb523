"""The MX GEMM kernel path with a sharded contracted dimension K (8 CPU devices,
implementation="emulated": the same custom_partitioning plumbing as the kernels).

K sharded in whole 128-K tiles: each device runs the float32 GEMM over its slice and the partials are
psummed (primitives/mx_gemm.py `_reduction`), so data parallelism's weight gradient (contraction over B*T)
and a row-parallel tensor-parallel GEMM (K over "model") gather no FP8 operand. The result equals the
unsharded one up to the float32 summation order of the K-tile partials (docs/numerics.md "Sharded K"):
checked against that bound on random data and bit for bit on data whose sums are exact in any order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8
from jax_mxfp8.primitives.gemm_operands import gemm_operands
from jax_mxfp8.primitives.mx_gemm import mx_gemm
from tests.parallel.sharding_testutil import COLLECTIVE, mesh, put
from tests.quantize import mx_oracle
from tests.seeding_testutil import test_rng

U = 2.0**-24  # float32 unit roundoff
DN = (((2,), (0,)), ((), ()))  # x (B, T, D) @ w (D, F)


def collectives_of(compiled) -> list[tuple[str, str]]:
    """(op, result shape) of every collective in a compiled executable (sharding_testutil.collectives without
    compiling again)."""
    return [(m["op"], m["shape"]) for m in COLLECTIVE.finditer(compiled.as_text())]


def _gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u): any summation order of n + 1 addends is within gamma_n * sum |addend|."""
    return n * U / (1 - n * U)


def _mx_values(x: np.ndarray, axis: int) -> np.ndarray:
    """|dequantize(quantize(x, axis))| in float64 (E4M3, "up"), from the NumPy oracle."""
    q = mx_oracle.quantize(x, axis=axis)
    return np.abs(mx_oracle.dequantize(q.data, q.scale, q.axes, q.fmt).astype(np.float64))


def _abs_products(a, b, axis_a: int, axis_b: int) -> np.ndarray:
    """sum_k |dequant(a)_k| |dequant(b)_k| in float64 (MX blocks of 32 along the contracted axes): the sum of
    the absolute K-tile partials, up to the align128 rounding (<< 2^-7 of it: the 1.01 slack)."""
    qa, qb = _mx_values(np.asarray(a, np.float32), axis_a), _mx_values(np.asarray(b, np.float32), axis_b)
    return 1.01 * np.tensordot(qa, qb, axes=([axis_a], [axis_b]))


@jax.jit
def _aligned(x) -> tuple[jax.Array, jax.Array]:
    """The MX GEMM's aligned operand of x (G, R, C) contracting C: data (G, R, C) FP8, scale (G, C/128, R)."""
    return gemm_operands(x, orientations=("row",), path="xla")["row"]


def _data(rng, shape, dtype, exact: bool) -> np.ndarray:
    """N(0, 1), or (exact) integers in [-8, 8]: exact in E4M3 under any power-of-two block scale and after
    align128 (a run's blocks differ by at most 3 exponents, far above subnormals), with float32-exact sums
    of products in any order."""
    return np.asarray(rng.integers(-8, 9, shape) if exact else rng.standard_normal(shape), dtype)


def _dp_wgrad(x, w, ct):
    """The weight gradient of y = mx_dot_general(x, w) for the cotangent ct (contraction over B * T)."""
    f = lambda w: jax_mxfp8.mx_dot_general(x, w, DN, implementation="emulated")  # noqa: E731
    return jax.vjp(f, w)[1](ct)[0]


def test_data_parallel_weight_gradient_sums_k_shards_without_gather():
    m = mesh((8,), ("data",))
    rng = test_rng()
    b, t, d, f = 8, 256, 256, 128  # M = B*T = 2048: 16 K tiles of the wgrad, 2 per device
    shard = lambda x, w, ct: (put(x, m, "data", None, None), put(w, m, None, None), put(ct, m, "data", None, None))  # noqa: E731
    compiled = None
    for exact in (False, True):
        x, w, ct = (_data(rng, s, dt, exact) for s, dt in (((b, t, d), jnp.bfloat16), ((d, f), jnp.float32),
                                                              ((b, t, f), jnp.float32)))  # fmt: skip
        want = np.asarray(jax.jit(_dp_wgrad)(x, w, ct))
        args = shard(x, w, ct)
        compiled = compiled or jax.jit(_dp_wgrad).lower(*args).compile()  # same shapes and shardings
        got = np.asarray(compiled(*args))
        if exact:  # every partial sum is an exact float32 integer: the order cannot matter
            np.testing.assert_array_equal(got, want)
        else:
            x2 = np.asarray(x, np.float32).reshape(b * t, d)
            bound = 2 * _gamma(b * t // 128 - 1) * _abs_products(x2, np.asarray(ct).reshape(b * t, f), 0, 0)
            assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
    ops = collectives_of(compiled)
    assert not [s for op, s in ops if op == "all-gather"], ops  # neither FP8 operand (nor anything) gathered
    assert any(op == "all-reduce" and f"[1,{d},{f}]" in s for op, s in ops), ops  # the float32 partials' psum


def _row_parallel(x, w, bias):
    """y = x @ w + bias: with K = D over "model", the second GEMM of a Megatron MLP."""
    return jax_mxfp8.mx_dot_general(x, w, DN, implementation="emulated", bias=bias)


def test_row_parallel_tensor_parallel_gemm_psums_k_without_gather():
    m = mesh((2, 4), ("data", "model"))
    rng = test_rng()
    b, t, d, f = 2, 128, 1024, 256  # D: 8 tiles, 2 per "model" device
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((b, t, d), (d, f), (f,)))  # numpy: host puts
    args = put(x, m, "data", None, "model"), put(w, m, "model", None), put(bias, m, None)
    want = np.asarray(jax.jit(_row_parallel)(x, w, bias))
    compiled = jax.jit(_row_parallel).lower(*args).compile()
    got = np.asarray(compiled(*args))
    # K = D summed over the 4 "model" shards, the bias added once (one more float32 rounding of y)
    bound = 2 * _gamma(d // 128 - 1) * _abs_products(np.asarray(x), np.asarray(w), 2, 0) + 2 * U * np.abs(want)
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
    ops = collectives_of(compiled)
    assert not [s for op, s in ops if op == "all-gather"], ops
    assert any(op == "all-reduce" and f"{t},{f}]" in s for op, s in ops), ops  # the float32 partials' psum


def test_k_shards_inside_a_tile_fall_back_to_the_gather():
    """The MX GEMM (bias, bfloat16 out) with Kp = 512 (4 tiles): over ("k", "n") = 8 devices (64 K each, half
    a tile) it gathers K and sums all of it on every device, bit for bit the unsharded result; over "k" = 4
    (one tile each) it psums the float32 partials, then adds the bias once and rounds once."""
    m = mesh((4, 2), ("k", "n"))
    rng = test_rng()
    kp = 512
    f = lambda a, b, sa, sb, bias: mx_gemm(a, b, sa, sb, bias, out_dtype=jnp.bfloat16, path="emulated")  # noqa: E731
    x, y = (rng.standard_normal((1, 128, kp)).astype(np.float32) for _ in range(2))
    (a, sa), (b, sb) = (tuple(np.asarray(o) for o in _aligned(z)) for z in (x, y))  # numpy: host puts
    bias = rng.standard_normal((128,)).astype(np.float32)
    want = np.asarray(jax.jit(f)(a, b, sa, sb, bias), np.float32)
    for k_axes, gathers in ((("k", "n"), True), ("k", False)):
        tiles = None if gathers else "k"  # the scales' 4 tiles do not split 8 ways
        args = (put(a, m, None, None, k_axes), put(b, m, None, None, k_axes), put(sa, m, None, tiles, None),
                put(sb, m, None, tiles, None), put(bias, m, None))  # fmt: skip
        compiled = jax.jit(f).lower(*args).compile()
        got = np.asarray(compiled(*args), np.float32)
        ops = collectives_of(compiled)
        if gathers:
            np.testing.assert_array_equal(got, want)
            assert any(op == "all-gather" for op, _ in ops), ops
            continue
        assert not any(op == "all-gather" for op, _ in ops), ops
        assert any(op == "all-reduce" for op, _ in ops), ops
        # the float32 sums differ by the order bound; the bias add and the bfloat16 cast (2^-7 |y|) by one step each
        bound = 2 * _gamma(kp // 128 - 1) * _abs_products(np.asarray(x)[0], np.asarray(y)[0], 1, 1)
        assert np.all(np.abs(got - want) <= bound + np.abs(want) * (2.0**-7 + 2 * U))
