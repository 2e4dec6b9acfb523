"""jax.grad of the attention ops on compute capability 10.0 / 10.3 (library.forced_gpu: the kernels emulated) takes
the Blackwell backward (ops/attention_bwd_sm100.py -> primitives/attention_bwd_sm100.py):

* the traced gradient calls the pre-pass and the backward targets; Hopper (cc 9.0) and consumer Blackwell
  (cc 12.0) never do, nor implementation="xla", bias, or a head_dim without a variant;
* the gradients equal the emulation (primitives/attention_bwd_sm100_emulation.py, run here step by step on the
  forward's O and LSE) bit for bit: p_scale const / block, causal, GQA, padded batches, float32 / float16 dQ,
  deterministic; and are within 0.5 dB of the XLA reference's SQNR against float64 unquantized gradients;
* values past the sequence lengths (even NaN) leave the valid rows' gradients unchanged bit for bit, and the
  padding rows' gradients are written (zero, finite);
* deterministic=True is bit-identical across runs.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.formats.quantize import dequantize, quantize
from jax_mxfp8.kernels import registry
from jax_mxfp8.ops.attention_grads import dot_product_attention_vjp
from jax_mxfp8.primitives import attention_bwd_sm100 as bwd
from jax_mxfp8.primitives import attention_sm100_operands as ops
from jax_mxfp8.primitives import ffi_op, library
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives.attention_bwd_sm100_emulation import bwd_prepass, emulate_bwd_sm100
from tests.attention.attention_oracle import exact_attention, sqnr_db
from tests.attention.attention_testutil import fresh_rng

BLACKWELL = [(10, 0), (10, 3)]
IDS = ["cc10.0", "cc10.3"]
B, T, S, N, K = 2, 128, 256, 4, 2


def _problem(rng, h=64, lens=True):
    q = jnp.asarray(rng.standard_normal((B, T, N, h)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, S, K, h)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, S, K, h)), jnp.float32)
    do = jnp.asarray(rng.standard_normal((B, T, N, h)), jnp.float32)
    ln = (jnp.array([100, 128], jnp.int32), jnp.array([256, 170], jnp.int32)) if lens else (None, None)
    return q, k, v, do, ln


def _grads(q, k, v, do, ln, *, causal, config=None, implementation=None):
    def f(q, k, v):
        return mx.dot_product_attention(
            q, k, v, is_causal=causal, query_seq_lengths=ln[0], key_value_seq_lengths=ln[1], config=config,
            implementation=implementation,
        )  # fmt: skip

    out, vjp = jax.vjp(f, q, k, v)
    return tuple(np.asarray(g) for g in vjp(do))


def _expected(q, k, v, do, ln, *, causal, config, cc=(10, 0)):
    """The emulation step by step: the square operands with both orientations, the forward's O and LSE (the
    forward of the same call: the sm100 forward, emulated), the pre-pass, the backward emulation with the
    variant's dQ path."""
    with library.forced_gpu(cc):
        out, lse = mx.dot_product_attention(
            q, k, v, is_causal=causal, query_seq_lengths=ln[0], key_value_seq_lengths=ln[1], config=config,
            return_residual="lse",
        )  # fmt: skip
    lens = None if ln[0] is None else jnp.stack(ln)

    def zero(x, n):
        return x if n is None else jnp.where((jnp.arange(x.shape[1])[None, :] < n[:, None])[:, :, None, None], x, 0)

    q_op, k_op, v_op = (
        ops.sm100_operand(ops.quantize_square(zero(x, n))) for x, n in ((q, ln[0]), (k, ln[1]), (v, ln[1]))
    )
    do_op, delta = bwd_prepass(do, out, None, None if lens is None else lens[0])
    dq_accum = "fp32" if config.dq_accum == "fp32" else ("fp16" if config.deterministic else "fp16_reduce")
    dq, dk, dv = emulate_bwd_sm100(
        q_op, k_op, v_op, do_op, lse, delta, lens, causal=causal, scale=q.shape[-1] ** -0.5, p_scale=config.p_scale,
        dq_accum=dq_accum, dq_scale_log2=config.dq_fp16_scale_log2,
    )  # fmt: skip
    return tuple(np.asarray(g) for g in (dq, dk, dv))


