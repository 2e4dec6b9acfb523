"""The Blackwell attention backward's configuration, resource table and performance model (pure Python: no
DSL, no GPU; the kernels themselves are compiled and checked by tests/build/test_sm100_attention_bwd_static.py).

The committed table docs/perf/blackwell_attention_bwd_variants.md must list every variant with resources
that agree with its config and predictions that are the model's; the model must reproduce its two
calibration anchors through its prediction path and never exceed the FP8 peak.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from jax_mxfp8.kernels.sm100 import attention_bwd_perf_model as pm
from jax_mxfp8.kernels.sm100 import attention_fwd_perf_model as fwd_model
from jax_mxfp8.kernels.sm100.attention_bwd_config import (
    ATTENTION_BWD_PREPASS_VARIANTS,
    ATTENTION_BWD_SM100_VARIANTS,
    REGISTERS,
    AttentionBwdPrepassConfig,
    AttentionBwdSm100Config,
    sf_slot,
    tmem_columns,
)
from jax_mxfp8.kernels.sm100.attention_geometry import REGISTER_FILE, SMEM_LIMIT, THREADS
from jax_mxfp8.kernels.sm100.attention_tmem import backward_map
from jax_mxfp8.kernels.sm100.perf_model import B200, GB300

TABLE = Path(__file__).resolve().parents[2] / "docs" / "perf" / "blackwell_attention_bwd_variants.md"
FORWARD_TABLE = TABLE.parent / "blackwell_attention_fwd_variants.md"


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0].startswith("attention_bwd_"):
            rows[cells[0]] = cells
    return rows


def test_variants_are_valid_distinct_and_cover_the_feature_set():
    names = [v.name for v in ATTENTION_BWD_SM100_VARIANTS]
    assert len(names) == len(set(names))
    keys = {tuple(sorted(v.key.items())) for v in ATTENTION_BWD_SM100_VARIANTS}
    assert len(keys) == len(names)
    production = [v for v in ATTENTION_BWD_SM100_VARIANTS if v.tune == 0]
    for h in (64, 128):
        for causal in (False, True):
            mine = [v for v in production if v.head_dim == h and v.causal == causal]
            assert {(v.p_scale, v.dq_accum, v.deterministic, v.packed, v.dkv) for v in mine} == {
                ("const", "fp32", False, False, "float32"),
                ("block", "fp32", False, False, "float32"),
                ("const", "fp16", False, False, "float32"),
                ("const", "fp32", True, False, "float32"),
                ("const", "fp16", True, False, "float32"),
                ("const", "fp32", False, True, "float32"),
                ("const", "fp32", False, False, "mx"),
            }
    assert len([v for v in ATTENTION_BWD_SM100_VARIANTS if v.tune]) <= 2  # comparison schedules
    for v in ATTENTION_BWD_SM100_VARIANTS:
        assert v.smem_bytes <= SMEM_LIMIT
        assert len(v.tensor_names) in (17, 18, 23)  # the host function's arities


def test_register_budget_fills_the_register_file_exactly():
    budget = 128 * (REGISTERS["reduce"] + REGISTERS["other"]) + 256 * REGISTERS["compute"]
    assert budget == REGISTER_FILE and all(r % 8 == 0 for r in REGISTERS.values())
    assert REGISTER_FILE // THREADS == 128  # the launch allocation the setmaxnreg pool starts from


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(head_dim=96), "head_dim"),
        (dict(p_scale="row"), "p_scale"),
        (dict(dq_accum="bf16"), "dq_accum"),
        (dict(dkv="bfloat16"), "dkv"),
        (dict(deterministic=1), "deterministic"),
        (dict(packed=True, dq_accum="fp16"), "packed"),
        (dict(packed=True, dkv="mx"), "packed"),
        (dict(stages=4), "stages"),
    ],
)
def test_config_rejects_bad_fields_by_name(fields, field):
    with pytest.raises(ValueError, match=field):
        AttentionBwdSm100Config(**fields)
    with pytest.raises(ValueError, match="head_dim|in_dtype"):
        AttentionBwdPrepassConfig(head_dim=32)


def test_unsupported_problems_say_why():
    base = AttentionBwdSm100Config()
    assert base.unsupported(2, 1000, 900, 8, 2, 2) is None
    assert "multiple of K" in base.unsupported(2, 1000, 900, 8, 3, 2)
    assert "q's batch" in base.unsupported(2, 1000, 900, 8, 2, 3)
    assert base.unsupported(2, 1000, 900, 8, 2, 1) is None  # broadcast q: float32 dQ, any order
    assert "broadcast q" in AttentionBwdSm100Config(deterministic=True).unsupported(2, 1000, 900, 8, 2, 1)
    assert "multiple of 32" in AttentionBwdSm100Config(dkv="mx").unsupported(2, 1000, 900, 8, 2, 2)
    assert AttentionBwdSm100Config(dkv="mx").unsupported(2, 1000, 896, 8, 2, 2) is None
    assert "batch 1" in AttentionBwdSm100Config(packed=True).unsupported(2, 1000, 900, 8, 2, 2)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_kernel_columns_are_the_declared_maps(head_dim):
    """The kernel takes its TMEM columns from attention_tmem.backward_map, whose checker passes; the scale
    slots are 8 columns (SFA, SFB) inside the map's SF regions."""
    cols = tmem_columns(head_dim)
    m = backward_map(head_dim)
    m.check()
    for r in m.regions:
        assert cols[r.name.split("@")[0]] == r.start
    for gemm in ("S", "dP", "dV", "dK", "dQ"):
        sfa, sfb = sf_slot(head_dim, gemm)
        assert (sfa, sfb) == (cols[f"SF_{gemm}"], cols[f"SF_{gemm}"] + 4)
    assert AttentionBwdSm100Config(head_dim=head_dim).tmem_map().alloc_columns == 512


