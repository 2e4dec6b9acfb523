"""TMEM maps of the Blackwell kernels (kernels/sm100/tmem_map.py), on CPU without the DSL.

The checker finds overlapping regions that are live in a common phase, accepts overlaps across disjoint
phases (aliasing), rejects maps over 512 columns, unknown phases and duplicate names; every sm100 GEMM
variant's declared map passes and holds what its mainloop and epilogue need.
"""

from __future__ import annotations

import pytest

from jax_mxfp8.kernels.registry.gemm_sm100 import K_TILE, MMA_K, MX_GEMM_SM100_VARIANTS
from jax_mxfp8.kernels.sm100.tmem_map import MAX_COLUMNS, TmemMap, region

PHASES = ("mma", "softmax", "epilogue")


def _map(*regions):
    return TmemMap("test", PHASES, tuple(regions))


def test_disjoint_regions_pass():
    m = _map(region("a", 0, 128, "mma"), region("b", 128, 128, "mma", "epilogue"))
    assert m.problems() == [] and m.alloc_columns == 256 and m.check() is m


def test_overlap_in_a_shared_phase_is_found():
    m = _map(region("s", 0, 128, "mma", "softmax"), region("p", 96, 64, "softmax"))
    (problem,) = m.problems()
    assert "s [0, 128)" in problem and "p [96, 160)" in problem and "softmax" in problem
    with pytest.raises(ValueError, match="overlap"):
        m.check()


def test_overlap_across_disjoint_phases_is_an_alias():
    """P written over S once S is consumed (different phases) is allowed."""
    m = _map(region("s", 0, 128, "mma"), region("p", 32, 64, "softmax"))
    assert m.problems() == []


def test_over_512_columns_and_allocation_rounding():
    assert _map(region("a", 0, 288, "mma")).alloc_columns == 512
    assert _map(region("a", 0, 20, "mma")).alloc_columns == 32
    big = _map(region("a", 0, MAX_COLUMNS, "mma"), region("b", MAX_COLUMNS, 16, "epilogue"))
    assert any("> 512" in p for p in big.problems())


def test_bad_declarations_are_found():
    problems = _map(region("a", 0, 32, "nope"), region("a", 32, 0, "mma"), region("c", 64, 8)).problems()
    text = " | ".join(problems)
    assert "used twice" in text and "'nope'" in text and "cols > 0" in text and "phases []" in text


@pytest.mark.parametrize("config", MX_GEMM_SM100_VARIANTS, ids=lambda v: v.name)
def test_every_gemm_variant_map_is_sound(config):
    m = config.tmem_map()
    assert m.problems() == []
    assert m.alloc_columns <= MAX_COLUMNS
    accs = [m.region(f"acc{s}") for s in range(config.acc_stages)]
    assert all(r.cols == config.tile_n and r.phases == {"mma", "epilogue"} for r in accs)
    # scales of one 128-K tile (4 MMAs) for 128 rows: 4 columns each, after the two accumulators
    # (tools/check_sm100.py compares these with the DSL's TMEM layouts of the compiled kernel)
    assert K_TILE // MMA_K == 4 and m.region("sfa").cols == 4 and m.region("sfb").cols == 4
    assert m.region("sfa").start == config.acc_stages * config.tile_n
