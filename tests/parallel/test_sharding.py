"""Partitioning on 8 CPU devices: sharded runs equal unsharded ones, and the HLO holds only the
collectives the sharding calls for."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.parallel import gather_quantized
from tests.parallel.sharding_testutil import bytes_of, collectives, mesh, put

DN = (((1,), (0,)), ((), ()))
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "examples")


def _normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


@pytest.mark.parametrize(
    "block,spec", [("row", ("data", "model")), ("square", ("data", "model")), ("row", (None, "model"))]
)
def test_quantize_partitions_without_collectives(block, spec):
    m = mesh((2, 4), ("data", "model"))
    x = _normal(0, (256, 512))
    xs = put(x, m, *spec)
    f = jax.jit(lambda x: jax_mxfp8.quantize(x, block=block))
    assert collectives(lambda x: jax_mxfp8.quantize(x, block=block), xs) == []
    q, q1 = f(xs), f(x)
    np.testing.assert_array_equal(np.asarray(q.data).view(np.uint8), np.asarray(q1.data).view(np.uint8))
    np.testing.assert_array_equal(q.scale, q1.scale)


def _loss(x, w):
    return jnp.sum(jnp.sin(jax_mxfp8.mx_dot_general(x, w, DN)))


@pytest.mark.parametrize(
    "x_spec,w_spec,fwd_allowed,grad_allowed",
    [
        (("data", None), (None, None), set(), {"all-reduce"}),  # data parallel: only the weight-grad sum
        (("data", None), (None, "model"), set(), {"all-reduce"}),  # + column tensor parallel
        ((None, "model"), ("model", None), {"all-reduce"}, {"all-reduce", "all-gather"}),  # row parallel
    ],
)
def test_mx_dot_general_partitions_like_dot_general(x_spec, w_spec, fwd_allowed, grad_allowed):
    m = mesh((2, 4), ("data", "model"))
    x, w = _normal(1, (256, 512)), _normal(2, (512, 256))
    xs, ws = put(x, m, *x_spec), put(w, m, *w_spec)
    fwd_ops = {op for op, _ in collectives(lambda x, w: jax_mxfp8.mx_dot_general(x, w, DN), xs, ws)}
    assert fwd_ops <= fwd_allowed, fwd_ops
    grad = jax.grad(_loss, (0, 1))
    grad_ops = {op for op, _ in collectives(grad, xs, ws)}
    assert grad_ops <= grad_allowed, grad_ops
    out, out1 = (
        jax.jit(jax_mxfp8.mx_dot_general, static_argnums=2)(xs, ws, DN),
        jax.jit(jax_mxfp8.mx_dot_general, static_argnums=2)(x, w, DN),
    )
    np.testing.assert_allclose(out, out1, rtol=1e-5, atol=1e-4)
    for g, g1 in zip(jax.jit(grad)(xs, ws), jax.jit(grad)(x, w)):
        np.testing.assert_allclose(g, g1, rtol=1e-4, atol=1e-3)


def test_fsdp_quantized_gather_moves_bytes_not_floats():
    m = mesh((8,), ("fsdp",))
    x, w = put(_normal(3, (256, 512)), m, "fsdp", None), put(_normal(4, (512, 1024)), m, "fsdp", None)
    replicated = jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec())

    def fwd(x, w):
        return jax_mxfp8.mx_dot_general(x, w, DN, rhs_quantized=gather_quantized(w, replicated))

    gathers = [(op, s) for op, s in collectives(fwd, x, w) if op == "all-gather"]
    assert gathers and all(s.startswith("u8") for _, s in gathers), gathers
    fp8_bytes = sum(bytes_of(s) for _, s in gathers)
    assert fp8_bytes == 512 * 1024 + 512 * 1024 // 32  # FP8 data + E8M0 scales; FP32 would be 4x the data
    plain = [s for op, s in collectives(lambda x, w: jax_mxfp8.mx_dot_general(x, w, DN), x, w) if op == "all-gather"]
    assert sum(bytes_of(s) for s in plain) == 4 * 512 * 1024
    # the gathered MXArray is bit-identical to quantizing the whole weight on one device
    gathered = jax.jit(lambda w: gather_quantized(w, replicated))(w)
    whole = jax_mxfp8.quantize(np.asarray(w), axis=0)
    np.testing.assert_array_equal(np.asarray(gathered.data).view(np.uint8), np.asarray(whole.data).view(np.uint8))
    np.testing.assert_array_equal(gathered.scale, whole.scale)
    expect = jax.jit(lambda x, w: jax_mxfp8.mx_dot_general(x, w, DN))(x, w)
    np.testing.assert_allclose(jax.jit(fwd)(x, w), expect, rtol=1e-5, atol=1e-4)


def test_attention_partitions_over_batch_and_heads():
    m = mesh((2, 4), ("data", "model"))
    q, k, v = (_normal(5 + i, (2, 128, 8, 64)) for i in range(3))
    qs, ks, vs = (put(t, m, "data", None, "model", None) for t in (q, k, v))

    def loss(q, k, v):
        return jnp.sum(jnp.sin(jax_mxfp8.dot_product_attention(q, k, v, is_causal=True)))

    fwd_ops = {
        op
        for op, _ in collectives(lambda q, k, v: jax_mxfp8.dot_product_attention(q, k, v, is_causal=True), qs, ks, vs)
    }
    assert fwd_ops == set(), fwd_ops
    grad = jax.grad(loss, (0, 1, 2))
    assert {op for op, _ in collectives(grad, qs, ks, vs)} == set()
    for g, g1 in zip(jax.jit(grad)(qs, ks, vs), jax.jit(grad)(q, k, v)):
        np.testing.assert_allclose(g, g1, rtol=1e-5, atol=1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


TRAIN_ARGS = ("--steps", "3", "--batch", "8", "--seq-len", "32", "--d-model", "64", "--heads", "2")


@functools.cache
def _single_device_losses() -> tuple[float, ...]:
    """train_multihost's losses on a one-device mesh (TRAIN_ARGS): the reference of both multi-mesh tests
    (computed once: ~20 s of compiles on CI's CPU)."""
    sys.path.insert(0, EXAMPLES)
    import train_multihost

    return tuple(train_multihost.run(train_multihost.parse_args([*TRAIN_ARGS, "--mesh", "data=1"]))["losses"])


@pytest.mark.slow
def test_lm_train_step_losses_match_across_meshes():
    sys.path.insert(0, EXAMPLES)
    import train_multihost

    common = list(TRAIN_ARGS)
    single = _single_device_losses()
    for mesh_arg, fp8 in (
        ("data=8", []),
        ("fsdp=8", []),
        ("fsdp=8", ["--fp8-gather"]),
        ("data=2,fsdp=2,tp=2", ["--fp8-gather"]),
    ):
        losses = train_multihost.run(train_multihost.parse_args([*common, "--mesh", mesh_arg, *fp8]))["losses"]
        np.testing.assert_allclose(losses, single, rtol=2e-4, err_msg=f"{mesh_arg} {fp8}")


@pytest.mark.slow
def test_multihost_example_two_processes_of_four_devices(tmp_path):
    port = _free_port()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    common = [*TRAIN_ARGS, "--mesh", "data=2,fsdp=2,tp=2"]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.join(EXAMPLES, "train_multihost.py"),
                *common,
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--coordinator",
                f"localhost:{port}",
                "--out",
                str(tmp_path / f"p{i}.json"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    import json

    summary = json.loads((tmp_path / "p0.json").read_text())
    assert summary["processes"] == 2
    np.testing.assert_allclose(summary["losses"], _single_device_losses(), rtol=2e-4)


def test_shard_map_bodies_call_every_op():
    """Every public op runs per shard inside jax.shard_map and equals the same op on that shard alone."""
    m = mesh((8,), ("data",))
    x = _normal(10, (8 * 32, 64))  # 32 rows per device
    w = _normal(11, (64, 32))
    q = _normal(12, (8, 64, 2, 32))  # (B, T, N, H): one sequence per device
    cu = jnp.array([0, 20, 64], jnp.int32)  # two packed sequences in each device's 64 rows
    norm_w = jnp.ones((64,))

    def body(x, q):
        qx = jax_mxfp8.quantize(x, axis=-1)
        y, y_mx = jax_mxfp8.rms_norm_quantize(x, norm_w)
        gemm = jax_mxfp8.mx_dot_general(y, w, DN, lhs_quantized=y_mx)
        attn = jax_mxfp8.dot_product_attention(q, q, q, is_causal=True)
        packed = q.reshape(64, 2, 32)
        var = jax_mxfp8.varlen_attention(packed, packed, packed, cu, cu, max_seqlen_q=64, max_seqlen_k=64)
        return jax_mxfp8.dequantize(qx), gemm, attn, var.reshape(1, 64, 2, 32)

    spec = jax.sharding.PartitionSpec("data")
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # pragma: no cover (jax < 0.8)
        from jax.experimental.shard_map import shard_map
    f = jax.jit(shard_map(body, mesh=m, in_specs=(spec, spec), out_specs=(spec, spec, spec, spec)))
    outs = f(put(x, m, "data"), put(q, m, "data"))
    for i in (0, 5):  # compare two devices' shards with the op applied to that shard alone
        alone = jax.jit(body)(x[32 * i : 32 * (i + 1)], q[i : i + 1])
        for got, want in zip(outs, alone):
            n = want.shape[0]
            np.testing.assert_allclose(got[n * i : n * (i + 1)], want, rtol=1e-6, atol=1e-6)


def test_rms_norm_quantize_and_varlen_partition_without_collectives():
    m = mesh((2, 4), ("data", "model"))
    x = put(_normal(13, (256, 128)), m, "data", None)
    w = jnp.ones((128,))
    assert collectives(lambda x: jax_mxfp8.rms_norm_quantize(x, w), x) == []
    grad = jax.grad(lambda x: jnp.sum(jnp.sin(jax_mxfp8.rms_norm_quantize(x, w)[0])))
    assert {op for op, _ in collectives(grad, x)} == set()
    # packed jagged sequences split over heads (sequences cannot be split at arbitrary packed rows)
    q = put(_normal(14, (100, 8, 32)), m, None, "model", None)
    cu = jnp.array([0, 30, 100], jnp.int32)

    def varlen(q):
        return jax_mxfp8.varlen_attention(q, q, q, cu, cu, max_seqlen_q=70, max_seqlen_k=70, is_causal=True)

    assert collectives(varlen, q) == []
    np.testing.assert_allclose(jax.jit(varlen)(q), jax.jit(varlen)(np.asarray(q)), rtol=1e-6, atol=1e-6)


def test_mx_dot_general_fsdp_collectives_match_lax_dot_general():
    """Under FSDP (batch and weight rows split over one axis) the MX GEMM and its gradients need the
    same collectives as lax.dot_general: the weight and the output gradient are gathered, dW all-reduced."""
    m = mesh((8,), ("fsdp",))
    x, w = put(_normal(15, (256, 512)), m, "fsdp", None), put(_normal(16, (512, 1024)), m, "fsdp", None)

    def ops(dot):
        grad = jax.grad(lambda x, w: jnp.sum(jnp.sin(dot(x, w))), (0, 1))
        return sorted((op, bytes_of(s)) for op, s in collectives(grad, x, w))

    assert ops(lambda x, w: jax_mxfp8.mx_dot_general(x, w, DN)) == ops(lambda x, w: jax.lax.dot_general(x, w, DN))


def test_ffi_primitives_partition_like_the_reference():
    """The kernels' custom_partitioning (Shardy rule + GSPMD callbacks), run here with the XLA body in place
    of the FFI call: outputs keep the input's sharding, no collectives, bits equal the reference."""
    from jax_mxfp8.primitives import quantize as pq
    from jax_mxfp8.primitives import rms_norm_quantize as prn

    m = mesh((2, 4), ("data", "model"))
    x = _normal(17, (256, 512))
    xs = put(x, m, "data", "model")
    for name, f in (
        ("row", lambda x: pq.quantize(x, implementation="emulated")),
        ("square", lambda x: pq.quantize(x, block="square", implementation="emulated")),
        ("rowcol", lambda x: pq.quantize_rowcol(x, implementation="emulated")),
    ):
        assert collectives(f, xs) == [], name
        got, want = jax.jit(f)(xs), jax.jit(f)(x)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert g.sharding.is_equivalent_to(xs.sharding, g.ndim), name
            np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
    rows = put(x, m, "data", None)
    w = jnp.ones((512,))

    def norm(x):
        return prn.rms_norm_quantize_fwd(x, w, implementation="emulated")

    assert collectives(norm, rows) == []
    for g, want in zip(jax.tree.leaves(jax.jit(norm)(rows)), jax.tree.leaves(jax.jit(norm)(x))):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(want).view(np.uint8))