def _trace_targets(monkeypatch, cc, fn, *args):
    calls = []
    real = ffi_op.FfiOp.call

    def record(self, static, path, *a):
        calls.append(self.target)
        return real(self, static, path, *a)

    monkeypatch.setattr(ffi_op.FfiOp, "call", record)
    jax.clear_caches()  # the op's inner jit would replay an earlier test's trace without calling FfiOp.call
    with library.forced_gpu(cc), impl.record() as decisions:
        jax.make_jaxpr(fn)(*args)
    return calls, decisions


@pytest.mark.parametrize("cc", BLACKWELL, ids=IDS)
def test_grad_calls_the_sm100_backward_targets(monkeypatch, cc):
    q, k, v, do, ln = _problem(fresh_rng())

    def grad(q, k, v):
        return jax.grad(lambda q, k, v: jnp.sum(mx.dot_product_attention(q, k, v, is_causal=True) * do), (0, 1, 2))(
            q, k, v
        )

    calls, decisions = _trace_targets(monkeypatch, cc, grad, q, k, v)
    assert calls.count(bwd.TARGET_PREPASS) == 1 and calls.count(bwd.TARGET) == 1, calls
    assert any(d.op == "dot_product_attention_bwd" and d.path == "emulated" for d in decisions)


@pytest.mark.parametrize(
    "cc, kw",
    [((9, 0), {}), ((12, 0), {}), ((10, 0), {"implementation": "xla"}), ((10, 0), {"bias": True})],
    ids=["hopper", "sm120", "xla", "bias"],
)
def test_other_devices_and_arguments_take_no_sm100_backward(monkeypatch, cc, kw):
    q, k, v, do, _ = _problem(fresh_rng())
    bias = jnp.zeros((B, N, T, S), jnp.float32) if kw.pop("bias", False) else None

    def grad(q, k, v):
        f = lambda q, k, v: jnp.sum(mx.dot_product_attention(q, k, v, bias, **kw) * do)  # noqa: E731
        return jax.grad(f, (0, 1, 2))(q, k, v)

    calls, _ = _trace_targets(monkeypatch, cc, grad, q, k, v)
    assert bwd.TARGET not in calls and bwd.TARGET_PREPASS not in calls, calls


CONFIGS = [
    pytest.param(True, AttentionConfig(), id="causal"),
    pytest.param(False, AttentionConfig(p_scale="block"), id="pblock"),
    pytest.param(True, AttentionConfig(dq_accum="fp16"), id="causal-fp16"),
    pytest.param(False, AttentionConfig(deterministic=True), id="det"),
    pytest.param(True, AttentionConfig(dq_accum="fp16", deterministic=True), id="causal-fp16-det"),
]


@pytest.mark.parametrize("causal, config", CONFIGS)
def test_gradients_equal_the_emulation(causal, config):
    q, k, v, do, ln = _problem(fresh_rng())
    with library.forced_gpu((10, 0)):
        got = _grads(q, k, v, do, ln, causal=causal, config=config)
    want = _expected(q, k, v, do, ln, causal=causal, config=config)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("h", [64, 128])
def test_sqnr_within_half_a_db_of_the_reference(h):
    q, k, v, do, ln = _problem(fresh_rng(), h=h)
    with library.forced_gpu((10, 3)):
        got = _grads(q, k, v, do, ln, causal=True)
    ref = _grads(q, k, v, do, ln, causal=True, implementation="xla")
    _, _, *exact = exact_attention(q, k, v, do, causal=True, q_len=np.asarray(ln[0]), kv_len=np.asarray(ln[1]))
    for name, g, r, x64 in zip(("dq", "dk", "dv"), got, ref, exact, strict=True):
        assert abs(sqnr_db(g, x64) - sqnr_db(r, x64)) <= 0.5, (name, sqnr_db(g, x64), sqnr_db(r, x64))


