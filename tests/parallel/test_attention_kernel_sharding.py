"""Partitioning and batching of the Hopper attention kernel call, on CPU host devices.

primitives.attention_fwd.attention_fwd wraps the FFI call in custom_partitioning (batch and KV-head
groups shard, sequences never) and custom_vmap (the mapped axis joins the batch). path="emulated"
runs the kernel's XLA emulation through the same wrappers, so these checks run without a GPU: sharded
and vmapped calls must equal the plain call, and the partitioned program must not gather the operands.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp8 as mx
from jax_mxfp8.primitives import attention_emulation as emulation
from jax_mxfp8.primitives import attention_fwd as afwd
from jax_mxfp8.primitives import attention_operands as operands
from tests.attention.attention_testutil import fresh_rng


def _ops(rng, b=4, n=4, n_kv=2, t=256, s=256, h=64, kv_len=None):
    def mxa(shape):
        return mx.quantize(jnp.asarray(rng.standard_normal(shape), jnp.bfloat16), axis=(-2, -1), block="square")

    q, k, v = mxa((b, n, t, h)), mxa((b, n_kv, s, h)), mxa((b, n_kv, s, h))
    return operands.prepare(q, k, v, scale=h**-0.5, q_len=None, kv_len=kv_len)


def _call(ops, causal, t):
    return afwd.attention_fwd(ops, causal=causal, t=t, path="emulated")


def _mesh(shape):
    devs = np.asarray(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    return jax.sharding.Mesh(devs, ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def _place(ops, mesh, batch, heads):
    four, three = P(batch, heads, None, None), P(batch, heads, None)
    specs = operands.AlignedOperands(four, four, four, three, three, three, three, P(None, batch))
    return jax.tree.map(lambda x, sp: jax.device_put(x, NamedSharding(mesh, sp)), ops, specs)


# batch and heads sharded, causal and not; batch only; heads only (causal is a static parameter of the call,
# not of its partitioning rule: one value each for the single-axis meshes)
@pytest.mark.parametrize(
    "causal,mesh_shape,batch,heads",
    [(False, (2, 2), "data", "model"), (True, (2, 2), "data", "model"), (False, (4, 2), "data", None),
     (True, (1, 2), None, "model")],
)  # fmt: skip
def test_sharded_call_equals_unsharded(causal, mesh_shape, batch, heads):
    if len(jax.devices()) < int(np.prod(mesh_shape)):
        pytest.skip("needs the 8 CPU host devices of tests/conftest.py")
    rng = fresh_rng()
    ops = _ops(rng, kv_len=jnp.asarray([256, 100, 37, 200], jnp.int32))
    f = jax.jit(functools.partial(_call, causal=causal, t=256))
    want = f(ops)
    mesh = _mesh(mesh_shape)
    placed = _place(ops, mesh, batch, heads)
    got = f(placed)
    _assert_same(got, want)
    assert "all-gather" not in f.lower(placed).compile().as_text()
    assert got[0].sharding.spec[0] == (batch if batch is not None else None)


@pytest.mark.parametrize("n,n_kv", [(2, 2), (4, 1), (4, 2)])
def test_head_layouts_partition(n, n_kv):
    """MHA, MQA and GQA each need their own Shardy rule (no size-1 factor inside a compound one): one case each."""
    if len(jax.devices()) < 2:
        pytest.skip("needs the 8 CPU host devices of tests/conftest.py")
    rng = fresh_rng()
    ops = _ops(rng, b=2, n=n, n_kv=n_kv)
    f = jax.jit(functools.partial(_call, causal=False, t=256))
    want = f(ops)
    _assert_same(f(_place(ops, _mesh((2, 1)), "data", None)), want)
    if n_kv % 2 == 0:
        _assert_same(f(_place(ops, _mesh((1, 2)), None, "model")), want)


def test_block_p_scale_sharded_and_vmapped():
    """p_scale="block" is a static parameter of the same op: it partitions and batches like "const", and the
    partitioned call computes emulate_fwd's block mode (not const)."""
    if len(jax.devices()) < 4:
        pytest.skip("needs the 8 CPU host devices of tests/conftest.py")
    rng = fresh_rng()
    ops = _ops(rng, kv_len=jnp.asarray([256, 100, 37, 200], jnp.int32))
    f = jax.jit(lambda ops: afwd.attention_fwd(ops, causal=True, t=256, p_scale="block", path="emulated"))
    want = f(ops)
    placed = _place(ops, _mesh((2, 2)), "data", "model")
    _assert_same(f(placed), want)
    assert "all-gather" not in f.lower(placed).compile().as_text()
    o_e, lse_e = jax.jit(lambda ops: emulation.emulate_fwd(ops, causal=True, t=256, p_scale="block"))(ops)
    _assert_same(want, (o_e.transpose(0, 2, 1, 3).astype(jnp.bfloat16), lse_e))
    stacked = jax.tree.map(lambda x: jnp.stack([x, x]), ops)
    got = jax.jit(jax.vmap(lambda ops: afwd.attention_fwd(ops, causal=True, t=256, p_scale="block",
                                                          path="emulated")))(stacked)  # fmt: skip
    _assert_same([x[1] for x in got], want)


