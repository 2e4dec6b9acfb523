"""Static check of the Blackwell attention quantization helpers (jax_mxfp8/kernels/sm100/attention_quant.py):
compiled into a probe kernel (tests/build/sm100_attention_quant_probe.py) for sm_100a, sm_100f and sm_103a without a
GPU, the SASS holds the instructions the design relies on and nothing spills:

  CREDUX.MAXABS.F32.NAN      the 32 x 32 dS block amax in one warp reduction that keeps NaN (so a NaN block's
                             byte is 0xFF); plain CREDUX.MAXABS would drop the NaN
  FMNMX.NAN                  the per-thread amax keeps NaN as well
  F2FP.SATFINITE.E4M3        the E4M3 conversion of the scaled P / dS (cvt.rn.satfinite)
  no LDL / STL, LOCAL 0, STACK 0

Needs a Python with nvidia-cutlass-dsl (JAX_MXFP8_BUILD_PYTHON, else this interpreter); skips otherwise.
Nothing here runs on a GPU: the helpers' values are checked against the contract by their XLA model
(tests/attention/test_attention_sm100_quant.py), not by executing this SASS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "build" / "sm100_attention_quant_probe.py"
ARCHS = ("sm_100a", "sm_100f", "sm_103a")


def _build_python() -> str:
    python = os.environ.get("JAX_MXFP8_BUILD_PYTHON", sys.executable)
    code = "import cutlass, nvidia"
    if subprocess.run([python, "-c", code], capture_output=True, timeout=300).returncode:
        pytest.skip(f"{python} cannot import cutlass (nvidia-cutlass-dsl): set JAX_MXFP8_BUILD_PYTHON to a build venv")
    return python


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    python = _build_python()
    out = tmp_path_factory.mktemp("sm100_probe")
    cmd = [python, str(PROBE), "--out", str(out)] + [a for arch in ARCHS for a in ("--arch", arch)]
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=600)
    return {arch: json.loads((out / f"{arch}.json").read_text()) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_probe_sass(reports, arch):
    rep = reports[arch]
    ops = rep["opcodes"]
    assert "CREDUX.MAXABS.F32.NAN" in ops, ops
    assert not [o for o in ops if o.startswith("CREDUX") and not o.endswith(".NAN")], ops  # no NaN-dropping form
    assert any(o.startswith("FMNMX.NAN") for o in ops), ops
    assert any(o.startswith("F2FP.SATFINITE.E4M3") for o in ops), ops
    assert not [o for o in ops if o.startswith(("LDL", "STL"))], ops
    assert rep["usage"].get("LOCAL") == 0 and rep["usage"].get("STACK") == 0, rep["usage"]
    # one warp reduction per square block (the probe quantizes one block per warp), one F2FP per 2 elements
    # for each of the three quantizations of a 32-element row
    assert rep["sass"].count("CREDUX") == 1
    assert rep["sass"].count("F2FP.SATFINITE.E4M3") == 3 * 32 // 2
