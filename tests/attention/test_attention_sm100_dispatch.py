"""The attention ops on the Blackwell dispatch, on any machine: library.forced_gpu((10, 0)) / ((10, 3)) decides as
on a B200 / GB300 with the kernel library built and runs the kernels it picks emulated (their XLA emulation).

  - the shared attention cases (tests/attention/attention_cases_testutil.AttentionImplementationCases) with
    implementation=None: forward and gradients against float64 and the XLA reference, p_scale "block", NaN
    isolation across batch rows, jagged sequences;
  - the forward of dot_product_attention, varlen_attention and broadcast_query_attention calls the sm100 target
    (not the Hopper one, not the reference), and a cuda lowering of the primitive holds that custom call;
  - jagged sequences are isolated bit for bit on the packed sm100 path (outputs and gradients), a NaN stays in
    its sequence, and the rows the kernel leaves unwritten (outside every sequence) never reach the output.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.primitives import attention_fwd_sm100 as sm100
from jax_mxfp8.primitives import ffi_op, library, self_test
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives.attention_sm100_operands import quantize_square, sm100_operand
from tests.attention.attention_cases_testutil import AttentionImplementationCases
from tests.attention.attention_testutil import assert_bits_equal, fresh_rng

BLACKWELL = [(10, 0), (10, 3)]
IDS = ["cc10.0", "cc10.3"]
SM100_TARGETS = {"jax_mxfp8_attention_fwd_sm100", "jax_mxfp8_attention_fwd_sm100_packed"}
HOPPER_TARGETS = {"jax_mxfp8_attention_fwd", "jax_mxfp8_attention_fwd_packed"}


@pytest.fixture(params=BLACKWELL, ids=IDS)
def blackwell(request):
    with library.forced_gpu(request.param):
        yield request.param


class TestForcedBlackwell(AttentionImplementationCases):
    """implementation=None on a forced Blackwell GPU: the sm100 kernel path, emulated."""

    IMPLEMENTATION = None

    @pytest.fixture(autouse=True)
    def _forced(self, blackwell):
        yield

    def check_backward_path(self, decisions):
        """The sm100 backward ran (emulated: forced_gpu), not the reference."""
        paths = {d.path for d in decisions if d.op == "dot_product_attention_bwd"}
        assert paths == {"emulated"}, decisions


def _record(monkeypatch, fn, *args):
    """(FFI targets the trace of fn(*args) calls, implementation decisions)."""
    calls = []
    real = ffi_op.FfiOp.call

    def record(self, static, path, *a):
        assert path == "emulated", (self.target, path)
        calls.append(self.target)
        return real(self, static, path, *a)

    monkeypatch.setattr(ffi_op.FfiOp, "call", record)
    jax.clear_caches()  # the ops' inner jits would replay an earlier trace without calling FfiOp.call
    with impl.record() as decisions:
        jax.make_jaxpr(fn)(*args)
    return calls, decisions


def _qkv(b=2, t=96, s=160, n=4, n_kv=2, h=64):
    rng = fresh_rng()
    shapes = ((b, t, n, h), (b, s, n_kv, h), (b, s, n_kv, h))
    return tuple(jnp.asarray(rng.standard_normal(shape), jnp.bfloat16) for shape in shapes)


def test_every_attention_forward_calls_the_sm100_target(monkeypatch, blackwell):
    q, k, v = _qkv()
    cu = jnp.asarray([0, 50, 96], jnp.int32)
    calls = {
        "dot_product_attention": _record(monkeypatch, lambda q, k, v: mx.dot_product_attention(q, k, v), q, k, v),
        "varlen_attention": _record(
            monkeypatch,
            lambda q, k, v: mx.varlen_attention(q, k, v, cu, cu, max_seqlen_q=64, max_seqlen_k=64, is_causal=True),
            q[0], k[0, :96], v[0, :96],
        ),
        "broadcast_query_attention": _record(
            monkeypatch, lambda q, k, v: mx.broadcast_query_attention(q, k, v), q[0], k, v
        ),
    }  # fmt: skip
    for op, (targets, decisions) in calls.items():
        assert set(targets) & SM100_TARGETS and not set(targets) & HOPPER_TARGETS, (op, targets)
        if op != "varlen_attention":  # the dense operands come from the producer (no re-layout of MXArrays)
            assert "jax_mxfp8_attention_operands_sm100" in targets, (op, targets)
        mine = [d for d in decisions if d.op == op]
        assert mine and all(d.path == "emulated" for d in mine), (op, mine)


def test_hopper_keeps_the_hopper_target(monkeypatch):
    q, k, v = _qkv()
    with library.forced_gpu((9, 0)):
        targets, _ = _record(monkeypatch, lambda q, k, v: mx.dot_product_attention(q, k, v, is_causal=True), q, k, v)
    assert "jax_mxfp8_attention_fwd" in targets and not set(targets) & SM100_TARGETS


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_cuda_lowering_holds_the_sm100_custom_call(packed):
    """The kernel path's program for a GPU (exported for platform cuda on this machine) calls the sm100 target
    with the variant's name and fl(tau log2 e)."""
    q, k, v = (quantize_square(x.astype(jnp.float32)) for x in _qkv(b=1, t=128, s=128))
    ops = sm100_operand(q, ("hd",)), sm100_operand(k, ("hd",)), sm100_operand(v, ("seq",))
    if packed:
        from jax_mxfp8.primitives.attention_sm100_packed import packed_tables

        cu = jnp.asarray([0, 128], jnp.int32)
        tables = packed_tables(cu, cu, causal=True, n_chunks_q=1, n_chunks_k=1)
        f = lambda: sm100.attention_fwd_sm100_packed(*ops, tables, causal=True, scale=0.125, max_len_q=128,
                                                     max_len_k=128, path="cuda")  # fmt: skip
    else:
        f = lambda: sm100.attention_fwd_sm100(*ops, jnp.asarray([[128], [100]], jnp.int32), causal=True, scale=0.125,
                                              path="cuda")  # fmt: skip
    target = "jax_mxfp8_attention_fwd_sm100" + ("_packed" if packed else "")
    unchecked = [jax.export.DisabledSafetyCheck.custom_call(target)]
    text = jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=unchecked)().mlir_module()
    assert set(re.findall(r"custom_call @(\w+)\(", text)) == {target}
    name = "attention_fwd_sm100_h64_causal" + ("_packed" if packed else "")
    assert f'kernel = "{name}"' in text
    (value,) = re.findall(r"scale_log2 = ([-+.e0-9]+) : f32", text)
    assert np.float32(value) == np.float32(sm100.scale_log2(0.125))


