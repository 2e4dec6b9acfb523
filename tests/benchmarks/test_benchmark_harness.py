"""benchmarks/harness.py, which every benchmark script uses: its flags and their older spellings, the per-mode
call counts, the metadata every JSON carries, strict JSON with non-finite floats, the time budget and the
timing rule's call count. CPU only."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402

SCRIPT = str(ROOT / "benchmarks" / "example_script.py")


def _parser(**kw):
    kw = dict(out="benchmarks/results/x.json", quick="q", smoke="s", smoke_aliases=("--cpu-smoke",),
              time_budget=280.0, calls="c", batches="b") | kw  # fmt: skip
    return harness.parser("doc", SCRIPT, **kw)


def test_flags_aliases_and_modes():
    args = harness.parse(_parser(), ["--cpu-smoke", "--budget-s", "12", "--out", "o.json"])
    assert args.smoke and args.mode == "smoke" and args.time_budget == 12.0 and args.out == "o.json"
    assert args.argv == ["--cpu-smoke", "--budget-s", "12", "--out", "o.json"]
    assert args.script == "benchmarks/example_script.py"
    quick = harness.parse(_parser(), ["--quick", "--time-budget", "5"])
    assert quick.mode == "quick" and quick.time_budget == 5.0
    full = harness.parse(_parser(), [])
    assert full.mode == "full" and full.time_budget == 280.0 and full.out == str(ROOT / "benchmarks/results/x.json")


def test_flags_a_script_does_not_ask_for_are_absent():
    ap = harness.parser("doc", SCRIPT)
    with pytest.raises(SystemExit):
        ap.parse_args(["--quick"])
    with pytest.raises(SystemExit):
        ap.parse_args(["--time-budget", "3"])
    assert harness.parse(harness.parser("doc", SCRIPT, time_budget=None), []).time_budget is None


def test_counts_per_mode_and_explicit_values_win():
    args = harness.parse(_parser(), ["--smoke"])
    harness.counts(args, calls={"full": 30, "quick": 10, "smoke": 2}, batches=3)
    assert (args.calls, args.batches) == (2, 3)
    args = harness.parse(_parser(), ["--quick", "--calls", "7"])
    harness.counts(args, calls={"full": 30, "quick": 10, "smoke": 2}, batches={"full": 3, "quick": 4, "smoke": 1})
    assert (args.calls, args.batches) == (7, 4)


def test_metadata_has_the_common_keys_then_the_scripts():
    args = harness.parse(_parser(), ["--smoke", "--calls", "3"])
    harness.counts(args, calls=30, batches=2)
    meta = harness.metadata(args, kernels=True, args={"x": 1}, flops="2MNK")
    for key in ("script", "command", "argv", "timestamp", "git_commit", "git_dirty", "python", "jax", "jaxlib",
                "backend", "platform", "device_kind", "device_count", "mode", "calls", "batches", "timing",
                "time_budget_s", "kernels", "note"):  # fmt: skip
        assert key in meta, key
    assert shlex.split(meta["command"]) == ["python", "benchmarks/example_script.py", "--smoke", "--calls", "3"]
    assert meta["calls"] == 3 and meta["batches"] == 2 and "median of 2 batches" in meta["timing"]
    assert meta["args"] == {"x": 1} and meta["flops"] == "2MNK" and list(meta)[-2:] == ["args", "flops"]
    if not meta["kernels"]["available"]:  # a CPU: why, without this checkout's absolute path
        assert meta["kernels"]["why_not"] and str(ROOT) not in meta["kernels"]["why_not"]


def test_write_json_is_strict_json_and_replaces_the_file(tmp_path):
    path = tmp_path / "sub" / "r.json"
    harness.write_json(path, {"a": 1}, rows=[{"x": float("inf"), "y": float("nan"), "z": -float("inf"), "w": 1.5}])
    harness.write_json(path, {"a": 2}, rows=[])
    strict = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert strict == {"meta": {"a": 2}, "rows": []}
    harness.write_json(path, {"a": 1}, rows=[{"x": float("inf"), "y": float("nan"), "z": -float("inf"), "w": 1.5}])
    rows = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c))["rows"]
    assert rows == [{"x": "inf", "y": "nan", "z": "-inf", "w": 1.5}]
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]  # no temporary file left


def test_time_budget():
    assert harness.TimeBudget(None).exceeded() is None
    assert harness.TimeBudget(3600.0).exceeded() is None
    over = harness.TimeBudget(0.0)
    while over.elapsed() <= 0.0:
        pass
    assert over.exceeded().startswith("time budget:")


def test_timeit_runs_calls_times_batches():
    n = []

    def fn(x):
        n.append(1)
        return x + 1

    seconds = harness.timeit(fn, (jnp.ones(4),), calls=5, batches=3)
    assert len(n) == 15 and seconds > 0
    n.clear()
    harness.timeit_rotating(fn, [jnp.ones(4), jnp.zeros(4)], calls=4, batches=2)
    assert len(n) == 2 + 8  # one untimed call on the first and on the last input


def test_markdown_table_and_fmt():
    assert harness.markdown_table(["a", "b"], [[1, "x"]]).splitlines() == ["| a | b |", "| --- | --- |", "| 1 | x |"]
    assert harness.fmt(1.234, ".2f") == "1.23" and harness.fmt(None) == "-" and harness.fmt(float("nan")) == "-"