def test_table_lists_every_variant_with_its_resources():
    rows = _rows()
    assert set(rows) == {v.name for v in (*ATTENTION_BWD_SM100_VARIANTS, *ATTENTION_BWD_PREPASS_VARIANTS)}
    for v in ATTENTION_BWD_SM100_VARIANTS:
        _, reg, smem, tmem, sass, *_ = rows[v.name]
        assert int(reg) * THREADS <= REGISTER_FILE
        assert v.smem_bytes <= int(smem) <= SMEM_LIMIT  # + the DSL's static shared memory
        m = v.tmem_map()
        assert tmem == f"{m.used_columns} of {m.alloc_columns}"
        assert int(sass) > 0
    for v in ATTENTION_BWD_PREPASS_VARIANTS:
        _, reg, smem, sass = rows[v.name]
        assert 0 < int(reg) <= 255 and int(smem) >= 0 and int(sass) > 0


def _forward_instructions(name: str) -> tuple[int, int]:
    """(unmasked, masked) softmax instructions per tile of a forward variant, from the committed forward table."""
    for line in FORWARD_TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == name:
            return tuple(map(int, re.fullmatch(r"(\d+) \((\d+)\)", cells[4]).groups()))
    raise KeyError(name)


@pytest.mark.parametrize("column, gpu", [(5, B200), (6, GB300)], ids=["B200", "GB300"])
def test_table_predictions_follow_the_model(column, gpu):
    """backward / forward + backward, the forward term from the built forward's model at the forward
    variant's committed instruction counts."""
    for v in ATTENTION_BWD_SM100_VARIANTS:
        shape = pm.table_shape(v)
        train = pm.predict_train(v, shape, gpu, _forward_instructions(pm.forward_config(v).name))
        assert _rows()[v.name][column] == f"{pm.predict_bwd(v, shape, gpu):.0f} / {train:.0f}"


def test_forward_term_is_the_forward_model():
    """fwd + bwd = both FLOPs over both times: 3.5 / (1 / fwd + 2.5 / bwd) with the forward model's fwd."""
    v = AttentionBwdSm100Config(causal=True, p_scale="block")
    shape, instructions = pm.table_shape(v), (600, 900)
    fwd = fwd_model.predict_fwd(pm.forward_config(v), shape, GB300, instructions).tflops
    bwd = pm.predict_bwd(v, shape, GB300)
    assert pm.predict_train(v, shape, GB300, instructions) == pytest.approx(3.5 / (1 / fwd + 2.5 / bwd), rel=1e-12)
    assert pm.forward_config(v).name == "attention_fwd_sm100_h128_causal_pblock"


def test_model_reproduces_its_anchors_and_stays_below_peak():
    """LP-FA4's MHA non-causal H128 backward on GB300 (1.82 / 1.98 PFLOP/s, float32 / float16 dQ) through the
    prediction path (units, clocks, FLOPs), not the calibration's closed form."""
    p = (16, 16, 4, (8192,) * 4)
    for dq, anchor in pm.ANCHOR_GB300_BWD_TFLOPS.items():
        got = pm.predict_bwd(AttentionBwdSm100Config(dq_accum=dq), p, GB300)
        assert got == pytest.approx(anchor, rel=1e-9)
    for v in ATTENTION_BWD_SM100_VARIANTS:
        for gpu in (B200, GB300):
            prob = pm.table_shape(v)
            assert 0 < pm.predict_bwd(v, prob, gpu) < gpu.fp8_dense_tflops
            assert 0 < pm.predict_train(v, prob, gpu, (537, 795)) < gpu.fp8_dense_tflops
            nondet = dataclasses.replace(v, deterministic=False, tune=0)
            assert pm.predict_bwd(v, prob, gpu) <= pm.predict_bwd(nondet, prob, gpu)
    # float16 dQ moves half the reduction bytes: never slower
    assert pm.predict_bwd(AttentionBwdSm100Config(dq_accum="fp16"), p, B200) > pm.predict_bwd(
        AttentionBwdSm100Config(), p, B200
    )


def test_prepass_variants():
    names = [v.name for v in ATTENTION_BWD_PREPASS_VARIANTS]
    assert len(names) == len(set(names)) == 8
    for v in ATTENTION_BWD_PREPASS_VARIANTS:
        tables = ("seqs", "query_tiles") if v.packed else ("lens",)
        assert v.tensor_names == ("do", "o", "dlse", *tables, "do_q", "do_sf_hd", "do_sf_seq", "delta")


def test_backward_operands_follow_the_packed_encoding():
    """The packed variants take the sequence table and the key-tile list of the one host function
    (primitives/attention_sm100_packed.packed_tables) in the dense variants' lens place."""
    for v in ATTENTION_BWD_SM100_VARIANTS:
        i = v.tensor_names.index("delta") + 1
        assert v.tensor_names[i : i + (2 if v.packed else 1)] == (("seqs", "key_tiles") if v.packed else ("lens",))
