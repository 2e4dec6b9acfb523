"""The Blackwell kernel path, emulated (library.forced_gpu), against the XLA reference, bit for bit.

On this path every operand is quantized per the contract (blocks of 32 along the contracting axis, no 128-run
alignment: formats.quantize's bits, scales in the blocked layout) and the GEMM sums exact 32-block products in
float32 (primitives/mx_gemm_sm100_emulation.py), so its results equal the reference's (reference/gemm.py,
XLA's dot) wherever the float32 sums are exact: the inputs here are small integers times powers of two that
change from 32-block to 32-block (exactly representable in E4M3 with their block scale; every partial sum
exact). Covered: mx_dot_general's forward, dgrad and wgrad for three operand layouts, bias and output dtypes;
mx_dot_general_quantized (row and column orientations) and the hand-off to the next GEMM; rms_norm_quantize
and quantize with blocked scales; vmap; sharded rows and sharded K on 8 CPU devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp8 as mx
from jax_mxfp8.formats import quantize as ref_quantize
from jax_mxfp8.formats import to_blocked_scales
from jax_mxfp8.ops.mx_dot_quantized import mx_dot_general_handoff, mx_dot_general_quantized
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library
from tests.parallel.sharding_testutil import mesh

CC = (10, 0)


def _exact(key: int, shape, axis: int = -1, top: int = 4) -> jax.Array:
    """Small integers (|x| <= top) times 2^e, e in {-1, 0, 1} varying per 32-block along `axis` (and per row)."""
    rng = np.random.default_rng(key)
    x = rng.integers(-top, top + 1, size=shape).astype(np.float32)
    idx = np.indices(shape)
    e = (idx[axis] // 32 + idx[0] * 3 + (idx[-2] if len(shape) > 1 else 0)) % 3 - 1
    return jnp.asarray(x * np.exp2(e), jnp.float32)


def _equal(a, b, name=""):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=name)


def _vjp(dot, *operands, ct):
    """(y, cotangents of the operands) of dot at `operands` for the output cotangent ct, in one jit (one XLA
    compile of the emulation)."""

    def f(*args):
        y, vjp = jax.vjp(dot, *args)
        return (y, *vjp(ct))

    return jax.jit(f)(*operands)


CASES = {
    "k-first rhs (x @ W)": ((2, 64, 128), (128, 96), (((2,), (0,)), ((), ()))),
    "k-last rhs (x @ W^T)": ((128, 64), (96, 64), (((1,), (1,)), ((), ()))),
    "batched": ((2, 64, 128), (2, 128, 64), (((2,), (1,)), ((0,), (0,)))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_mx_dot_general_forward_dgrad_wgrad_equal_the_reference(case, out_dtype):
    xs, ws, dn = CASES[case]
    x, w = _exact(1, xs, axis=dn[0][0][0]), _exact(2, ws, axis=dn[0][1][0])
    out_shape = jax.eval_shape(lambda a, b: jax.lax.dot_general(a, b, dn), x, w).shape
    ct = _exact(3, out_shape).astype(out_dtype)

    def dot(implementation):
        return lambda a, b: mx.mx_dot_general(a, b, dn, preferred_element_type=out_dtype, implementation=implementation)

    want = _vjp(dot("xla"), x, w, ct=ct)
    with library.forced_gpu(CC), impl.record() as decisions:
        got = _vjp(dot(None), x, w, ct=ct)
    assert [d.path for d in decisions if d.op == "mx_dot_general"] == ["emulated"]
    for name, g, r in zip(("y", "dx", "dw"), got, want):
        _equal(g, r, name)


def test_bias_and_a_vmapped_call():
    x, w, b = _exact(4, (4, 64, 128)), _exact(5, (128, 64), axis=0), _exact(6, (1, 64))[0]
    dn = (((1,), (0,)), ((), ()))
    ref = jax.jit(jax.vmap(lambda a: mx.mx_dot_general(a, w, dn, bias=b, implementation="xla")))(x)
    with library.forced_gpu(CC):
        got = jax.jit(jax.vmap(lambda a: mx.mx_dot_general(a, w, dn, bias=b)))(x)
    _equal(got, ref)


def test_quantized_output_and_the_handoff_equal_the_reference():
    """mx_dot_general_quantized's y, y_q (blocked MXArray), y_w (the blocked wgrad operand) and the next GEMM's
    forward and backward through mx_dot_general_handoff. The first GEMM's float32 results are exact in
    bfloat16 (+-1 elements: at most 8 significant bits), so the epilogue's operands (from float32) and the
    reference's (from the bfloat16 output) agree."""
    x, w1 = _exact(7, (2, 128, 64), top=1), _exact(8, (64, 128), axis=0, top=1)
    w2, ct = _exact(9, (128, 64), axis=0), _exact(10, (2, 128, 64))
    dn = (((2,), (0,)), ((), ()))

    def mlp(implementation):
        def f(x, w1, w2):
            kw = dict(preferred_element_type=jnp.bfloat16, implementation=implementation, orientations=("row", "col"))
            h, h_q, h_w = mx_dot_general_quantized(x, w1, dn, **kw)
            out = mx_dot_general_handoff(h, w2, dn, lhs_quantized=h_q, lhs_wgrad=h_w, implementation=implementation)
            return out, (h, h_q, h_w)

        return f

    out_ref, (h_ref, hq_ref, _) = jax.jit(mlp("xla"))(x, w1, w2)
    grads_ref = _vjp(lambda *a: mlp("xla")(*a)[0], x, w1, w2, ct=ct)[1:]
    with library.forced_gpu(CC):
        out, (h, h_q, h_w) = jax.jit(mlp(None))(x, w1, w2)
        grads = _vjp(lambda *a: mlp(None)(*a)[0], x, w1, w2, ct=ct)[1:]
    _equal(out, out_ref, "out")
    _equal(h, h_ref, "h")
    assert h_q.scale_layout == "blocked" and hq_ref.scale_layout == "natural"
    _equal(h_q.data, hq_ref.data, "h_q data")
    np.testing.assert_array_equal(np.asarray(h_q.natural().scale), np.asarray(hq_ref.scale))
    # the column orientation: quantize(h) along the tokens, transposed, blocked scales
    col = ref_quantize(h.astype(jnp.float32).reshape(1, 256, 128), axis=-2)
    _equal(h_w.data, jnp.swapaxes(col.data, 1, 2), "h_w data")
    np.testing.assert_array_equal(np.asarray(h_w.scale), np.asarray(to_blocked_scales(jnp.swapaxes(col.scale, 1, 2))))
    for name, g, r in zip(("dx", "dw1", "dw2"), grads, grads_ref):
        _equal(g, r, name)


