"""FSDP backward gathers MXFP8, not float32, on 8 CPU devices.

The forward already all-gathered the weight as MXFP8 (quantized along the GEMM's contracting axis K); the
backward re-quantized the sharded float32 weight for the dgrad GEMM and so all-gathered it in float32.
fsdp_mx_dot gathers a second MXFP8 copy, quantized along the dgrad's contracting axis N, instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp8 as mx
from jax_mxfp8.flax import MXLinear, use_quantized_gather
from jax_mxfp8.parallel import fsdp_mx_dot
from tests.parallel.sharding_testutil import bytes_of, collectives, mesh, put

D_IN, D_OUT = 512, 256
DN = (((1,), (0,)), ((), ()))


def _xw():
    x = jax.random.normal(jax.random.key(111), (64, D_IN), jnp.float32)
    w = jax.random.normal(jax.random.key(112), (D_IN, D_OUT), jnp.float32)
    return x, w


def _grad(dot):
    return jax.grad(lambda x, w: jnp.sum(jnp.sin(dot(x, w))), (0, 1))


def test_fsdp_mx_dot_gathers_only_mxfp8_bytes():
    m = mesh((8,), ("fsdp",))
    replicated = NamedSharding(m, P())
    x, w = _xw()
    xs, ws = put(x, m, "fsdp", None), put(w, m, "fsdp", None)
    grad = _grad(lambda x, w: fsdp_mx_dot(x, w, replicated))
    gathers = [s for op, s in collectives(grad, xs, ws) if op == "all-gather"]
    assert gathers and all(s.startswith(("u8", "u32")) for s in gathers), gathers
    one_copy = D_IN * D_OUT + D_IN * D_OUT // 32  # FP8 elements + E8M0 scales
    assert sum(bytes_of(s) for s in gathers) == 2 * one_copy  # forward (along K) + dgrad (along N)
    # without the quantized gathers XLA moves the float32 weight (4 bytes per element) and more
    plain = [s for op, s in collectives(_grad(lambda x, w: mx.mx_dot_general(x, w, DN)), xs, ws) if op == "all-gather"]
    assert any(s.startswith("f32") for s in plain) and sum(bytes_of(s) for s in plain) >= 4 * D_IN * D_OUT
    # same numerics as mx_dot_general on one device
    (dx, dw), (dx1, dw1) = jax.jit(grad)(xs, ws), jax.jit(_grad(lambda x, w: mx.mx_dot_general(x, w, DN)))(x, w)
    # the same MX operands; per-shard float32 sums differ from one device's in the last place
    np.testing.assert_allclose(dx, dx1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, dw1, rtol=1e-5, atol=1e-4)
    y = jax.jit(lambda x, w: fsdp_mx_dot(x, w, replicated))(xs, ws)
    np.testing.assert_allclose(y, jax.jit(lambda x, w: mx.mx_dot_general(x, w, DN))(x, w), rtol=1e-5, atol=1e-5)


def test_flax_layer_with_quantized_gather_has_no_float_all_gather():
    """The Flax path (use_quantized_gather) goes through fsdp_mx_dot: before, its backward gathered f32."""
    m = mesh((8,), ("fsdp",))
    layer = MXLinear(D_IN, D_OUT, use_bias=False, rngs=nnx.Rngs(0))
    assert use_quantized_gather(layer, lambda path, lyr: NamedSharding(m, P())) == 1
    graphdef, params = nnx.split(layer)
    params = jax.tree.map(lambda p: put(p, m, "fsdp", None), params)
    x = put(_xw()[0], m, "fsdp", None)

    def loss(params, x):
        return jnp.sum(jnp.sin(nnx.merge(graphdef, params)(x)))

    gathers = [s for op, s in collectives(jax.grad(loss, (0, 1)), params, x) if op == "all-gather"]  # dx: dgrad
    assert gathers and all(s.startswith(("u8", "u32")) for s in gathers), gathers
