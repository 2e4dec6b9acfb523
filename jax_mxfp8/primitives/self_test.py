"""First-use self-tests of kernel families that have never run on hardware here (layer 5): the Blackwell ones.

No machine of this project has a Blackwell GPU, so the sm100 kernels are compiled and checked statically but
not run. The first time a call on a compute-capability 10.x GPU would launch a kernel of such a family, the
family's self-test runs once (per process and device) before the call is dispatched: a small problem built to
expose layout bugs, on the kernel, compared bit for bit with the kernel's XLA emulation. If the kernel's
outputs differ, it raises, or it does not finish within the family's time-out, the family is disabled for
the process: every later call takes the reference (implementation=None warns once, KernelFallbackWarning,
saying what failed; implementation="cuda" raises RuntimeError with it).

  SelfTestFamily                  what a family registers: its problem, the kernel call, the expected outputs
  register(family)                called by the family's primitive module (primitives/mx_gemm_sm100.py, ...)
  families() -> list[str]
  verdict(name) -> str | None     None: the family may run here; else why not. Runs the self-test the first
                                  time (in a thread of its own: outside any trace the caller is in, so it
                                  runs eagerly on concrete inputs even when the first call is under jit)
  run_all() -> list[Report]       every family (python -m jax_mxfp8 --self-test), regardless of the cache
  cached_reports() -> list[Report]  the reports of the self-tests run so far on this device
  status(name) -> str             one line: the family's archs and its cached verdict
  report_text(reports) -> str     a report a user can paste into an issue
  inject(name, wrap)              context manager for tests: the kernel call replaced by wrap(kernel call)
                                  (a permuted scale layout, an exception, a hang)
  reset()                         forget every verdict (tests)

On a GPU the kernel runs on path "cuda". Under library.forced_gpu(cc, self_tests=True) it runs its emulation
("emulated"), so CPU tests exercise the whole mechanism and, through inject, its failure paths; plain
forced_gpu(cc) (the dispatch tests) skips the self-tests.
JAX_MXFP8_SELF_TEST=0 skips the self-tests (the families are then trusted as built).

A kernel that hangs keeps its thread (and possibly the GPU's stream) busy: the time-out disables the family
and says so, but work queued behind the hung kernel may not complete; restart the process after such a report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import threading
import time
from collections.abc import Callable

import jax
import numpy as np

from jax_mxfp8.primitives import library

SELF_TEST_ENV = "JAX_MXFP8_SELF_TEST"
STATUSES = ("passed", "mismatch", "error", "timeout", "skipped")


@dataclasses.dataclass(frozen=True)
class SelfTestFamily:
    """One kernel family's first-use self-test.

    Attributes:
      name: the registry op family, e.g. "mx_gemm_sm100" (also the key of verdict()).
      archs: the library archs whose kernels it tests (the test runs only on a GPU one of them serves).
      problem: one line describing the problem (shapes, what it exposes), for the report.
      inputs: () -> the problem's operands (NumPy arrays; deterministic).
      kernel: (operands, path) -> outputs: the family's kernel(s) on path "cuda", or their emulation on
        "emulated", through the same primitives a dispatch uses. NumPy-convertible arrays.
      expected: (operands, outputs) -> the outputs the kernel must give: its XLA emulation of the same
        problem, computed on the CPU backend (on these inputs every summation order and internal precision
        gives the emulation's bits); `outputs` (the kernel's) for families whose contract is relative to
        their own results (RMSNorm: the MXArray is quantize(its own y)).
      timeout_s: seconds the kernel call (compile included) may take before the family counts as hung.
    """

    name: str
    archs: tuple[str, ...]
    problem: str
    inputs: Callable[[], tuple]
    kernel: Callable[[tuple, str], tuple]
    expected: Callable[[tuple], tuple]
    timeout_s: float = 300.0


@dataclasses.dataclass(frozen=True)
class Report:
    """The outcome of one family's self-test on one device."""

    family: str
    device: str
    path: str
    status: str  # one of STATUSES
    detail: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "skipped")


_families: dict[str, SelfTestFamily] = {}
_verdicts: dict[tuple[str, str], Report] = {}
_faults: dict[str, Callable] = {}
_lock = threading.Lock()


FAMILY_MODULES = ["jax_mxfp8.primitives.sm100_self_tests"]
"""Modules that register self-test families when imported (imported before the first verdict / run)."""


def register(family: SelfTestFamily) -> None:
    """Adds (or replaces) a family's self-test."""
    _families[family.name] = family


def _load() -> None:
    for module in FAMILY_MODULES:
        importlib.import_module(module)


def families() -> list[str]:
    _load()
    return sorted(_families)


def reset() -> None:
    """Forgets every verdict: the next verdict() of each family runs its self-test again."""
    with _lock:
        _verdicts.clear()


@contextlib.contextmanager
def inject(name: str, wrap: Callable[[Callable], Callable]):
    """Inside the block, family `name`'s self-test runs wrap(kernel) instead of its kernel call (fault
    injection for tests: a permuted scale layout, a kernel that raises, one that hangs). Verdicts reached
    inside stay cached: call reset() around it."""
    if name not in families():
        raise ValueError(f"no self-test family named {name!r} (known: {families()})")
    _faults[name] = wrap
    try:
        yield
    finally:
        _faults.pop(name, None)


def _device_key() -> tuple[str, str]:
    """(the cache key of the device the self-tests run on, its description)."""
    forced = library.forced_cc()
    if forced is not None:
        cc = f"{forced[0]}.{forced[1]}"
        return f"forced:{cc}", f"forced compute capability {cc} (library.forced_gpu; the emulation runs)"
    dev = jax.devices()[0]
    cc = getattr(dev, "compute_capability", "?")
    return f"{dev.platform}:{dev.id}:{cc}", f"{dev.device_kind} (device {dev.id}, compute capability {cc})"