def _packed(rng, lens, n=4, n_kv=2, h=64):
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    total = int(cu[-1]) + 5  # 5 rows after the last sequence: in no sequence
    xs = [rng.standard_normal((total, heads, h)).astype(np.float32) for heads in (n, n_kv, n_kv, n)]
    return cu, xs


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_jagged_sequences_are_isolated_bit_for_bit(blackwell, is_causal):
    """Changing one sequence (its q, k, v, dO; then a NaN key in it) leaves every other sequence's output and
    gradients bit-identical; the rows after the last sequence stay 0; the NaN reaches its own sequence."""
    rng = fresh_rng()
    lens = [45, 7, 160, 33]
    cu, (q, k, v, do) = _packed(rng, lens)
    cfg = mx.AttentionConfig(p_scale="block")

    @jax.jit
    def run(q, k, v, do):
        def f(q, k, v):
            return mx.varlen_attention(q, k, v, jnp.asarray(cu), jnp.asarray(cu), max_seqlen_q=160,
                                       max_seqlen_k=160, is_causal=is_causal, config=cfg)  # fmt: skip

        o, vjp = jax.vjp(f, q, k, v)
        return (o, *vjp(do))

    base = run(q, k, v, do)
    victim = 2
    sl = slice(cu[victim], cu[victim + 1])
    keep = np.ones(q.shape[0], bool)
    keep[sl] = False
    q2, k2, v2, do2 = (x.copy() for x in (q, k, v, do))
    for x in (q2, k2, v2, do2):
        x[sl] = 5.0 * rng.standard_normal(x[sl].shape)
    pert = run(q2, k2, v2, do2)
    for a, b in zip(base, pert, strict=True):
        assert_bits_equal(np.asarray(a)[keep], np.asarray(b)[keep])
        assert not np.array_equal(np.asarray(a)[sl], np.asarray(b)[sl])
    np.testing.assert_array_equal(np.asarray(base[0])[cu[-1] :], 0.0)
    k3 = k.copy()
    k3[cu[victim] + 3] = np.nan
    o3 = np.asarray(run(q, k3, v, do)[0])
    assert_bits_equal(o3[keep], np.asarray(base[0])[keep])
    assert np.isnan(o3[sl]).all() if not is_causal else np.isnan(o3[cu[victim] + 3 : cu[victim + 1]]).all()


