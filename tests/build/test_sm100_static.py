"""Static verification of the Blackwell MX GEMM (tools/check_sm100.py) and its committed resource table.

No Blackwell GPU exists on these machines: the kernels are compiled for sm_100f and their cubins checked
(UTCQMMA with TMEM scale operands, UTCCP at the TMEM map's columns, no local memory, registers, shared
memory, TMEM allocation vs the declared map). The fast tests read the committed table
docs/perf/blackwell_gemm_variants.md: every variant listed with resources that agree with its config, and
predictions that agree with kernels/sm100/perf_model.py; the slow test checks every variant (needs
nvidia-cutlass-dsl 4.8.1 in this Python or JAX_MXFP8_BUILD_PYTHON, and cuobjdump; skipped without them) and
regenerates the table, which must equal the committed one. Where the library build has run
(tools/build_library.py: build/kernels/sm_100f/dump, or JAX_MXFP8_KERNEL_DUMP) it checks those cubins -- every
sm_100f variant of the registry, GEMM or not (--all) -- and compiles only the comparison schedule the
production build leaves out (about 10 s); otherwise it compiles every GEMM variant (about a minute on 2 cores).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from jax_mxfp8.kernels.registry.gemm_sm100 import MX_GEMM_SM100_VARIANTS, SMEM_LIMIT, THREADS
from jax_mxfp8.kernels.sm100 import perf_model
from tests.build.sm100_static_testutil import build_python, dump_arguments

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "perf" / "blackwell_gemm_variants.md"
TOOL = ROOT / "tools" / "check_sm100.py"
sys.path.insert(0, str(ROOT / "tools"))

from check_sm100 import TABLE_SHAPE  # noqa: E402


def _rows() -> dict[str, list[str]]:
    """variant name -> the cells of its row in the committed variant table."""
    rows = {}
    for line in TABLE.read_text().split("## Shapes")[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0].startswith("mx_gemm_sm100_"):
            rows[cells[0]] = cells
    return rows


def test_table_lists_every_variant_with_its_resources():
    rows = _rows()
    assert set(rows) == {v.name for v in MX_GEMM_SM100_VARIANTS}
    for config in MX_GEMM_SM100_VARIANTS:
        _, ctas, epilogue, reg, smem, tmem, epi, *_ = rows[config.name]
        assert (int(ctas), epilogue) == (config.cta_group, config.epilogue)
        assert int(reg) <= 255 and int(reg) * THREADS <= 65536
        assert config.smem_bytes <= int(smem) <= SMEM_LIMIT  # + the DSL's static shared memory
        m = config.tmem_map()
        assert tmem == f"{m.used_columns} of {m.alloc_columns}" and m.alloc_columns <= 512
        assert int(epi) > 0


@pytest.mark.parametrize("gpu", [perf_model.B200, perf_model.GB300], ids=lambda g: g.name)
def test_table_predictions_follow_the_model(gpu):
    """The committed predictions are the model's for the committed instruction counts."""
    column = 7 if gpu is perf_model.B200 else 8
    for config in MX_GEMM_SM100_VARIANTS:
        cells = _rows()[config.name]
        pred = perf_model.predict(config, TABLE_SHAPE, gpu, int(cells[6]))
        assert cells[column] == f"{pred.tflops:.0f} ({pred.bound})"


def test_model_never_beats_the_published_peak_and_reaches_it_when_only_the_mma_bounds():
    plain = next(v for v in MX_GEMM_SM100_VARIANTS if v.name == "mx_gemm_sm100_2cta_e4m3_e4m3_bf16")
    for gpu in (perf_model.B200, perf_model.GB300):
        for shape in ((1, 8192, 8192, 8192), (1, 128, 128, 128), (4, 1000, 3000, 640)):
            for l2 in (32, 64, 1e9):
                assert perf_model.predict(plain, shape, gpu, 150, l2).tflops < gpu.fp8_dense_tflops
    # unlimited L2 fill: MMA-bound at the published rate, less the launch and the grid's quantization
    big = perf_model.predict(plain, (1, 16384, 16384, 16384), perf_model.B200, 150, 1e9)
    assert big.bound == "mma" and big.tflops > 0.9 * perf_model.B200.fp8_dense_tflops


def test_model_sees_the_epilogue_when_k_is_short():
    """Two orientations + GELU cost more than a 1024-deep mainloop of a 128 x 128 tile, less than 8192."""
    cfg = next(v for v in MX_GEMM_SM100_VARIANTS if v.name == "mx_gemm_sm100_2cta_e4m3_e4m3_mxrowcol_bias_gelu_prebf16")
    epi = int(_rows()[cfg.name][6])
    assert perf_model.predict(cfg, (1, 16384, 8192, 1024), perf_model.B200, epi).bound == "epilogue"
    assert perf_model.predict(cfg, (1, 16384, 8192, 8192), perf_model.B200, epi).bound != "epilogue"


@pytest.mark.slow
def test_every_variant_compiles_and_passes_the_static_checks(tmp_path):
    python = build_python()
    if python is None:
        pytest.skip("nvidia-cutlass-dsl not importable (set JAX_MXFP8_BUILD_PYTHON to a build venv's python)")
    dump, extra = dump_arguments(tmp_path, [v.name for v in MX_GEMM_SM100_VARIANTS if v.tune == 0])
    extra += ["--all"] if extra else []  # the build's other sm_100f variants too: the checks common to every kernel
    cmd = [python, str(TOOL), "--dump", str(dump), "--python", python, "--check-table", str(TABLE), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if "cuobjdump not found" in out.stderr:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert re.search(rf"{len(MX_GEMM_SM100_VARIANTS)} variants checked, 0 with problems", out.stdout)
