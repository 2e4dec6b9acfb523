"""benchmarks/profile_attention_step.py: a CPU smoke run (tiny shape, kernel calls emulated) writes the JSON with
the step times of ours and cuDNN's stand-in and the three pre-pass timings (a CPU trace has no GPU planes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_writes_the_json(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    path = ROOT / "benchmarks" / "profile_attention_step.py"
    spec = importlib.util.spec_from_file_location("profile_attention_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "p.json"
    assert module.main(["--smoke", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    for impl in ("ours", "cudnn_bf16"):
        assert row[impl]["step_ms"] > 0 and "gpu_ms" in row[impl]
    for key in ("prepass_xla_s", "prepass_calls_s", "prepass_sdp_fp8_s"):
        assert row[key] > 0
