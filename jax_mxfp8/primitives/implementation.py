"""Implementation selection, one policy for every op (the public `implementation=` argument).

  None        the CUDA kernel when it can run here (kernel library built, default backend a GPU whose arch
              the kernel is built for) and covers the arguments; the XLA reference otherwise.
  "xla"       the XLA reference (exact numerics of the contract; runs anywhere).
  "emulated"  the kernel path with every FFI call replaced by its XLA emulation (the kernel's arithmetic
              and layouts: producer passes, re-encodings, tiling), under the same sharding and batching
              rules. Runs anywhere; slow; for tests and for reading the kernel's numerics on a CPU.
              ValueError when the kernel does not cover the arguments.
  "cuda"      the kernel, or RuntimeError when it cannot run here and ValueError naming why it does not
              cover the arguments.

On a compute-capability 10.x GPU a kernel family that registered a first-use self-test
(primitives/self_test.py: the Blackwell kernels, never run on hardware by this project) runs it before its
first call; a family whose self-test fails, errs or times out runs the reference for the rest of the process
(`resolve(..., family=...)`). Under library.forced_gpu(cc) the policy decides as on that GPU and runs the
kernels it picks emulated (path "emulated"): the dispatch tests of Hopper and Blackwell on any machine.

`resolve` turns the argument into the path one call takes: "xla", "emulated" or "cuda". With
implementation=None on a machine whose default backend is a GPU (`library.gpu_present`), a call that falls
back to the XLA reference warns once (KernelFallbackWarning, once per op and cause) naming the cause and
the fix: the kernel library is missing, the GPU's arch has no kernels, or the kernel does not cover the
arguments. The warning names the public op the user called: a public op that calls another one inside
(dot_product_attention and varlen_attention quantize their operands with `quantize`) runs its body under
`public_op(name)` (ops/scope.named_op does this for every public op), and an inner decision then warns
as "jax_mxfp8.dot_product_attention (its internal quantize): ...". `record()` collects the decisions of
the calls made inside it (`python -m jax_mxfp8`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import warnings

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library, self_test

IMPLEMENTATIONS = (None, "xla", "emulated", "cuda")
PATHS = ("xla", "emulated", "cuda")


def check(implementation) -> None:
    """ValueError unless `implementation` is one of IMPLEMENTATIONS."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}")


class KernelFallbackWarning(UserWarning):
    """A call made with implementation=None on a GPU runs the XLA reference instead of a CUDA kernel."""


@dataclasses.dataclass(frozen=True)
class Decision:
    """One call's implementation decision: the path taken and why (empty when the kernel runs)."""

    op: str
    implementation: str | None
    path: str
    reason: str


FIX_SELF_TEST = (
    "run python -m jax_mxfp8 --self-test and paste its report into an issue; JAX_MXFP8_SELF_TEST=0 skips the "
    "self-tests"
)
FIX_LIBRARY = (
    "install the wheel with the kernels (python tools/build_wheel.py, then pip install dist/jax_mxfp8-*.whl) "
    "or build them in place (python tools/build_library.py)"
)
_SILENCE = "pass implementation='xla' to choose the reference explicitly (and silence this warning)"
_recorders: list[list[Decision]] = []
_warned: set[tuple[str, str]] = set()


_outer_op: contextvars.ContextVar[str | None] = contextvars.ContextVar("jax_mxfp8_outer_op", default=None)


@contextlib.contextmanager
def public_op(name: str):
    """Marks the body of the public op `name`; inside an outer public op the outer name is kept, so
    `resolve` calls made by nested ops are attributed to the op the user called."""
    token = _outer_op.set(_outer_op.get() or name)
    try:
        yield
    finally:
        _outer_op.reset(token)


@contextlib.contextmanager
def record():
    """Collects the Decision of every `resolve` inside the block (in call order) into the yielded list."""
    decisions: list[Decision] = []
    _recorders.append(decisions)
    try:
        yield decisions
    finally:
        _recorders.remove(decisions)


def note(op: str, implementation: str | None, path: str, reason: str) -> None:
    """Records a decision an op made outside `resolve` (e.g. cuDNN on Blackwell) for `record()`."""
    for decisions in _recorders:
        decisions.append(Decision(op, implementation, path, reason))


def warn_once(op: str, cause: str, message: str) -> None:
    """Warns `message` (KernelFallbackWarning) once per process for (op, cause): for ops that fall back outside
    `resolve` (mx_dot_general on Blackwell: its kernels disabled, cuDNN runs)."""
    if (op, cause) not in _warned:
        _warned.add((op, cause))
        warnings.warn(message, KernelFallbackWarning, stacklevel=3)


