"""The Blackwell attention kernels' TMEM maps (jax_mxfp8/kernels/sm100/attention_tmem.py): every region fits the
512 columns and no two live regions overlap, over three unrolled iterations of each kernel's schedule; and the
pairs that are safe only because tcgen05.mma executes in issue order across accumulators (the assumption
FlashAttention-4 and LP-FA4 make) are exactly the ones the design note lists."""

from __future__ import annotations

import dataclasses

import pytest

from jax_mxfp8.kernels.sm100 import attention_tmem as tm

# (region kind, region kind) pairs whose safety rests on in-order MMA execution: a later MMA's accumulator
# write over columns an earlier MMA reads (its TMEM A operand or scale factors)
IN_ORDER_PAIRS = {
    ("forward", 64): set(),
    ("forward", 128): {("P_0", "S_0"), ("SF_PV_0", "S_0"), ("P_1", "S_1"), ("SF_PV_1", "S_1")},
    ("backward", 64): {("P^T", "S^T")},
    ("backward", 128): {("P^T", "S^T"), ("SF_dV", "S^T"), ("dS^T", "dQ"), ("SF_dK", "dQ")},
}
MAPS = {"forward": tm.forward_map, "backward": tm.backward_map}


def _kind(name: str) -> str:
    return name.split("@")[0]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kernel", ["forward", "backward"])
def test_map_is_safe(kernel, head_dim):
    m = MAPS[kernel](head_dim)
    m.check()  # fits [0, 512), known events, no overlap of live regions (with the in-order assumption)
    assert max(r.stop for r in m.regions) <= tm.TMEM_COLS
    kinds = {_kind(r.name) for r in m.regions}
    want = {
        "forward": {"S_0", "S_1", "P_0", "P_1", "O_0", "O_1", "SF_QK_0", "SF_QK_1", "SF_PV_0", "SF_PV_1"},
        "backward": {"S^T", "P^T", "dP^T", "dS^T", "dQ", "dV", "dK", "SF_S", "SF_dP", "SF_dV", "SF_dK", "SF_dQ"},
    }
    assert kinds == want[kernel]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kernel", ["forward", "backward"])
def test_in_order_dependencies_are_the_documented_ones(kernel, head_dim):
    pairs = {tuple(sorted((_kind(a), _kind(b)))) for a, b in MAPS[kernel](head_dim).conflicts(assume_in_order=False)}
    assert pairs == {tuple(sorted(p)) for p in IN_ORDER_PAIRS[(kernel, head_dim)]}


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kernel", ["forward", "backward"])
def test_as_the_kernels_common_tmem_map(kernel, head_dim):
    """One linearization of the order, declared as kernels/sm100/tmem_map.TmemMap: its checker agrees and the
    kernel allocates all 512 columns."""
    common = MAPS[kernel](head_dim).as_tmem_map().check()
    assert common.alloc_columns == 512
    assert "| S" in common.table()


def test_accumulators_fill_the_columns_at_head_dim_128():
    fwd = {_kind(r.name): (r.start, r.stop) for r in tm.forward_map(128).regions}
    assert [fwd[k] for k in ("S_0", "S_1", "O_0", "O_1")] == [(0, 128), (128, 256), (256, 384), (384, 512)]
    bwd = {_kind(r.name): (r.start, r.stop) for r in tm.backward_map(128).regions}
    assert [bwd[k] for k in ("S^T", "dV", "dP^T", "dK")] == [(0, 128), (128, 256), (256, 384), (384, 512)]
    assert bwd["dQ"] == bwd["dP^T"]


def _moved(m: tm.OrderedTmemMap, kind: str, start: int) -> tm.TmemMap:
    regions = tuple(dataclasses.replace(r, start=start) if _kind(r.name) == kind else r for r in m.regions)
    return dataclasses.replace(m, regions=regions)


@pytest.mark.parametrize(
    ("kernel", "kind", "start"),
    [
        ("forward", "SF_QK_0", 96),  # into its own S_0, which QK_0 writes while reading them
        ("forward", "SF_PV_0", 256),  # into O_0, the accumulator PV_0 adds to
        ("backward", "SF_dQ", 256 + 64),  # into dQ's own region
        ("backward", "SF_S", 64),  # into S^T's own region
    ],
)
def test_checker_catches_a_bad_placement(kernel, kind, start):
    m = _moved(MAPS[kernel](128), kind, start)
    assert m.conflicts(assume_in_order=True)
    with pytest.raises(ValueError, match="overlapping"):
        m.check()


def test_checker_catches_a_missing_wait():
    """Without the MMA warp's wait for S_1 drained, QK_0's scales in S_1's tail may be overwritten early."""
    m = tm.forward_map(128)
    edges = frozenset(e for e in m.edges if not (e[0].startswith("s_drained1@") and e[1].startswith("cp_qk0@")))
    assert dataclasses.replace(m, edges=edges).conflicts(assume_in_order=True)


def test_rejects_other_head_dims():
    with pytest.raises(ValueError, match="head_dim"):
        tm.forward_map(96)
