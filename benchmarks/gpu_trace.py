"""GPU kernel times from a jax.profiler trace, by kernel name and category (shared by the profile_* benchmarks).

gpu_kernel_times(trace_dir) -> ({kernel name: (total ns, count)}, stream line names)
category(kernel name) -> "ours:<module>" | "cublas" | "cudnn" | "xla" | "memcpy" | "other"
"""

from __future__ import annotations

import collections
import glob
import os
import re

_OURS = re.compile(r"jax_mxfp8kernels(?:sm\d+|common)([a-z0-9_]+)")


def category(kernel: str) -> str:
    """The category of one GPU kernel's name (module docstring)."""
    m = _OURS.search(kernel)
    if m:
        return f"ours:{m.group(1)}"
    n = kernel.lower()
    if "memcpy" in n or "memset" in n:
        return "memcpy"
    if "cudnn" in n or "fmha" in n or "flash" in n:
        return "cudnn"
    if any(s in n for s in ("nvjet", "xmma", "gemm", "cublas", "sm90_")):
        return "cublas"
    if any(s in n for s in ("fusion", "loop_", "input_", "wrapped_", "triton", "reduce", "transpose", "copy")):
        return "xla"
    return "other"


def gpu_kernel_times(trace_dir: str) -> tuple[dict[str, tuple[float, int]], list[str]]:
    """{kernel name: (total ns, count)} over the GPU planes' stream lines of the newest trace in trace_dir,
    and the line names seen (for the record: XLA names its stream lines "Stream #N(...)")."""
    from jax.profiler import ProfileData

    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not files:
        return {}, []
    data = ProfileData.from_file(files[-1])
    gpu_planes = [plane for plane in data.planes if plane.name.startswith("/device:GPU")]
    lines = [(plane.name, line) for plane in gpu_planes for line in plane.lines]
    lines_seen = [f"{p} | {line.name}" for p, line in lines]
    # kernels sit on the stream lines; the derived lines ("XLA Ops", "XLA Modules", "Steps", ...) repeat
    # the same time. Should no line be named "Stream ..." (another profiler version), every line that is
    # not a known derived one counts, and the line names in the JSON say which were taken.
    kernel_lines = [line for _, line in lines if line.name.startswith("Stream")]
    if not kernel_lines:
        derived = ("XLA Ops", "XLA Modules", "Steps", "Framework", "Source", "Launch", "TraceMe", "Kernel Launch")
        kernel_lines = [line for _, line in lines if not line.name.startswith(derived)]
        lines_seen.append("no 'Stream' line: took " + ", ".join(line.name for line in kernel_lines))
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for line in kernel_lines:
        for ev in line.events:
            t = totals[ev.name]
            t[0] += ev.duration_ns
            t[1] += 1
    return {k: (v[0], v[1]) for k, v in totals.items()}, lines_seen


def profile_calls(fn, args: tuple, calls: int, top: int = 25) -> dict:
    """Traces `calls` calls of fn(*args) with jax.profiler and returns the GPU kernel time per call:
    gpu_ms, categories_ms (by category(), longest first), launches per category, the `top` longest kernels
    and the trace's line names. A profiler that cannot start (no CUPTI) gives empty figures and says why in
    trace_lines, so that the caller's timings still stand."""
    import tempfile

    import jax

    with tempfile.TemporaryDirectory() as d:
        try:
            with jax.profiler.trace(d):
                out = None
                for _ in range(calls):
                    out = fn(*args)
                jax.block_until_ready(out)
            kernels, lines = gpu_kernel_times(d)
        except Exception as e:  # noqa: BLE001
            kernels, lines = {}, [f"trace failed: {type(e).__name__}: {e}"]
    per_call = {k: (ns / calls / 1e6, n // calls) for k, (ns, n) in kernels.items()}
    cats: dict[str, float] = collections.defaultdict(float)
    launches: dict[str, int] = collections.defaultdict(int)
    for k, (ms, n) in per_call.items():
        cats[category(k)] += ms
        launches[category(k)] += n
    longest = sorted(per_call.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(
        gpu_ms=sum(ms for ms, _ in per_call.values()),
        categories_ms=dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        launches=dict(launches),
        top_kernels=[dict(name=k[:160], ms=ms, count=n, category=category(k)) for k, (ms, n) in longest],
        trace_lines=sorted(set(lines))[:40],
    )
