"""Static verification of the Blackwell attention backward and its pre-pass (tools/check_sm100_attention_bwd.py).

No Blackwell GPU exists on these machines: every variant is compiled for sm_100f and its cubin checked
(UTCQMMA with TMEM scale operands, A from TMEM for dV and dK, UTCCP at the TMEM map's scale slots,
CREDUX.MAXABS.F32.NAN for the dS blocks, no local memory, the setmaxnreg budget, shared memory from the
storage struct, the TMEM allocation and layouts against the declared map, the dQ mode's instructions), and
the regenerated resource table must equal the committed one (its forward + backward predictions from the
forward variants compiled alongside). Slow: about three minutes on 2 cores (seconds where the library build
has run: its cubins are checked, tests/build/sm100_static_testutil.py); needs
nvidia-cutlass-dsl 4.8.1 and cuobjdump (skipped without them).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from jax_mxfp8.kernels.sm100.attention_bwd_config import ATTENTION_BWD_PREPASS_VARIANTS, ATTENTION_BWD_SM100_VARIANTS
from tests.build.sm100_static_testutil import build_python, dump_arguments

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "perf" / "blackwell_attention_bwd_variants.md"
TOOL = ROOT / "tools" / "check_sm100_attention_bwd.py"


@pytest.mark.slow
def test_every_variant_compiles_and_passes_the_static_checks(tmp_path):
    python = build_python()
    if python is None:
        pytest.skip("nvidia-cutlass-dsl not importable (set JAX_MXFP8_BUILD_PYTHON to a build venv's python)")
    names = [v.name for v in (*ATTENTION_BWD_SM100_VARIANTS, *ATTENTION_BWD_PREPASS_VARIANTS) if v.tune == 0]
    dump, extra = dump_arguments(tmp_path, names)
    cmd = [python, str(TOOL), "--dump", str(dump), "--python", python, "--check-table", str(TABLE), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if "cuobjdump not found" in out.stderr:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    total = len(ATTENTION_BWD_SM100_VARIANTS) + len(ATTENTION_BWD_PREPASS_VARIANTS)
    assert re.search(rf"{total} variants checked, 0 with problems", out.stdout)
