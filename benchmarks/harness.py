"""What every benchmark script shares: its command line, metadata, time budget, timing rule, JSON and tables.

A script builds its command line with `parser`, which adds the common flags the script asks for, and reads it
with `parse`:

  --out PATH               where the JSON goes (the script's default; a folder for the scripts that name the
                           file themselves)
  --quick                  the script's short set of shapes and calls
  --smoke                  tiny shapes on any backend (kernels emulated or the XLA path): proves the script on
                           a CPU, its numbers mean nothing
  --time-budget S          shapes not started after S seconds are skipped (recorded as skipped); alias
                           --budget-s
  --calls N, --batches N   the timing rule's counts (defaults per mode: `counts`)

then records `metadata(args, ...)`, times with `timeit` (or `timeit_rotating` / `timeit_torch`), and writes
`write_json(path, meta, **payload)`, after every shape where it has several, so that a run cut short keeps what
it measured. Importing this module puts the repository root first on sys.path, so the scripts import this
checkout's `jax_mxfp8` when run as `python benchmarks/<script>.py` from the root.

The JSON is one object, `{"meta": meta, <payload keys>}`; `metadata` gives every script the same keys:
script, command (as run from the repository root), argv, timestamp (UTC), git_commit / git_dirty (None outside
a checkout), python, jax, jaxlib, backend, platform, device_kind, device_count, mode ("full", "quick" or
"smoke"), calls, batches, timing (the rule in words), time_budget_s, kernels (whether the kernel library's
variants for the script's archs can run here, and why not), and the script's own keys after them.
Non-finite floats are written as the strings "inf", "-inf" and "nan" (strict JSON; an exact match has SQNR inf).

The timing rule (`timeit`): enqueue `calls` calls, block once, divide; the median over `batches` such
batches, on inputs made before timing; a baseline runs in the same process on the same inputs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

MODES = ("full", "quick", "smoke")
SMOKE_NOTE = "SMOKE RUN: tiny shapes (kernels emulated or the XLA path): the timings mean nothing"


# ------------------------------------------------------------------------------------------- command line
def parser(
    doc: str,
    script: str,
    *,
    out: str | None = None,
    out_help: str | None = None,
    quick: str | None = None,
    smoke: str | None = None,
    smoke_aliases: Sequence[str] = (),
    time_budget: float | None | bool = False,
    calls: str | None = None,
    batches: str | None = None,
) -> argparse.ArgumentParser:
    """An argument parser with the script's docstring as its help and the common flags it asks for.

    doc: the module docstring (printed whole by --help). script: the script's `__file__`.
    out: --out's default, relative to the repository root unless absolute (None: no --out flag).
    quick / smoke: the help of --quick / --smoke (None: no such flag); smoke_aliases: older spellings of --smoke.
    time_budget: False for no --time-budget flag, None for the flag without a default limit, or its default (s).
    calls / batches: the help of --calls / --batches (None: no such flag); defaults come from `counts`.
    """
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.set_defaults(script=_relative(Path(script)))
    if out is not None:
        default = out if Path(out).is_absolute() else str(ROOT / out)
        ap.add_argument("--out", default=default, help=out_help or f"output path (default {out})")
    if quick is not None:
        ap.add_argument("--quick", action="store_true", help=quick)
    if smoke is not None:
        ap.add_argument("--smoke", *smoke_aliases, action="store_true", dest="smoke", help=smoke)
    if time_budget is not False:
        limit = "no limit" if time_budget is None else f"{time_budget:g} s"
        ap.add_argument(
            "--time-budget",
            "--budget-s",
            type=float,
            default=time_budget,
            dest="time_budget",
            metavar="S",
            help=f"skip the shapes not started after this many seconds (default {limit})",
        )
    if calls is not None:
        ap.add_argument("--calls", type=int, default=None, help=calls)
    if batches is not None:
        ap.add_argument("--batches", type=int, default=None, help=batches)
    return ap


def parse(ap: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """ap.parse_args(argv), with the arguments as given (`argv`) and the run's mode (`mode`) recorded."""
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.mode = "smoke" if getattr(args, "smoke", False) else "quick" if getattr(args, "quick", False) else "full"
    return args


def counts(args: argparse.Namespace, *, calls: int | Mapping[str, int], batches: int | Mapping[str, int]) -> None:
    """Fills args.calls / args.batches left unset on the command line: an int, or one per mode."""
    for name, default in (("calls", calls), ("batches", batches)):
        if getattr(args, name, None) is None:
            setattr(args, name, default if isinstance(default, int) else default[args.mode])


