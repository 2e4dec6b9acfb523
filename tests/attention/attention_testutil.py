"""Shared helpers of the attention tests: input generators, jitted library calls and bit-level checks.

Nothing here computes an expected value (attention_oracle.py holds the float64 models).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8 as mx
from tests.quantize.mx_testutil import data_bytes, scale_bytes
from tests.seeding_testutil import test_rng


def fresh_rng() -> np.random.Generator:
    """A new generator per call: every check draws its own inputs, which depend only on the running test
    (its node id and how many generators it drew before; tests/seeding_testutil.py), so a failure reruns alone."""
    return test_rng()


def normal_inputs(rng, b, t, s, n, n_kv, h, dtype=np.float32):
    """q (B, T, N, H), k and v (B, S, K, H) and an output cotangent do (B, T, N, H), all N(0, 1)."""
    q = rng.standard_normal((b, t, n, h)).astype(dtype)
    k = rng.standard_normal((b, s, n_kv, h)).astype(dtype)
    v = rng.standard_normal((b, s, n_kv, h)).astype(dtype)
    do = rng.standard_normal((b, t, n, h)).astype(dtype)
    return q, k, v, do


@functools.cache
def _fwd_bwd(config, is_causal, with_mask, with_lengths, implementation):
    def run(q, k, v, do, mask, q_len, kv_len):
        def f(q, k, v):
            return mx.dot_product_attention(
                q,
                k,
                v,
                mask=mask if with_mask else None,
                is_causal=is_causal,
                query_seq_lengths=q_len if with_lengths else None,
                key_value_seq_lengths=kv_len if with_lengths else None,
                config=config,
                return_residual="lse",
                implementation=implementation,
            )

        (o, lse), vjp = jax.vjp(f, q, k, v)
        dq, dk, dv = vjp((do.astype(o.dtype), jnp.zeros_like(lse)))
        return o, lse, dq, dk, dv

    return jax.jit(run)


def lib_fwd_bwd(q, k, v, do, *, config=None, is_causal=False, mask=None, q_len=None, kv_len=None, implementation=None):
    """Library output, LSE and (dq, dk, dv) for the loss sum(o * do), as NumPy float64 arrays.

    implementation=None lets the library choose: on an sm_90 GPU with the kernel library that is the Hopper
    kernel for bfloat16 and float32 inputs alike (O then carries bfloat16 precision); "xla" pins the reference.
    """
    config = config or mx.AttentionConfig()
    f = _fwd_bwd(config, is_causal, mask is not None, q_len is not None, implementation)
    dummy = jnp.zeros((q.shape[0],), jnp.int32)
    outs = f(
        q,
        k,
        v,
        do,
        mask if mask is not None else jnp.zeros((), bool),
        q_len if q_len is not None else dummy,
        kv_len if kv_len is not None else dummy,
    )
    return tuple(np.asarray(x, np.float64) for x in outs)


def assert_finite(*arrays):
    for a in arrays:
        assert np.all(np.isfinite(np.asarray(a, np.float64))), "non-finite values"


def assert_bits_equal(a, b):
    """Bit-for-bit equality (NaN never passes: the arrays must be finite, then exactly equal)."""
    a, b = np.asarray(a), np.asarray(b)
    assert_finite(a, b)
    np.testing.assert_array_equal(a, b)


def _same_mx(a: mx.MXArray, b: mx.MXArray) -> None:
    assert a.shape == b.shape and a.axes == b.axes and a.block == b.block
    np.testing.assert_array_equal(data_bytes(a), data_bytes(b))
    np.testing.assert_array_equal(scale_bytes(a), scale_bytes(b))


def check_mx_gradient(grad_mx, grad, tokens: int) -> None:
    """grad_mx: an MXGradient of dK or dV; grad: the ordinary path's (..., K, H) gradient in the input dtype.
    Its row / col MXArrays must equal quantize(grad) along features / tokens (the XLA reference) bit for bit."""
    g = jnp.asarray(grad).reshape(tokens, -1)
    assert grad_mx.shape == g.shape
    _same_mx(grad_mx.row, mx.quantize(g, axis=-1, implementation="xla"))
    _same_mx(grad_mx.col, mx.quantize(g, axis=-2, implementation="xla"))