def _fallback_warning(
    op: str, archs: tuple[str, ...], unsupported: str | None, outer: str | None = None, disabled: str | None = None
) -> tuple[str, str] | None:
    """(cause key, message) for a GPU call with implementation=None that runs the reference, or None.

    `outer`: the public op the user called, when `op` runs inside it (then the message names `outer`);
    `disabled`: why the kernel family is disabled (its self-test failed), when that is the cause."""
    if not library.gpu_present():
        return None
    if outer is None or outer == op:
        head = f"jax_mxfp8.{op}: implementation=None runs the XLA reference (slow) on this GPU because"
        silence = _SILENCE
    else:
        head = (
            f"jax_mxfp8.{outer} (its internal {op}): implementation=None runs the XLA reference (slow) for that "
            "step on this GPU because"
        )
        silence = f"pass implementation='xla' to {outer} for the reference throughout (and silence this warning)"
    if not library.library_ok():
        return "library", f"{head} the kernel library is unavailable ({library.library_error()}). Fix: {FIX_LIBRARY}."
    if disabled is not None:
        return "self-test", f"{head} {disabled}. Fix: {FIX_SELF_TEST}, or {silence}."
    ok, why = library.kernels_runnable(archs)
    if not ok:
        return "arch", f"{head} {why}. Fix: run on a GPU the kernels are built for, or {silence}."
    fix = f"Fix: change them, or {silence}."
    return "arguments", f"{head} the kernel does not cover the arguments: {unsupported}. {fix}"


def resolve(
    implementation: str | None,
    unsupported: str | None,
    archs: tuple[str, ...] = registry.ARCHS,
    op: str = "op",
    warn: bool = True,
    family: str | tuple[str, ...] = (),
) -> str:
    """The path ("xla", "emulated" or "cuda") one call takes.

    Args:
      implementation: the caller's argument (see the module docstring).
      unsupported: why the kernel does not cover this call's arguments, or None when it does.
      archs: the archs the kernel family is built for (its registry configs' `archs`).
      op: the public op's name, for the fallback warning and `record()`.
      warn: False where the op's "xla" path is not the reference but other ops that pick their own
        implementation (and warn for themselves), e.g. mx_dot_general_quantized's two-pass path.
      family: the kernel families (registry ops) the call would launch that have a first-use self-test
        (primitives/self_test.py): a family disabled by its self-test takes the reference ("cuda" raises).
    """
    check(implementation)
    path, reason = _decide(implementation, unsupported, archs)
    disabled = _disabled(family) if path == "cuda" else None
    if disabled is not None:
        if implementation == "cuda":
            raise RuntimeError(f"implementation='cuda' was requested but {disabled}")
        path, reason = "xla", disabled
    if path == "cuda" and library.forced_cc() is not None:
        path = "emulated"  # forced_gpu: the kernel's emulation stands in for the GPU this machine lacks
    for decisions in _recorders:
        decisions.append(Decision(op, implementation, path, reason))
    if implementation is None and path == "xla" and warn:
        outer = _outer_op.get()
        warning = _fallback_warning(op, archs, unsupported, outer, disabled)
        key = (op if outer in (None, op) else f"{outer}/{op}", warning[0] if warning else "")
        if warning is not None and key not in _warned:
            _warned.add(key)
            warnings.warn(warning[1], KernelFallbackWarning, stacklevel=3)
    return path


def _disabled(family: str | tuple[str, ...]) -> str | None:
    """Why one of the kernel families is disabled by its first-use self-test (runs it the first time), or None."""
    for name in (family,) if isinstance(family, str) else family:
        why = self_test.verdict(name)
        if why is not None:
            return f"the {name} kernels are disabled: {why}"
    return None


def kernel_blocker(unsupported: str | None, archs: tuple[str, ...], family: str | tuple[str, ...] = ()) -> str | None:
    """Why a call with implementation=None would not run the kernel (None: it would): the library or the GPU,
    the arguments, or a family disabled by its self-test. Records and warns nothing: for ops that choose
    between several kernel paths (mx_dot_general on Blackwell: ours, else cuDNN) before calling resolve."""
    ok, why = library.kernels_runnable(archs)
    if not ok:
        return why
    if unsupported:
        return f"the kernel does not cover the arguments: {unsupported}"
    return _disabled(family)


def _decide(implementation: str | None, unsupported: str | None, archs: tuple[str, ...]) -> tuple[str, str]:
    if implementation == "xla":
        return "xla", "implementation='xla'"
    if implementation == "emulated":
        if unsupported:
            raise ValueError(f"implementation='emulated': {unsupported}")
        return "emulated", "implementation='emulated'"
    ok, why = library.kernels_runnable(archs)
    if implementation == "cuda":
        if not ok:
            raise RuntimeError(f"implementation='cuda' was requested but {why}")
        if unsupported:
            raise ValueError(f"implementation='cuda': {unsupported}")
        library.preload()
        return "cuda", ""
    if ok and not unsupported:
        library.preload()
        return "cuda", ""
    return "xla", why if not ok else f"the kernel does not cover the arguments: {unsupported}"