def command(args: argparse.Namespace) -> str:
    """The command line that reproduces the run, from the repository root."""
    return shlex.join(["python", args.script, *args.argv])


# ------------------------------------------------------------------------------------------------- metadata
def metadata(
    args: argparse.Namespace,
    /,
    *,
    kernels: tuple[str, ...] | bool = False,
    timing: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The common `meta` of a run (module docstring) followed by the script's own keys (`extra`).

    kernels: the archs whose kernel-library variants the script runs (True: every arch the registry builds;
    False: the script runs no kernel). timing: what one timed call is, when the rule alone does not say it.
    """
    devices = jax.devices()
    meta: dict[str, Any] = dict(
        script=args.script,
        command=command(args),
        argv=list(args.argv),
        timestamp=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **_git(),
        python=platform.python_version(),
        jax=jax.__version__,
        jaxlib=_version("jaxlib"),
        backend=jax.default_backend(),
        platform=devices[0].platform,
        device_kind=getattr(devices[0], "device_kind", str(devices[0])),
        device_count=len(devices),
        mode=args.mode,
    )
    if getattr(args, "calls", None) is not None:
        meta.update(calls=args.calls, batches=getattr(args, "batches", None))
        rule = f"enqueue {args.calls} calls, block once, divide; median of {meta['batches']} batches"
        meta["timing"] = rule if timing is None else f"{timing}; {rule}"
    elif timing is not None:
        meta["timing"] = timing
    if hasattr(args, "time_budget"):
        meta["time_budget_s"] = args.time_budget
    if kernels is not False:
        meta["kernels"] = kernel_status(None if kernels is True else kernels)
    if args.mode == "smoke":
        meta["note"] = SMOKE_NOTE
    meta.update(extra)
    return meta


def kernel_status(archs: tuple[str, ...] | None = None) -> dict[str, Any]:
    """{"available": whether the kernel library's variants for `archs` (None: every arch) run here, "why_not"}."""
    from jax_mxfp8.primitives import library

    ok, why = library.kernels_runnable() if archs is None else library.kernels_runnable(archs)
    return {"available": bool(ok), "why_not": why.replace(str(ROOT), ".") if why else None}


def _relative(path: Path) -> str:
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git() -> dict[str, Any]:
    """The checkout's commit and whether tracked files differ from it; None for both outside a git checkout."""

    def run(*cmd: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = run("rev-parse", "--short=12", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=no") if commit else None
    return dict(git_commit=commit, git_dirty=None if status is None else bool(status))


# ---------------------------------------------------------------------------------------------- time budget
class TimeBudget:
    """Seconds since the run started against `--time-budget` (None: no limit)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def exceeded(self) -> str | None:
        """Why the next shape is skipped ("time budget: ..."), or None while time is left."""
        elapsed = self.elapsed()
        if self.seconds is None or elapsed <= self.seconds:
            return None
        return f"time budget: {elapsed:.0f} s elapsed > --time-budget {self.seconds:.0f}"


# ---------------------------------------------------------------------------------------------------- timing
def timeit(fn: Callable, args: Sequence, calls: int, batches: int) -> float:
    """Median seconds per call: enqueue `calls` calls of fn(*args), block once, divide; median over `batches`."""
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def timeit_rotating(fn: Callable, inputs: Sequence, calls: int, batches: int) -> float:
    """`timeit` of fn(x) with x rotating over `inputs` (so that no call finds its input in L2), after one
    untimed call on the first and the last input (compilation and warm-up)."""
    jax.block_until_ready(fn(inputs[0]))
    jax.block_until_ready(fn(inputs[-1]))
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        out = None
        for i in range(calls):
            out = fn(inputs[i % len(inputs)])
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def timeit_torch(torch: Any, fn: Callable[[], Any], calls: int, batches: int) -> float:
    """`timeit` for a torch CUDA callable: one untimed call, then `calls` calls and torch.cuda.synchronize()."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------------------ JSON
def to_json(obj: Any) -> str:
    """JSON text (indent 1); non-finite floats become the strings "inf", "-inf", "nan"."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return str(x)
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(obj), indent=1) + "\n"


def write_json(path: str | os.PathLike, meta: Mapping[str, Any], **payload: Any) -> Path:
    """Writes {"meta": meta, **payload} to `path` (its folder made if missing), replacing the file whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(to_json({"meta": dict(meta), **payload}))
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------------------- tables
def markdown_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table: one header row, then one row per `rows` entry (cells formatted with str())."""
    lines = ["| " + " | ".join(str(h) for h in head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(x: Any, spec: str = ".1f", missing: str = "-") -> str:
    """format(x, spec) for a finite number, else `missing`."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return missing
    return format(x, spec)
