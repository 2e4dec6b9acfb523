"""The first-use self-tests of the Blackwell kernel families (primitives/self_test.py, sm100_self_tests.py), on CPU.

library.forced_gpu((10, 0), self_tests=True) makes this machine a B200 whose kernels are their emulations; faults
are injected into a family's kernel call (self_test.inject): a permuted scale layout (the bug the problem is
built to expose), a kernel that raises, one that hangs. Each must disable the family for the process with a
KernelFallbackWarning saying what failed, send the calls to the fallback (jax.nn / cuDNN for mx_dot_general,
the reference elsewhere), make implementation="cuda" raise, and show up in the report. The attention backward's
(attention_bwd_sm100_self_test.py): a query block read from the wrong place disables it, and jax.grad of
dot_product_attention runs the reference backward.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.ops.mx_dot_quantized import mx_dot_general_quantized
from jax_mxfp8.primitives import attention_bwd_sm100 as bwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library, self_test

B200 = (10, 0)
DN = (((1,), (0,)), ((), ()))


@pytest.fixture
def fresh(monkeypatch):
    """No cached verdicts and no warnings given yet (before and after the test); warnings recorded."""
    self_test.reset()
    monkeypatch.setattr(impl, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    self_test.reset()


def _fallbacks(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, impl.KernelFallbackWarning)]


def _swap_row_groups(kernel):
    """The classic layout bug: scale tiles read with (r % 32, r // 32) swapped (a 512-byte tile's 16-byte lines
    of rows r, r + 32, r + 64, r + 96 taken in the wrong order)."""

    def faulty(ops, path):
        a, b, sa, sb, bias = ops
        bad = sa.reshape(*sa.shape[:-1], 32, 4, 4).swapaxes(-3, -2).reshape(sa.shape)
        return kernel((a, b, bad, sb, bias), path)

    return faulty


def _raises(kernel):
    def faulty(ops, path):
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS (injected)")

    return faulty


def _calls(x, w, **kw):
    with impl.record() as decisions:
        jax.make_jaxpr(lambda a, b: mx.mx_dot_general(a, b, DN, **kw))(x, w)
    return [d for d in decisions if d.op == "mx_dot_general"]


def test_a_permuted_scale_layout_is_caught_and_the_family_disabled(fresh):
    x, w = jnp.ones((64, 128), jnp.bfloat16), jnp.ones((128, 96), jnp.bfloat16)
    with library.forced_gpu(B200, self_tests=True), self_test.inject("mx_gemm_sm100", _swap_row_groups):
        (decision,) = _calls(x, w)
        assert decision.path == "cudnn" and "mx_gemm_sm100 kernels are disabled" in decision.reason
        assert "self-test mismatch" in decision.reason and "elements differ" in decision.reason
        (msg,) = _fallbacks(fresh)
        assert msg.startswith("jax_mxfp8.mx_dot_general: Blackwell: jax.nn.scaled_dot_general (cuDNN)")
        assert "python -m jax_mxfp8 --self-test" in msg
        with pytest.raises(RuntimeError, match="implementation='cuda' was requested but the mx_gemm_sm100"):
            _calls(x, w, implementation="cuda")
        # an op with no cuDNN fallback takes its reference (the two-pass path here), without a second self-test
        with impl.record() as decisions:
            jax.eval_shape(lambda a, b: mx_dot_general_quantized(a, b, DN, preferred_element_type=jnp.bfloat16),
                           x, jnp.ones((128, 128), jnp.bfloat16))  # fmt: skip
        quantized = [d for d in decisions if d.op == "mx_dot_general_quantized"]
        assert quantized[0].path == "xla" and "disabled" in quantized[0].reason
        reports = self_test.cached_reports()
    by_name = {r.family: r for r in reports}
    assert by_name["mx_gemm_sm100"].status == "mismatch"
    assert "blocked_operands" not in by_name  # mx_dot_general checks its families in order: the GEMM failed first
    text = self_test.report_text(reports)
    assert "mx_gemm_sm100" in text and "mismatch" in text and "this family is disabled" in text


def test_a_kernel_that_raises_is_reported_once(fresh):
    runs = []

    def counting(kernel):
        def faulty(ops, path):
            runs.append(path)
            return _raises(kernel)(ops, path)

        return faulty

    x, w = jnp.ones((64, 128), jnp.float32), jnp.ones((128, 64), jnp.float32)
    with library.forced_gpu(B200, self_tests=True), self_test.inject("blocked_operands", counting):
        first = _calls(x, w)
        second = _calls(x * 2, w)
    assert runs == ["emulated"]  # the verdict is cached per process and device
    for (d,) in (first, second):
        assert d.path == "cudnn" and "blocked_operands kernels are disabled" in d.reason
        assert "error" in d.reason and "CUDA_ERROR_ILLEGAL_ADDRESS (injected)" in d.reason
    assert len(_fallbacks(fresh)) == 1


def test_a_hang_times_out(fresh):
    family = next(f for name, f in self_test._families.items() if name == "rms_norm_quantize_blocked")
    release = threading.Event()

    def hang(kernel):
        def faulty(ops, path):
            release.wait(30)
            return kernel(ops, path)

        return faulty

    self_test.register(dataclasses.replace(family, timeout_s=0.5))
    try:
        x = jnp.ones((2, 128, 64), jnp.bfloat16)
        t0 = time.monotonic()
        with library.forced_gpu(B200, self_tests=True), self_test.inject(family.name, hang), impl.record() as seen:
            y, q = mx.rms_norm_quantize(x, jnp.ones((64,)))
        assert time.monotonic() - t0 < 20
        assert [d.path for d in seen] == ["xla"]  # the blocked kernel is disabled: the reference runs
        assert q.scale_layout == "blocked"  # (and lays its scales out as the next GEMM reads them)
        (msg,) = _fallbacks(fresh)
        assert "rms_norm_quantize_blocked kernels are disabled" in msg and "did not finish within 0.5 s" in msg
    finally:
        release.set()
        self_test.register(family)


def test_the_first_call_may_come_under_jit(fresh):
    """The self-test runs eagerly in its own thread even when the first call is being traced by jit."""
    runs = []

    def spy(kernel):
        def faulty(ops, path):
            runs.append(threading.current_thread().name)
            raise RuntimeError("stop here")

        return faulty

    x, w = jnp.ones((64, 128), jnp.float32), jnp.ones((128, 64), jnp.float32)
    # (scale_rounding "floor": jax.nn does not cover it, so the disabled family's calls run the reference, which
    # runs on this CPU; jax.nn's scaled_matmul has no CPU lowering)
    with library.forced_gpu(B200, self_tests=True), self_test.inject("blocked_operands", spy):
        y = jax.jit(lambda a, b: mx.mx_dot_general(a, b, DN, scale_rounding="floor"))(x, w)
    assert runs == ["jax_mxfp8 self-test blocked_operands"]
    np.testing.assert_allclose(np.asarray(y), 128.0)


def test_no_self_test_where_the_family_does_not_run():
    with library.forced_gpu((9, 0), self_tests=True):
        assert self_test.verdict("mx_gemm_sm100") is None
        reports = self_test.run_all()
    assert {r.status for r in reports} == {"skipped"} and "sm_100f: cc 10.0, 10.3" in reports[0].detail


@pytest.mark.slow  # the six families' emulations: ~2 min on the 2-core machine
def test_every_family_passes_on_its_emulation(fresh):
    """The problems are consistent: the emulation passes its own self-test (a check of the problems and the
    comparison, not of the kernels, which no machine here can run)."""
    with library.forced_gpu((10, 3), self_tests=True):
        reports = self_test.run_all()
    assert [(r.family, r.status) for r in reports] == [
        ("attention_bwd_sm100", "passed"),
        ("attention_fwd_sm100", "passed"),
        ("attention_operands_sm100", "passed"),
        ("blocked_operands", "passed"),
        ("mx_gemm_sm100", "passed"),
        ("rms_norm_quantize_blocked", "passed"),
    ], self_test.report_text(reports)


# ------------------------------------------------ the attention backward (attention_bwd_sm100_self_test.py)
def _swap_query_blocks(kernel):
    """A layout bug: the first run's query rows 0..31 and 32..63 exchanged before the kernel reads them."""

    def faulty(ops, path):
        q = np.array(ops[0])
        q[:, :32], q[:, 32:64] = ops[0][:, 32:64], ops[0][:, :32]
        return kernel((q, *ops[1:]), path)

    return faulty