def test_padding_isolated_bit_for_bit_and_written():
    """NaN past the lengths (query rows, key rows, dO rows) changes no valid row's gradient; the padding rows'
    gradients are zero."""
    q, k, v, do, ln = _problem(fresh_rng())
    qpos = (jnp.arange(T)[None, :] >= ln[0][:, None])[:, :, None, None]
    kpos = (jnp.arange(S)[None, :] >= ln[1][:, None])[:, :, None, None]
    poisoned = (jnp.where(qpos, jnp.nan, q), jnp.where(kpos, jnp.nan, k), jnp.where(kpos, jnp.nan, v))
    with library.forced_gpu((10, 0)):
        clean = _grads(q, k, v, do, ln, causal=False)
        dirty = _grads(*poisoned, jnp.where(qpos, jnp.nan, do), ln, causal=False)
    for name, c, d, pad in zip(("dq", "dk", "dv"), clean, dirty, (qpos, kpos, kpos), strict=True):
        keep = ~np.broadcast_to(np.asarray(pad), c.shape)
        np.testing.assert_array_equal(d[keep], c[keep], err_msg=name)
        assert np.all(d[~keep] == 0) and np.all(np.isfinite(c)), name


def test_deterministic_is_bit_identical_across_runs():
    q, k, v, do, ln = _problem(fresh_rng())
    config = AttentionConfig(deterministic=True)
    with library.forced_gpu((10, 0)):
        first = _grads(q, k, v, do, ln, causal=True, config=config)
        second = _grads(q, k, v, do, ln, causal=True, config=config)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cc", BLACKWELL, ids=IDS)
