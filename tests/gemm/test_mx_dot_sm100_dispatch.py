"""Blackwell dispatch on any machine: library.forced_gpu((10, 0)) / ((10, 3)) decides as on a B200 / GB300 with
the kernel library built and runs the kernels it picks emulated (their XLA emulation).

Checked from the FFI calls a training step makes (FfiOp.call, recorded while tracing) and the recorded
implementation decisions: every GEMM of a Flax TransformerBlock step (forward, dgrad, wgrad of the QKV, output,
MLP up and MLP down projections) is the sm100 MX GEMM; its operands come from the blocked-scale producer (never
the Hopper one); RMSNorm -> QKV and MLP up -> down hand their MXArrays over without a quantize pass; the FSDP
gather quantizes shards into the sm100 operand form and all-gathers only bytes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp8 as mx
from jax_mxfp8.flax import nnx_modules as M
from jax_mxfp8.parallel import fsdp_mx_dot
from jax_mxfp8.primitives import ffi_op, library
from jax_mxfp8.primitives import implementation as impl
from tests.parallel.sharding_testutil import bytes_of, collectives, mesh, put

BLACKWELL = [(10, 0), (10, 3)]
IDS = ["cc10.0", "cc10.3"]


def _trace(monkeypatch, cc, fn, *args):
    """(FFI calls as (target, first operand's shape), decisions) of tracing fn(*args) on a forced GPU. fn must
    be a function not traced before (jax.make_jaxpr caches traces per function)."""
    calls = []
    real = ffi_op.FfiOp.call

    def record(self, static, path, *a):
        assert path == "emulated", (self.target, path)
        calls.append((self.target, tuple(a[0].shape)))
        return real(self, static, path, *a)

    monkeypatch.setattr(ffi_op.FfiOp, "call", record)
    with library.forced_gpu(cc), impl.record() as decisions:
        jax.make_jaxpr(fn)(*args)
    return calls, decisions


def _block_step():
    block = M.TransformerBlock(64, 2, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(block)

    def step(state, x):
        def loss(state):
            return jnp.sum(nnx.merge(graphdef, state)(x).astype(jnp.float32) ** 2)

        return jax.grad(loss)(state)

    return step, state, jax.random.normal(jax.random.key(1), (2, 128, 64), jnp.bfloat16)


@pytest.mark.parametrize("cc", BLACKWELL, ids=IDS)
def test_every_gemm_of_a_transformer_block_training_step_is_sm100(monkeypatch, cc):
    step, state, x = _block_step()
    calls, decisions = _trace(monkeypatch, cc, step, state, x)
    targets = [t for t, _ in calls]
    gemms = [t for t in targets if "_mx_gemm" in t]
    # 4 projections (QKV, output, MLP up, MLP down) x (forward, dgrad, wgrad), all on the Blackwell GEMM
    assert len(gemms) == 12 and all(t.startswith("jax_mxfp8_mx_gemm_sm100") for t in gemms), gemms
    # the MLP up projection: the fused quantize epilogue with both orientations (its hand-off to MLP down)
    assert gemms.count("jax_mxfp8_mx_gemm_sm100_rowcol_bias") == 1
    producers = [t for t in targets if "operands" in t]
    assert producers and all(t.startswith("jax_mxfp8_blocked_operands") for t in producers), producers
    assert targets.count("jax_mxfp8_rms_norm_quantize_blocked") == 2  # both norms emit blocked scales
    gemm_ops = {"mx_dot_general", "mx_dot_general_quantized", "mx_dot_general_handoff", "rms_norm_quantize"}
    mine = [d for d in decisions if d.op in gemm_ops]
    assert {d.op for d in mine} == gemm_ops and all(d.path == "emulated" for d in mine), mine
    # RMSNorm -> QKV: the normalized activation (2 * 128 rows of 64) gets only its wgrad pass (one orientation,
    # the column one) before the QKV GEMM; the forward reads rms_norm_quantize's blocked MXArray
    first_gemm = targets.index("jax_mxfp8_mx_gemm_sm100")
    before = [c for c in calls[:first_gemm] if c[1] == (1, 256, 64)]
    assert before == [("jax_mxfp8_blocked_operands", (1, 256, 64))], calls[:first_gemm]
    # MLP up -> down: no producer pass reads the (256, 256) hidden activation before the down GEMM
    up = targets.index("jax_mxfp8_mx_gemm_sm100_rowcol_bias")
    down = targets.index("jax_mxfp8_mx_gemm_sm100_bias", up)
    assert [c for c in calls[up + 1 : down] if c[1] == (1, 256, 256)] == []


def test_hopper_and_consumer_blackwell_take_no_sm100_kernel(monkeypatch):
    """The same step on cc 9.0 takes the Hopper GEMM (aligned operands); on cc 12.0 (sm_120) no kernel at all."""
    step, state, x = _block_step()
    calls, _ = _trace(monkeypatch, (9, 0), step, state, x)
    gemms = [t for t, _ in calls if "_mx_gemm" in t]
    assert len(gemms) == 12 and not any("sm100" in t for t in gemms)
    assert not any("blocked" in t for t, _ in calls)
    monkeypatch.undo()
    step, state, x = _block_step()  # a new function: make_jaxpr caches traces per function
    calls, decisions = _trace(monkeypatch, (12, 0), step, state, x)
    assert calls == [] and decisions and all(d.path == "xla" for d in decisions)


@pytest.mark.parametrize("cc", BLACKWELL, ids=IDS)
def test_fsdp_gather_takes_the_sm100_path_and_moves_only_bytes(monkeypatch, cc):
    m = mesh((8,), ("fsdp",))
    replicated = NamedSharding(m, P())
    # every shard holds whole 128-row tiles (the blocked layout's unit): 1024 rows of x and of w over 8 devices
    x = jax.random.normal(jax.random.key(3), (1024, 1024), jnp.float32)
    w = jax.random.normal(jax.random.key(4), (1024, 256), jnp.float32)
    xs, ws = put(x, m, "fsdp", None), put(w, m, "fsdp", None)
    grad = jax.grad(lambda x, w: jnp.sum(jnp.sin(fsdp_mx_dot(x, w, replicated))), (0, 1))
    calls, decisions = _trace(monkeypatch, cc, grad, xs, ws)
    gemms = [t for t, _ in calls if "_mx_gemm" in t]
    assert gemms == ["jax_mxfp8_mx_gemm_sm100"] * 3, calls  # forward, dgrad, wgrad
    # the weight: one single-orientation producer pass per gather (along D_in for the forward, along D_out
    # for the dgrad); x and the gradient take both orientations in one pass each
    singles = [c for c in calls if c[0] == "jax_mxfp8_blocked_operands"]
    assert singles == [("jax_mxfp8_blocked_operands", (1, 1024, 256))] * 2, calls
    with library.forced_gpu(cc):
        gathers = [s for op, s in collectives(grad, xs, ws) if op == "all-gather"]
        (dx, dw) = jax.jit(grad)(xs, ws)
    assert gathers and all(s.startswith(("u8", "u32")) for s in gathers), gathers
    # one MXFP8 copy per gather: 1024 x 256 FP8 bytes + its blocked scales (2 x 8 tiles of 512 bytes)
    assert sum(bytes_of(s) for s in gathers) == 2 * (1024 * 256 + 2 * 8 * 512)
    # the numerics of mx_dot_general on one device (the same kernel path; shard sums in another order)
    with library.forced_gpu(cc):
        dx1, dw1 = jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.sin(mx.mx_dot_general(x, w, (((1,), (0,)), ((), ()))))),
                                    (0, 1)))(x, w)  # fmt: skip
    np.testing.assert_allclose(dx, dx1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, dw1, rtol=1e-5, atol=1e-4)