def _grad_decision():
    q = jnp.ones((1, 128, 2, 64), jnp.float32)
    jax.clear_caches()  # the op's inner jit would replay an earlier trace without deciding again
    with impl.record() as decisions:
        jax.make_jaxpr(jax.grad(lambda q: jnp.sum(mx.dot_product_attention(q, q, q))))(q)
    return [d for d in decisions if d.op == "dot_product_attention_bwd"]


@pytest.mark.slow  # three backward emulations compiled twice: ~70 s on the 2-core machine
def test_the_problem_passes_on_the_emulation(fresh):
    with library.forced_gpu(B200, self_tests=True):
        assert self_test.verdict(bwd.FAMILY) is None
        (decision,) = _grad_decision()
    assert decision.path == "emulated"


@pytest.mark.slow  # as above
def test_a_misplaced_query_block_disables_the_family(fresh):
    with library.forced_gpu(B200, self_tests=True), self_test.inject(bwd.FAMILY, _swap_query_blocks):
        why = self_test.verdict(bwd.FAMILY)
        assert why is not None and "mismatch" in why, why
        (decision,) = _grad_decision()
    assert decision.path == "xla" and "attention_bwd_sm100 kernels are disabled" in decision.reason
    warned = [str(w.message) for w in fresh if issubclass(w.category, impl.KernelFallbackWarning)]
    assert any("backward runs the XLA reference" in m and bwd.FAMILY in m for m in warned), warned
