"""Loads a benchmarks/ script as a module for the benchmark smoke tests (benchmarks/ is not a package: its
scripts import each other by file name, so the folder goes on sys.path for the test's duration)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark(monkeypatch: pytest.MonkeyPatch, script: str) -> ModuleType:
    """benchmarks/<script>.py as a fresh module named benchmark_<script>, with benchmarks/ on sys.path (undone by
    monkeypatch after the test)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"benchmark_{script}", ROOT / "benchmarks" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