def test_vmap_joins_the_batch():
    rng = fresh_rng()
    a, b = _ops(rng, b=2), _ops(rng, b=2)
    stacked = jax.tree.map(lambda x, y: jnp.stack([x, y]), a, b)
    got = jax.jit(jax.vmap(functools.partial(_call, causal=True, t=256)))(stacked)
    call = jax.jit(functools.partial(_call, causal=True, t=256))
    for i, one in enumerate((a, b)):
        want = call(one)
        _assert_same([x[i] for x in got], want)


def _assert_same(got, want):
    """XLA:CPU may order the emulation's float32 sums differently for another per-device or merged batch
    (1-ulp LSE differences, rarely a flipped bf16 rounding of O, were seen); a wrong shard or batch
    mapping changes whole rows, far beyond these tolerances."""
    o, lse = (np.asarray(x, np.float32) for x in got)
    o_want, lse_want = (np.asarray(x, np.float32) for x in want)
    np.testing.assert_allclose(o, o_want, rtol=2.0**-7, atol=0)  # one bf16 ulp
    assert np.mean(o != o_want) < 1e-3
    np.testing.assert_allclose(lse, lse_want, rtol=2e-6, atol=2e-6)


# ------------------------------------------------------------------------------ the producer's realign op
def _seq_major_operands(rng, b=4, n=4, n_kv=2, t=96, s=160, h=64):
    def mxa(shape):
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, size=(*shape[:-1], 1)))
        return mx.quantize(jnp.asarray(x, jnp.bfloat16), axis=(-3, -1), block="square")

    return mxa((b, t, n, h)), mxa((b, s, n_kv, h)), mxa((b, s, n_kv, h))


def _prepare_seq(q, k, v):
    return operands.prepare_sequence_major(q, k, v, scale=0.125, q_len=None, kv_len=None, path="emulated")


def _assert_ops_equal(got, want):
    for field in ("q", "k", "vt", "qs", "ks", "vs", "vi", "lens"):
        a, b = getattr(got, field), getattr(want, field)
        if a.dtype == jnp.float8_e4m3fn:
            a, b = a.view(jnp.uint8), b.view(jnp.uint8)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=field)


@pytest.mark.parametrize("mesh_shape,batch,heads", [((2, 2), "data", "model"), ((1, 2), None, "model")])
def test_realign_sharded_equals_unsharded(mesh_shape, batch, heads):
    """The realign call shards over batch and heads with no gathers; results are bit-identical."""
    if len(jax.devices()) < int(np.prod(mesh_shape)):
        pytest.skip("needs the 8 CPU host devices of tests/conftest.py")
    operands = _seq_major_operands(fresh_rng())
    f = jax.jit(_prepare_seq)
    want = f(*operands)
    mesh = _mesh(mesh_shape)
    spec = NamedSharding(mesh, P(batch, None, heads, None))
    placed = jax.tree.map(lambda x: jax.device_put(x, spec), operands)
    _assert_ops_equal(f(*placed), want)
    assert "all-gather" not in f.lower(*placed).compile().as_text()


def test_realign_vmap_joins_the_batch():
    rng = fresh_rng()
    a, b = _seq_major_operands(rng, b=2), _seq_major_operands(rng, b=2)
    stacked = jax.tree.map(lambda x, y: jnp.stack([x, y]), a, b)
    got = jax.jit(jax.vmap(_prepare_seq))(*stacked)
    for i, one in enumerate((a, b)):
        _assert_ops_equal(jax.tree.map(lambda x, i=i: x[i], got), _prepare_seq(*one))
