"""Shared by the sm100 static-check tests: the Python that can compile the kernels and the library build's
sm_100f dump (cubins, PTX and the traced facts per variant) that the checkers reuse instead of recompiling."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FACTS = "facts.json"  # tools/sm100_static.py's FACTS: what write_facts leaves next to each cubin


def build_python() -> str | None:
    """JAX_MXFP8_BUILD_PYTHON, else this Python when nvidia-cutlass-dsl imports here, else None."""
    explicit = os.environ.get("JAX_MXFP8_BUILD_PYTHON")
    if explicit:
        return explicit
    return sys.executable if importlib.util.find_spec("cutlass") is not None else None


def build_dump(names: Iterable[str]) -> Path | None:
    """The library build's sm_100f dump folder (build/kernels/sm_100f/dump, or JAX_MXFP8_KERNEL_DUMP) when it
    holds every variant in names, else None."""
    dump = Path(os.environ.get("JAX_MXFP8_KERNEL_DUMP", ROOT / "build" / "kernels" / "sm_100f" / "dump"))
    return dump if all((dump / name / FACTS).exists() for name in names) else None


def dump_arguments(tmp_path: Path, names: Iterable[str]) -> tuple[Path, list[str]]:
    """(--dump folder, extra checker arguments): a copy of the build's dump with --reuse when it holds every
    variant in names (the checker then compiles only what the production build leaves out), else an empty
    folder (the checker compiles every variant)."""
    dump, built = tmp_path / "dump", build_dump(names)
    if built is None:
        return dump, []
    shutil.copytree(built, dump)  # copied: the checker may compile comparison schedules next to them
    return dump, ["--reuse"]