def test_rms_norm_quantize_hands_blocked_scales_to_the_gemm():
    x, weight = _exact(11, (2, 128, 64)), jnp.exp2(jnp.arange(64) % 3 - 1.0)
    y_ref, q_ref = jax.jit(lambda a, w: mx.rms_norm_quantize(a, w, implementation="xla"))(x, weight)
    assert q_ref.scale_layout == "natural"
    with library.forced_gpu(CC):
        y, q = jax.jit(mx.rms_norm_quantize)(x, weight)
        y_n, q_n = jax.jit(lambda a, w: mx.rms_norm_quantize(a, w, scale_layout="natural"))(x, weight)
    assert q.scale_layout == "blocked" and q.scale.shape == (2, 1, 1, 512) and q_n.scale_layout == "natural"
    _equal(y, y_ref)
    _equal(q.data, q_ref.data)
    np.testing.assert_array_equal(np.asarray(q.natural().scale), np.asarray(q_ref.scale))
    np.testing.assert_array_equal(np.asarray(q_n.scale), np.asarray(q_ref.scale))
    np.testing.assert_array_equal(np.asarray(mx.dequantize(q)), np.asarray(mx.dequantize(q_ref)))


def test_quantize_with_blocked_scales():
    x = _exact(12, (3, 96, 160))
    want = ref_quantize(x, scale_layout="blocked")
    assert want.scale.shape == (3, 1, 2, 512)
    with library.forced_gpu(CC), impl.record() as decisions:
        got = jax.jit(lambda a: mx.quantize(a, scale_layout="blocked"))(x)
    assert [d.path for d in decisions] == ["emulated"]
    assert got.scale_layout == "blocked"
    _equal(got.data, want.data)
    np.testing.assert_array_equal(np.asarray(got.scale), np.asarray(want.scale))
    with pytest.raises(ValueError, match="scale_layout='blocked' holds row blocks along the last axis"):
        mx.quantize(x, axis=-2, scale_layout="blocked")


def test_sharded_rows_and_sharded_k_equal_one_device():
    """Rows over 8 devices (whole 128-row tiles each): the same bits; K over 8 devices (whole 128-K tiles):
    float32 partials summed by a psum (exact here, so the same bits too)."""
    m = mesh((8,), ("d",))
    x, w = _exact(13, (1024, 1024)), _exact(14, (1024, 256), axis=0)
    dn = (((1,), (0,)), ((), ()))
    ct = _exact(15, (1024, 256))
    grad = lambda a, b: _vjp(lambda a, b: mx.mx_dot_general(a, b, dn), a, b, ct=ct)  # noqa: E731
    with library.forced_gpu(CC):
        one = grad(x, w)
        rows = grad(jax.device_put(x, NamedSharding(m, P("d", None))), w)
        ks = grad(jax.device_put(x, NamedSharding(m, P(None, "d"))), jax.device_put(w, NamedSharding(m, P("d", None))))
    for name, a, b, c in zip(("y", "dx", "dw"), one, rows, ks):
        _equal(a, b, f"rows {name}")
        _equal(a, c, f"K {name}")
