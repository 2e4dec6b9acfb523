"""Knowing what runs: `python -m jax_mxfp8` (jax_mxfp8/diagnostics.py), the one-time fallback warning of
implementation=None on a GPU (jax_mxfp8/primitives/implementation.py) and the ops' jax.named_scope names.

CPU only: a GPU's presence, the library's state and the kernels' runnability are faked by monkeypatching
jax_mxfp8.primitives.library (gpu_present, load_library, library_error, gpu_cc, kernels_runnable,
preload) or forced with library.forced_gpu; calls that would then take the kernel path are only traced
(jax.eval_shape), never run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jax_mxfp8
from jax_mxfp8 import diagnostics
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library

ROOT = Path(__file__).resolve().parents[2]
OPS = (
    "quantize",
    "dequantize",
    "rms_norm_quantize",
    "mx_dot_general",
    "mx_dot_general_quantized",
    "dot_product_attention",
    "dot_product_attention_vjp",
    "varlen_attention",
    "broadcast_query_attention",
)


@pytest.fixture
def fresh_warnings(monkeypatch):
    """A process that has not warned yet, with every warning shown."""
    monkeypatch.setattr(impl, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _fallbacks(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, impl.KernelFallbackWarning)]


def _x():
    return jax.random.normal(jax.random.key(0), (64, 64), jnp.float32)


# ------------------------------------------------------------------------------------------ diagnostics
def test_report_on_this_machine():
    text = diagnostics.report()
    for word in ("versions", "kernel library", "devices", "ops:"):
        assert word in text
    assert f"jax                {jax.__version__}" in text
    assert f"jax_mxfp8          {jax_mxfp8.__version__}" in text
    assert str(library.library_path()) in text
    if library.load_library() is None:
        assert f"NOT loaded: {library.library_error()}" in text and impl.FIX_LIBRARY in text
    else:
        assert f"loaded: {len(library.ffi_targets())} FFI targets" in text
        assert f"binding            {library.binding()}" in text
        assert "for sm_90a" in text
    if jax.default_backend() == "cpu":
        assert "default backend: cpu" in text and "no NVIDIA GPU" in text
    decisions = {d.op: d for d in diagnostics.op_decisions()}
    assert tuple(decisions) == OPS
    for op in OPS:
        assert f"  {op:<25} -> {decisions[op].path}" in text
    if jax.default_backend() == "cpu":
        for op in OPS:
            assert decisions[op].path == "xla", decisions[op]
        # a fresh clone has no built library: that is the first reason then (the README's test command)
        why = "not an NVIDIA GPU" if library.load_library() is not None else "kernel library is unavailable"
        assert why in decisions["quantize"].reason


def test_report_without_the_library(monkeypatch):
    monkeypatch.setattr(library, "load_library", lambda: None)
    monkeypatch.setattr(library, "library_error", lambda: "/x/libjax_mxfp8_kernels.so is not built")
    text = diagnostics.report()
    assert "NOT loaded: /x/libjax_mxfp8_kernels.so is not built" in text
    assert "build_wheel.py" in text
    for d in diagnostics.op_decisions():
        assert d.path == "xla"


def test_decisions_on_a_faked_hopper(monkeypatch, fresh_warnings):
    """Library loaded, sm_90 GPU: the typical calls take the kernels (traced only), mx_dot_general has none."""
    monkeypatch.setattr(library, "gpu_present", lambda: True)
    monkeypatch.setattr(library, "gpu_cc", lambda: (9, 0))
    monkeypatch.setattr(library, "kernels_runnable", lambda archs=(): (True, ""))
    monkeypatch.setattr(library, "preload", lambda: None)
    decisions = {d.op: d for d in diagnostics.op_decisions()}
    for op in OPS:
        assert decisions[op].path == "cuda", decisions[op]
        assert "kernel covers the call" in decisions[op].reason
    assert "backward runs the XLA reference" in decisions["rms_norm_quantize"].reason
    assert "backward: the backward kernel" in decisions["dot_product_attention"].reason
    assert "backward" not in decisions["mx_dot_general"].reason  # its kernel runs all three GEMMs
    # the vjp's MX gradients: their rowcol quantize takes its kernel too
    assert "dK, dV quantized (row and column blocks) by: cuda" in decisions["dot_product_attention_vjp"].reason
    assert _fallbacks(fresh_warnings) == []  # diagnostics never warn


@pytest.mark.parametrize("cc", [(10, 0), (10, 3)], ids=["cc10.0", "cc10.3"])
def test_decisions_on_a_forced_blackwell(cc, fresh_warnings):
    """cc 10.0 and 10.3 (B200 / GB300) are served by the same sm_100f cubins: quantize, RMSNorm and every GEMM
    op take their Blackwell kernel path (emulated here: forced_gpu), attention too."""
    with library.forced_gpu(cc):
        decisions = {d.op: d for d in diagnostics.op_decisions()}
        devices = diagnostics.device_lines()
    for op in ("quantize", "dequantize", "rms_norm_quantize", "mx_dot_general", "mx_dot_general_quantized"):
        assert decisions[op].path == "emulated", decisions[op]
    assert decisions["dot_product_attention"].path == "emulated"
    assert f"forced: compute capability {cc[0]}.{cc[1]} (library.forced_gpu: served by the sm_100f cubins" in devices[1]


def test_consumer_blackwell_is_not_supported():
    """cc 12.x (sm_120) loads no cubin of the library: every op runs the reference, the reason says why."""
    with library.forced_gpu((12, 0)):
        decisions = diagnostics.op_decisions()
        ok, why = library.kernels_runnable()
    assert not ok and "consumer Blackwell (sm_120" in why and "is not supported" in why
    for d in decisions:
        assert d.path == "xla", d
        assert "consumer Blackwell" in d.reason or d.op == "mx_dot_general_quantized", d


def test_report_names_which_cubin_serves_which_cc():
    lines = diagnostics.arch_lines()
    assert lines[0] == "sm_90a cubins serve compute capability 9.0"
    assert lines[1].startswith("sm_100f cubins serve compute capability 10.0, 10.3")
    assert lines[2].startswith("compute capability 12.x: consumer Blackwell (sm_120")
    text = diagnostics.report()
    assert "archs              sm_90a cubins serve compute capability 9.0" in text
    assert "first-use self-tests" in text and "mx_gemm_sm100" in text


def test_python_m_jax_mxfp8_self_test():
    """--self-test on a machine without a Blackwell GPU: every family is skipped with the reason; exit 0."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-m", "jax_mxfp8", "--self-test"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "self-test: every kernel family that has not run on hardware before" in out.stdout
    for family in ("mx_gemm_sm100", "blocked_operands", "rms_norm_quantize_blocked"):
        assert f"  {family:<26} skipped" in out.stdout
    assert "ops:" not in out.stdout  # the self-test report does not trace the ops
    bad = subprocess.run([sys.executable, "-m", "jax_mxfp8", "--bogus"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "usage: python -m jax_mxfp8 [--self-test]" in bad.stderr


def test_python_m_jax_mxfp8():
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-m", "jax_mxfp8"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("jax_mxfp8 diagnostics")
    for op in OPS:
        assert f"  {op} " in out.stdout


def test_python_m_jax_mxfp8_without_a_backend():
    """JAX_PLATFORMS=cuda where no CUDA backend can start (no plugin, or no visible GPU): the report prints
    what it can (versions, library), says why there is no backend, traces no op and exits 1 (it was a bare
    AssertionError from jax with nothing printed)."""
    if any(name.startswith("jax-cuda") for name in diagnostics.versions()) and jax.default_backend() == "gpu":
        pytest.skip("the CUDA backend starts here")
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cuda")
    out = subprocess.run(
        [sys.executable, "-m", "jax_mxfp8"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "AssertionError" not in out.stderr, out.stderr
    assert out.stdout.startswith("jax_mxfp8 diagnostics")
    assert f"  jax                {jax.__version__}" in out.stdout and "kernel library" in out.stdout
    assert "no JAX backend: JAX_PLATFORMS='cuda'" in out.stdout and "jax CUDA plugins:" in out.stdout
    assert "not traced: no JAX backend" in out.stdout and " -> " not in out.stdout
    assert "no JAX backend, so no op was traced" in out.stderr


def test_backend_failures_become_a_reason(monkeypatch):
    """Both ways jax.devices() fails without a backend (RuntimeError from a platform that fails to start, a
    bare AssertionError when every named platform was skipped) become the devices line; nothing raises."""
    for exc, said in ((RuntimeError("Unable to initialize backend 'cuda'"), "Unable to initialize backend 'cuda'"),
                      (AssertionError(), "no platform it names could start here")):  # fmt: skip

        def fail(*a, exc=exc, **k):
            raise exc

        monkeypatch.setattr(jax, "devices", fail)
        why = diagnostics.backend_error()
        assert why is not None and said in why and "Fix:" in why
        lines = list(diagnostics.report_lines())
        assert f"  no JAX backend: {why}" in lines
        assert lines[-1] == "  not traced: no JAX backend (devices, above)"


# ---------------------------------------------------------------------------------------- the warning
def test_no_warning_without_a_gpu(fresh_warnings):
    jax_mxfp8.quantize(_x())
    assert _fallbacks(fresh_warnings) == []


def test_warns_once_when_the_library_is_missing_on_a_gpu(monkeypatch, fresh_warnings):
    monkeypatch.setattr(library, "gpu_present", lambda: True)
    monkeypatch.setattr(library, "load_library", lambda: None)
    monkeypatch.setattr(library, "library_error", lambda: "/x/libjax_mxfp8_kernels.so is not built")
    x = _x()
    jax_mxfp8.quantize(x)
    jax_mxfp8.quantize(x * 2)
    (msg,) = _fallbacks(fresh_warnings)
    assert msg.startswith("jax_mxfp8.quantize: implementation=None runs the XLA reference")
    assert "kernel library is unavailable (/x/libjax_mxfp8_kernels.so is not built)" in msg
    assert "tools/build_wheel.py" in msg and "pip install dist/jax_mxfp8-" in msg  # names the fix
    # another op warns once for itself; an explicit implementation='xla' never warns
    jax_mxfp8.rms_norm_quantize(x, jnp.ones((64,)))
    jax_mxfp8.rms_norm_quantize(x, jnp.ones((64,)))
    jax_mxfp8.dequantize(jax_mxfp8.quantize(x, implementation="xla"), implementation="xla")
    msgs = _fallbacks(fresh_warnings)
    assert len(msgs) == 2 and msgs[1].startswith("jax_mxfp8.rms_norm_quantize:")


def test_warns_when_the_gpu_arch_has_no_kernels(monkeypatch, fresh_warnings):
    if library.load_library() is None:
        monkeypatch.setattr(library, "load_library", lambda: object())
    monkeypatch.setattr(library, "gpu_present", lambda: True)
    monkeypatch.setattr(library, "gpu_cc", lambda: (8, 0))
    jax_mxfp8.quantize(_x())
    (msg,) = _fallbacks(fresh_warnings)
    assert "compute capability 8.0" in msg and "sm_90a: cc 9.0" in msg and "implementation='xla'" in msg


def test_warns_when_the_kernel_does_not_cover_the_call(monkeypatch, fresh_warnings):
    if library.load_library() is None:  # a fresh clone: no built library
        monkeypatch.setattr(library, "load_library", lambda: object())
    monkeypatch.setattr(library, "gpu_present", lambda: True)
    monkeypatch.setattr(library, "kernels_runnable", lambda archs=(): (True, ""))
    monkeypatch.setattr(library, "preload", lambda: None)
    x = _x()
    jax_mxfp8.quantize(x, rounding="stochastic", rng=jax.random.key(1))
    jax_mxfp8.quantize(x.astype(jnp.float16))  # another uncovered call of the same op: already warned
    (msg,) = _fallbacks(fresh_warnings)
    assert "does not cover the arguments: the kernels round to nearest even only" in msg
    assert "implementation='xla'" in msg
    # a covered call takes the kernel and does not warn (traced only: there is no GPU here)
    jax.eval_shape(lambda a: jax_mxfp8.rms_norm_quantize(a, jnp.ones((64,))), x)
    assert len(_fallbacks(fresh_warnings)) == 1


def test_a_nested_fallback_names_the_op_the_user_called(monkeypatch, fresh_warnings):
    """The kernel-path attention quantizes its operands with the public `quantize`: when that inner call falls
    back, the warning names dot_product_attention / varlen_attention (it named `quantize`), once per (op, inner
    op, cause), and a direct `quantize` call still warns for itself."""
    from jax_mxfp8.primitives import quantize as pq

    if library.load_library() is None:
        monkeypatch.setattr(library, "load_library", lambda: object())
    monkeypatch.setattr(library, "gpu_present", lambda: True)
    monkeypatch.setattr(library, "gpu_cc", lambda: (9, 0))
    monkeypatch.setattr(library, "kernels_runnable", lambda archs=(): (True, ""))
    monkeypatch.setattr(library, "preload", lambda: None)
    monkeypatch.setattr(pq, "_quantize_variant", lambda *a, **k: (None, "a faked coverage gap"))
    # shapes no other test traces (the ops cache their traces: a cached trace makes no decisions)
    bf16 = jnp.bfloat16
    q, kv = jax.ShapeDtypeStruct((2, 96, 4, 64), bf16), jax.ShapeDtypeStruct((2, 96, 2, 64), bf16)
    dpa = lambda a, b, c: jax_mxfp8.dot_product_attention(a, b, c, is_causal=True)  # noqa: E731
    with impl.record() as decisions:
        jax.eval_shape(dpa, q, kv, kv)
        jax.eval_shape(dpa, q, kv, kv)  # the same cause again: no second warning
    assert ("dot_product_attention", "cuda") in {(d.op, d.path) for d in decisions}  # the attention kernel runs
    assert ("quantize", "xla") in {(d.op, d.path) for d in decisions}  # its operand quantize fell back
    (msg,) = _fallbacks(fresh_warnings)
    assert msg.startswith("jax_mxfp8.dot_product_attention (its internal quantize): implementation=None runs"), msg
    assert "a faked coverage gap" in msg and "pass implementation='xla' to dot_product_attention" in msg
    assert "jax_mxfp8.quantize:" not in msg
    monkeypatch.setattr(impl, "_warned", set())
    pq_, pkv = jax.ShapeDtypeStruct((384, 4, 64), bf16), jax.ShapeDtypeStruct((384, 2, 64), bf16)
    cu = jax.ShapeDtypeStruct((4,), jnp.int32)
    var = lambda a, b, c, cq, ck: jax_mxfp8.varlen_attention(a, b, c, cq, ck, max_seqlen_q=192, max_seqlen_k=192)  # noqa: E731
    jax.eval_shape(var, pq_, pkv, pkv, cu, cu)
    assert _fallbacks(fresh_warnings)[-1].startswith("jax_mxfp8.varlen_attention (its internal quantize)")
    # a call traced after the public op returned (a backward pass quantizing dO) still names the attention
    from jax_mxfp8.ops import attention_core as dense

    monkeypatch.setattr(impl, "_warned", set())
    jax.eval_shape(lambda a: dense.square_sequence_major(a, None, "up"), jax.ShapeDtypeStruct((1, 64, 2, 64), bf16))
    assert _fallbacks(fresh_warnings)[-1].startswith("jax_mxfp8.dot_product_attention (its internal quantize)")
    # the user's own quantize call is a separate cause and names quantize
    jax.eval_shape(lambda a: jax_mxfp8.quantize(a), jax.ShapeDtypeStruct((64, 64), jnp.bfloat16))
    assert _fallbacks(fresh_warnings)[-1].startswith("jax_mxfp8.quantize: implementation=None runs the XLA")


def test_record_collects_decisions():
    with impl.record() as decisions:
        jax_mxfp8.quantize(_x(), implementation="xla")  # the public op short-cuts "xla": no decision
        jax_mxfp8.dequantize(jax_mxfp8.quantize(_x(), implementation="xla"))
    assert [(d.op, d.implementation, d.path) for d in decisions] == [("dequantize", None, "xla")]
    assert decisions[0].reason


# ------------------------------------------------------------------------------------------ named scopes
def test_ops_carry_named_scopes():
    x = _x()
    q = jax.random.normal(jax.random.key(1), (1, 32, 2, 32), jnp.float32)
    cu = jnp.array([0, 32], jnp.int32)
    calls = {
        "quantize": lambda: jax_mxfp8.quantize(x),
        "dequantize": lambda: jax_mxfp8.dequantize(jax_mxfp8.quantize(x)),
        "rms_norm_quantize": lambda: jax_mxfp8.rms_norm_quantize(x, jnp.ones((64,)))[0],
        "mx_dot_general": lambda: jax_mxfp8.mx_dot_general(x, x, (((1,), (0,)), ((), ()))),
        "dot_product_attention": lambda: jax_mxfp8.dot_product_attention(q, q, q),
        "varlen_attention": lambda: jax_mxfp8.varlen_attention(
            q[0], q[0], q[0], cu, cu, max_seqlen_q=32, max_seqlen_k=32
        ),
    }
    for op, fn in calls.items():
        text = jax.jit(fn).lower().as_text(debug_info=True)
        assert f"/jax_mxfp8.{op}/" in text, op