def test_rows_the_kernel_leaves_unwritten_never_reach_the_output(blackwell, monkeypatch):
    """The packed kernel writes the rows of its sequences only: the emulation's other rows are poisoned with NaN
    here (as the kernel leaves them), and varlen_attention's output still holds 0 there, finite elsewhere."""
    real = sm100._emulation

    def poisoned(call, q, *rest):
        o, lse = real(call, q, *rest)
        if call.variant.packed:
            seqs = rest[5]
            rows = jnp.arange(o.shape[1])
            inside = jnp.any((rows[:, None] >= seqs[4]) & (rows[:, None] < seqs[4] + seqs[2]), axis=1)
            o = jnp.where(inside[None, :, None, None], o, jnp.nan)
            lse = jnp.where(inside[None, None, :], lse, jnp.nan)
        return o, lse

    decl = dataclasses.replace(sm100.ATTENTION_FWD_SM100_PACKED, emulation=poisoned)
    monkeypatch.setattr(sm100, "ATTENTION_FWD_SM100_PACKED", decl)
    rng = fresh_rng()
    cu, (q, k, v, _) = _packed(rng, [70, 130])
    cu_q = jnp.asarray(cu + 3)  # 3 rows before the first sequence, 2 after the last: in no sequence
    cu_q = cu_q.at[0].set(3)
    o = np.asarray(mx.varlen_attention(q, k, v, cu_q, jnp.asarray(cu), max_seqlen_q=130, max_seqlen_k=130), np.float32)
    np.testing.assert_array_equal(o[:3], 0.0)
    np.testing.assert_array_equal(o[cu_q[-1] :], 0.0)
    assert np.isfinite(o).all()


def test_blackwell_coverage_is_the_hopper_kernels(blackwell):
    """The same arguments fall outside both kernels, with the reason: implementation="cuda" raises."""
    rng = fresh_rng()
    q = jnp.asarray(rng.standard_normal((1, 64, 2, 96)), jnp.bfloat16)
    with pytest.raises(ValueError, match="no Blackwell attention kernel for head_dim=96"):
        mx.dot_product_attention(q, q, q, implementation="cuda")
    q, k, v = _qkv(b=1, t=64, s=64)
    floor = mx.AttentionConfig(p_scale="block", scale_rounding="floor")
    with pytest.raises(ValueError, match="'up' rule only"):
        mx.dot_product_attention(q, k, v, implementation="cuda", config=floor)
    with pytest.raises(ValueError, match="bias or mask"):
        mx.dot_product_attention(q, k, v, bias=jnp.zeros((1, 4, 64, 64)), implementation="cuda")


def test_a_failed_self_test_disables_the_sm100_forward(monkeypatch):
    """A kernel whose first-use self-test mismatches (one O element off) is disabled for the process: the
    calls run the reference with a KernelFallbackWarning saying so, and implementation="cuda" raises."""

    def one_off(kernel):
        def faulty(ops, path):
            out = list(kernel(ops, path))
            out[0] = out[0].at[1, 7, 2, 5].add(1.0)
            return tuple(out)

        return faulty

    self_test.reset()
    monkeypatch.setattr(impl, "_warned", set())
    q, k, v = _qkv(b=1, t=64, s=64)
    try:
        with warnings.catch_warnings(record=True) as caught, library.forced_gpu((10, 0), self_tests=True):
            warnings.simplefilter("always")
            with self_test.inject(sm100.FAMILY, one_off), impl.record() as decisions:
                mx.dot_product_attention(q, k, v)
            with pytest.raises(RuntimeError, match="attention_fwd_sm100 kernels are disabled"):
                mx.dot_product_attention(q, k, v, implementation="cuda")
        assert [d.path for d in decisions if d.op == "dot_product_attention"] == ["xla"]
        (msg,) = [str(w.message) for w in caught if issubclass(w.category, impl.KernelFallbackWarning)]
        assert "attention_fwd_sm100 kernels are disabled" in msg and "mismatch" in msg, msg
    finally:
        self_test.reset()
