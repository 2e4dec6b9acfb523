"""Static verification of the Blackwell attention forward (tools/check_sm100_attention_fwd.py) and its committed
resource table docs/perf/blackwell_attention_fwd_variants.md.

No Blackwell GPU exists on these machines: the kernels are compiled for sm_100f and their cubins checked
(UTCQMMA with TMEM scale operands at every issue site, UTCCP at the declared map's scale columns, no local
memory / stack / spills / subroutine calls, the setmaxnreg budgets of the warp roles, the storage struct's
shared memory, tcgen05.alloc vs the declared TMEM map). The fast tests read the committed table: every variant
listed with resources that agree with its config and predictions that agree with
kernels/sm100/attention_fwd_perf_model.py for the committed instruction counts; the slow test compiles every
variant (about two minutes on 2 cores; needs nvidia-cutlass-dsl 4.8.1 and cuobjdump, skipped without them)
and regenerates the table, which must equal the committed one. Where the library build has run it checks the
build's cubins (tests/build/sm100_static_testutil.py: about 10 s) instead of compiling them again.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from jax_mxfp8.kernels.sm100 import attention_fwd_perf_model as model
from jax_mxfp8.kernels.sm100.attention_fwd_config import ATTENTION_FWD_SM100_VARIANTS
from jax_mxfp8.kernels.sm100.attention_geometry import SMEM_LIMIT, THREADS
from tests.build.sm100_static_testutil import build_python, dump_arguments

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "perf" / "blackwell_attention_fwd_variants.md"
TOOL = ROOT / "tools" / "check_sm100_attention_fwd.py"


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0].startswith("attention_fwd_sm100_"):
            rows[cells[0]] = cells
    return rows


def test_table_lists_every_variant_with_its_resources():
    rows = _rows()
    assert set(rows) == {v.name for v in ATTENTION_FWD_SM100_VARIANTS}
    for config in ATTENTION_FWD_SM100_VARIANTS:
        _, reg, smem, tmem, softmax, *_ = rows[config.name]
        assert int(reg) * THREADS <= 65536
        assert config.smem_bytes <= int(smem) <= SMEM_LIMIT  # + the DSL's static shared memory
        m = config.tmem_map()
        assert tmem == f"{m.used_columns} of {m.alloc_columns}" and m.alloc_columns == 512
        unmasked, masked = map(int, re.fullmatch(r"(\d+) \((\d+)\)", softmax).groups())
        assert 0 < unmasked < masked


def test_table_predictions_follow_the_model():
    for config in ATTENTION_FWD_SM100_VARIANTS:
        cells = _rows()[config.name]
        instructions = tuple(map(int, re.fullmatch(r"(\d+) \((\d+)\)", cells[4]).groups()))
        for column, gpu in zip((5, 6), model.GPUS, strict=True):
            p = model.predict_fwd(config, model.table_shape(config), gpu, instructions)
            assert cells[column] == model.describe(p)


@pytest.mark.slow
def test_every_variant_compiles_and_passes_the_static_checks(tmp_path):
    python = build_python()
    if python is None:
        pytest.skip("nvidia-cutlass-dsl not importable (set JAX_MXFP8_BUILD_PYTHON to a build venv's python)")
    dump, extra = dump_arguments(tmp_path, [v.name for v in ATTENTION_FWD_SM100_VARIANTS])
    cmd = [python, str(TOOL), "--dump", str(dump), "--python", python, "--check-table", str(TABLE), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if "cuobjdump not found" in out.stderr:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert re.search(rf"{len(ATTENTION_FWD_SM100_VARIANTS)} variants checked, 0 with problems", out.stdout)
