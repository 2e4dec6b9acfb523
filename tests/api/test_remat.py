"""Rematerialization: every jax.checkpoint policy gives the loss and gradients of no remat.

The bug: jax.checkpoint inserts reduce_precision(x, finfo(x.dtype)) on every floating residual it saves,
which on float8_e4m3fn turns the finite top binade (256..448) into NaN; MX ops whose custom_vjp kept an
FP8 array in its residuals (mx_dot_general's pre-quantized operand, attention's MXArray operands) gave NaN
losses under everything_saveable / save_anything_except_these_names. Now FP8 residuals travel as uint8 bits
(ops/cotangents.py) or are not kept at all.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_mxfp8 as mx
from jax_mxfp8.flax import TransformerBlock
from tests.seeding_testutil import test_rng

CP = jax.checkpoint_policies
POLICIES = {
    "default": None,
    "everything_saveable": CP.everything_saveable,
    "nothing_saveable": CP.nothing_saveable,
    "dots_saveable": CP.dots_saveable,
    "dots_with_no_batch_dims_saveable": CP.dots_with_no_batch_dims_saveable,
    "save_anything_except_these_names": CP.save_anything_except_these_names("unused_name"),
    "save_only_these_names": CP.save_only_these_names("unused_name"),
    "save_from_both_policies": CP.save_from_both_policies(CP.dots_saveable, CP.everything_saveable),
}


def _remat(f, policy_name):
    if policy_name is None:
        return f
    return jax.checkpoint(f, policy=POLICIES[policy_name])


@functools.cache
def _block():
    """A small pre-norm TransformerBlock (MXFP8 GEMMs, fused RMSNorm+quantize, MXFP8 attention), its
    parameters and an input."""
    block = TransformerBlock(64, 2, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(block)
    x = jnp.asarray(np.random.default_rng(16_8).standard_normal((2, 64, 64)), jnp.float32)
    return graphdef, params, x


@functools.cache
def _block_value_and_grad(policy_name):
    graphdef, _, _ = _block()

    def loss(params, x):
        y = nnx.merge(graphdef, params)(x, is_causal=True)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    return jax.jit(jax.value_and_grad(_remat(loss, policy_name), argnums=(0, 1)))


def _assert_same(a, b, policy):
    (la, ga), (lb, gb) = a, b
    assert np.isfinite(float(lb)), f"{policy}: loss {float(lb)}"
    np.testing.assert_allclose(float(lb), float(la), rtol=1e-6, err_msg=policy)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert np.isfinite(y).all(), f"{policy}: non-finite gradient"
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6 * np.abs(x).max(), err_msg=policy)


# the two policies that gave NaN, plain remat and saving nothing run always; the rest are marked slow (one
# block compile each)
FAST = ("default", "everything_saveable", "save_anything_except_these_names", "nothing_saveable")


@pytest.mark.parametrize("policy", [p if p in FAST else pytest.param(p, marks=pytest.mark.slow) for p in POLICIES])
def test_flax_block_every_policy_matches_no_remat(policy):
    _, params, x = _block()
    want = _block_value_and_grad(None)(params, x)
    _assert_same(want, _block_value_and_grad(policy)(params, x), policy)


def test_mx_array_operands_under_remat():
    """Pre-quantized operands made inside the checkpointed function: mx_dot_general's lhs_quantized and
    MXArray attention operands (E4M3 elements of 256..448 are in most blocks)."""
    rng = test_rng()
    x = jnp.asarray(rng.standard_normal((2, 64, 64)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)
    q = jnp.asarray(rng.standard_normal((2, 64, 2, 64)), jnp.float32)
    dn = (((2,), (0,)), ((), ()))

    def f(x, w, q):
        h, h_q = mx.rms_norm_quantize(x, w[0])
        y = mx.mx_dot_general(h, w, dn, lhs_quantized=h_q)
        qm, km = (mx.quantize(a, axis=(-3, -1), block="square") for a in (q, 0.5 * q))
        o = mx.dot_product_attention(qm, km, q, is_causal=True)
        return jnp.mean(y**2) + jnp.mean(o.astype(jnp.float32) ** 2)

    want = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(x, w, q)
    got = jax.jit(jax.value_and_grad(_remat(f, "everything_saveable"), argnums=(0, 1, 2)))(x, w, q)
    _assert_same(want, got, "everything_saveable")