def test_broadcast_query_gradient_is_the_sm100_broadcast_backward(monkeypatch, cc):
    """broadcast_query_attention: one backward call with q of batch 1 (dq summed over the batch in float32);
    its gradients equal the emulation on the broadcast problem (dq: the float32 sum of the rows' dq)."""
    rng = fresh_rng()
    q1 = jnp.asarray(rng.standard_normal((T, N, 64)), jnp.float32)
    _, k, v, do, ln = _problem(rng)

    def grads(q1, k, v):
        f = lambda q1, k, v: mx.broadcast_query_attention(q1, k, v, key_value_seq_lengths=ln[1])  # noqa: E731
        _, vjp = jax.vjp(f, q1, k, v)
        return vjp(do)

    calls, _ = _trace_targets(monkeypatch, cc, grads, q1, k, v)
    assert calls.count(bwd.TARGET) == 1 and calls.count(bwd.TARGET_PREPASS) == 1, calls
    with library.forced_gpu(cc):
        got = [np.asarray(g) for g in grads(q1, k, v)]
    qb = jnp.broadcast_to(q1[None], (B, T, N, 64))
    want = _expected(qb, k, v, do, (jnp.full((B,), T, jnp.int32), ln[1]), causal=False, config=AttentionConfig())
    np.testing.assert_array_equal(got[0], np.sum(want[0], axis=0))
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.parametrize("cc", BLACKWELL, ids=IDS)
def test_varlen_gradient_takes_the_sm100_backward_and_isolates_sequences(monkeypatch, cc):
    """varlen_attention (its padded-batch route on cc 10.x): the sm100 backward; a NaN in one sequence leaves
    the other sequences' gradients unchanged bit for bit."""
    rng = fresh_rng()
    cu_q, cu_k = jnp.array([0, 70, 200], jnp.int32), jnp.array([0, 150, 260], jnp.int32)
    q = jnp.asarray(rng.standard_normal((200, N, 64)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((260, K, 64)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((260, K, 64)), jnp.float32)
    do = jnp.asarray(rng.standard_normal((200, N, 64)), jnp.float32)

    def grads(q, k, v):
        f = lambda q, k, v: mx.varlen_attention(q, k, v, cu_q, cu_k, max_seqlen_q=130, max_seqlen_k=150)  # noqa: E731
        _, vjp = jax.vjp(f, q, k, v)
        return vjp(do)

    calls, _ = _trace_targets(monkeypatch, cc, grads, q, k, v)
    assert calls.count(bwd.TARGET) == 1, calls
    with library.forced_gpu(cc):
        clean = [np.asarray(g) for g in grads(q, k, v)]
        dirty = [np.asarray(g) for g in grads(q.at[10].set(jnp.nan), k.at[5].set(jnp.nan), v)]
    np.testing.assert_array_equal(dirty[0][70:], clean[0][70:])
    np.testing.assert_array_equal(dirty[1][150:], clean[1][150:])
    np.testing.assert_array_equal(dirty[2][150:], clean[2][150:])
    assert np.all(np.isfinite(clean[0])) and np.isnan(dirty[0][:70]).any()


@pytest.mark.parametrize("cc", BLACKWELL, ids=IDS)
def test_flax_block_training_step_takes_the_sm100_backward(monkeypatch, cc):
    """The Flax TransformerBlock step benchmarks/train_step.py times (head_dim 64 here): its attention backward
    is the sm100 one on cc 10.x."""
    from flax import nnx

    from jax_mxfp8.flax import nnx_modules as M

    graphdef, state = nnx.split(M.TransformerBlock(128, 2, rngs=nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(1), (2, 128, 128), jnp.bfloat16)

    def step(state, x):
        return jax.grad(lambda s: jnp.sum(nnx.merge(graphdef, s)(x, is_causal=True).astype(jnp.float32) ** 2))(state)

    calls, _ = _trace_targets(monkeypatch, cc, step, state, x)
    assert calls.count(bwd.TARGET) == 1 and calls.count(bwd.TARGET_PREPASS) == 1, calls


def test_mx_dkv_variant_returns_the_mx_gradients_of_bfloat16_grads():
    """The dkv "mx" variant (emulated) returns dK, dV as (row, col) MXArrays of the (B S, K H) matrix of
    bfloat16(dK) / bfloat16(dV): the float32 variant's gradients quantized along features and along tokens."""
    q, k, v, do, ln = _problem(fresh_rng())
    lens = jnp.stack(ln)
    qo, ko, vo = (ops.sm100_operand(ops.quantize_square(x)) for x in (q, k, v))
    lse = jnp.asarray(np.log(S) + fresh_rng().standard_normal((B, N, T)), jnp.float32)
    do_op, delta = bwd.bwd_prepass_sm100(do, do, jnp.zeros_like(lse), lens, path="emulated")
    kw = dict(scale=0.125, path="emulated")
    _, dk, dv = bwd.attention_bwd_sm100(
        qo, ko, vo, do_op, lse, delta, lens, variant=bwd.find_variant(head_dim=64), **kw
    )
    mx_variant = bwd.find_variant(head_dim=64, dkv="mx")
    _, mk, mv = bwd.attention_bwd_sm100(qo, ko, vo, do_op, lse, delta, lens, variant=mx_variant, **kw)
    for g, (row, col) in ((dk, mk), (dv, mv)):
        x = g.astype(jnp.bfloat16).reshape(B * S, K * 64)
        for got, axis in ((row, -1), (col, -2)):
            want = quantize(x, axis=axis)
            assert got.axes == want.axes and got.shape == (B * S, K * 64)
            np.testing.assert_array_equal(np.asarray(got.data).view(np.uint8), np.asarray(want.data).view(np.uint8))
            np.testing.assert_array_equal(np.asarray(got.scale), np.asarray(want.scale))
        assert np.all(np.isfinite(np.asarray(dequantize(row))))


@pytest.mark.parametrize("cc", BLACKWELL, ids=IDS)
def test_mx_gradient_vjp_takes_the_mx_dkv_variant(monkeypatch, cc):
    """dot_product_attention_vjp with bfloat16 inputs on cc 10.x: one backward call of the dkv "mx" variant, whose
    MXGradients equal the ordinary route's (the float32 variant's bfloat16 dK, dV quantized both ways) bit for
    bit, and dq equal."""
    q, k, v, do, ln = _problem(fresh_rng())
    q, k, v, do = (x.astype(jnp.bfloat16) for x in (q, k, v, do))
    kw = dict(is_causal=True, query_seq_lengths=ln[0], key_value_seq_lengths=ln[1])
    variants = []
    real = ffi_op.FfiOp.call

    def record(self, static, path, *a):
        variants.append(getattr(static, "variant", None))
        return real(self, static, path, *a)

    monkeypatch.setattr(ffi_op.FfiOp, "call", record)
    jax.clear_caches()
    with library.forced_gpu(cc):
        out, vjp = dot_product_attention_vjp(q, k, v, **kw)
        dq, dk, dv = vjp(do)
        assert [x.dkv for x in variants if isinstance(x, registry.AttentionBwdSm100Config)] == ["mx"]
        ref_out, ref_vjp = jax.vjp(lambda q, k, v: mx.dot_product_attention(q, k, v, **kw), q, k, v)
        rq, rk, rv = ref_vjp(do)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref_out))
    np.testing.assert_array_equal(np.asarray(dq), np.asarray(rq))
    for got, g in ((dk, rk), (dv, rv)):
        x = g.reshape(B * S, K * 64)
        for part, axis in ((got.row, -1), (got.col, -2)):
            want = quantize(x, axis=axis)
            np.testing.assert_array_equal(np.asarray(part.data).view(np.uint8), np.asarray(want.data).view(np.uint8))
            np.testing.assert_array_equal(np.asarray(part.scale), np.asarray(want.scale))


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_cuda_lowering_holds_the_sm100_backward_custom_calls(packed):
    """The backward's program for a GPU (exported for platform cuda on this machine) calls the pre-pass and the
    backward targets with the variants' names and the scalars tau, fl(tau log2 e), tau (float32 dQ)."""
    rng = fresh_rng()
    q, k, v, do = (jnp.asarray(rng.standard_normal((1, 128, 2, 64)), jnp.float32) for _ in range(4))
    qo, ko, vo = (ops.sm100_operand(ops.quantize_square(x)) for x in (q, k, v))
    lse = jnp.zeros((1, 2, 128), jnp.float32)
    if packed:
        from jax_mxfp8.primitives.attention_sm100_packed import packed_tables

        cu = jnp.asarray([0, 128], jnp.int32)
        tables, lim = packed_tables(cu, cu, causal=True, n_chunks_q=1, n_chunks_k=1), dict(max_len_q=128, max_len_k=128)
    else:
        tables, lim = jnp.asarray([[128], [100]], jnp.int32), {}
    variant = bwd.find_variant(head_dim=64, causal=True, packed=packed)

    def f():
        do_op, delta = bwd.bwd_prepass_sm100(do, do, lse, tables, path="cuda", max_len_q=lim.get("max_len_q"))
        return bwd.attention_bwd_sm100(
            qo, ko, vo, do_op, lse, delta, tables, variant=variant, scale=0.125, path="cuda", **lim
        )

    unchecked = [jax.export.DisabledSafetyCheck.custom_call(t) for t in (bwd.TARGET, bwd.TARGET_PREPASS)]
    text = jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=unchecked)().mlir_module()
    assert set(re.findall(r"custom_call @(\w+)\(", text)) == {bwd.TARGET, bwd.TARGET_PREPASS}
    suffix = "_packed" if packed else ""
    assert f'kernel = "attention_bwd_sm100_h64_causal{suffix}"' in text
    assert f'kernel = "attention_bwd_prepass_sm100_h64_f32{suffix}"' in text
    (log2,) = re.findall(r"scale_log2 = ([-+.e0-9]+) : f32", text)
    assert np.float32(log2) == np.float32(0.125 * np.log2(np.e))
    assert re.search(r"dq_scale = 1.250*e-01 : f32", text) and re.search(r"\bscale = 1.250*e-01 : f32", text)