def _differences(got: tuple, want: tuple) -> str:
    """'' when every output equals its expected value bit for bit, else what differs (first few places)."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    problems = []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            problems.append(f"output {i}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}")
            continue
        gb = g.reshape(-1).view(np.uint8).reshape(g.size, -1) if g.size else g.reshape(0, 1)
        wb = w.reshape(-1).view(np.uint8).reshape(w.size, -1) if w.size else w.reshape(0, 1)
        bad = np.nonzero((gb != wb).any(axis=1))[0]
        if bad.size:
            idx = [np.unravel_index(int(j), g.shape) for j in bad[:3]]
            where = "; ".join(
                f"{tuple(int(x) for x in ix)}: {g[ix]!r} (0x{bytes(gb[j]).hex()}) vs {w[ix]!r} (0x{bytes(wb[j]).hex()})"
                for ix, j in zip(idx, bad[:3], strict=True)
            )
            problems.append(f"output {i} ({g.dtype}{list(g.shape)}): {bad.size} of {g.size} elements differ, {where}")
    return "; ".join(problems)


def _run(family: SelfTestFamily, path: str) -> Report:
    """Runs one family's self-test on `path` in a thread of its own (time-out: family.timeout_s)."""
    key, device = _device_key()
    kernel = family.kernel
    if family.name in _faults:
        kernel = _faults[family.name](kernel)
    result: dict = {}

    def body():
        try:
            operands = family.inputs()
            got = tuple(np.asarray(x) for x in kernel(operands, path))
            with jax.default_device(jax.devices("cpu")[0]):
                want = tuple(np.asarray(x) for x in family.expected(operands, got))
            result["detail"] = _differences(got, want)
        except Exception as e:  # noqa: BLE001 - reported: the family is disabled with this message
            result["error"] = f"{type(e).__name__}: {e}"

    t0 = time.monotonic()
    thread = threading.Thread(target=body, name=f"jax_mxfp8 self-test {family.name}", daemon=True)
    thread.start()
    thread.join(family.timeout_s)
    seconds = time.monotonic() - t0
    if thread.is_alive():
        detail = f"did not finish within {family.timeout_s:g} s (the kernel may hang; restart the process)"
        return Report(family.name, device, path, "timeout", detail, seconds)
    if "error" in result:
        return Report(family.name, device, path, "error", result["error"], seconds)
    if result["detail"]:
        return Report(family.name, device, path, "mismatch", result["detail"], seconds)
    return Report(family.name, device, path, "passed", family.problem, seconds)


def _path() -> str:
    return "emulated" if library.forced_cc() is not None else "cuda"


def _applies(family: SelfTestFamily) -> str | None:
    """Why the family's self-test does not run on this device (None: it does)."""
    ok, why = library.kernels_runnable(family.archs)
    return None if ok else why


def verdict(name: str) -> str | None:
    """None when family `name` may run on this device (its self-test passed, was skipped, or the family has
    none), else why not ("self-test failed: ..."). The first call per process and device runs the self-test;
    later calls return the cached verdict."""
    _load()
    family = _families.get(name)
    if family is None or os.environ.get(SELF_TEST_ENV, "") == "0" or _applies(family) is not None:
        return None
    if library.forced_cc() is not None and not library.forced_self_tests():
        return None
    key = (name, _device_key()[0])
    with _lock:
        report = _verdicts.get(key)
        if report is None:
            report = _verdicts[key] = _run(family, _path())
    if report.ok:
        return None
    return f"its first-use self-test {report.status} on {report.device}: {report.detail}"


def status(name: str) -> str:
    """One line: the family's archs and its cached verdict on this device (nothing is run)."""
    family = _families[name]
    key = (name, _device_key()[0])
    report = _verdicts.get(key)
    archs = ", ".join(family.archs)
    if report is None:
        why = _applies(family)
        return f"[{archs}] not run here: {why}" if why else f"[{archs}] not run yet (runs before the first call)"
    return f"[{archs}] {report.status}: {report.detail}"


def cached_reports() -> list[Report]:
    """The reports of the self-tests already run on this device (by verdict or run_all), by family name."""
    key = _device_key()[0]
    return [r for (name, dev), r in sorted(_verdicts.items()) if dev == key]


def run_all() -> list[Report]:
    """Runs every family's self-test now (fresh, and caches the verdicts); a family whose archs do not serve
    this device reports "skipped" with the reason."""
    reports = []
    for name in families():
        family = _families[name]
        why = _applies(family)
        if why is not None:
            reports.append(Report(name, _device_key()[1], "-", "skipped", why, 0.0))
            continue
        report = _run(family, _path())
        with _lock:
            _verdicts[(name, _device_key()[0])] = report
        reports.append(report)
    return reports


def report_text(reports: list[Report]) -> str:
    """The self-test report as plain text (what `python -m jax_mxfp8 --self-test` prints)."""
    lines = ["self-test: every kernel family that has not run on hardware before, on this device"]
    for r in reports:
        lines.append(f"  {r.family:<26} {r.status:<9} {r.seconds:6.1f} s  path={r.path}")
        lines.append(f"    device: {r.device}")
        lines.append(f"    {'problem' if r.status == 'passed' else 'detail'}: {r.detail}")
        if not r.ok:
            lines.append("    -> this family is disabled in this process: its calls run the XLA reference")
    if not reports:
        lines.append("  (no self-test families registered)")
    return "\n".join(lines)
