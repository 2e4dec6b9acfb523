"""AttentionBwdConfig (kernels/registry/attention_bwd.py): validation, names, lookup. CPU only, no DSL."""

from __future__ import annotations

import dataclasses

import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.kernels.registry.attention_bwd import (
    BF16_SCHEDULE,
    BLOCK_P,
    BROADCAST_Q,
    COMPARISONS,
    DQ_MODES,
    PACKED,
    PREVIOUS,
    PRODUCTION,
    AttentionBwdConfig,
    comparison_fields,
)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(head_dim=96), "head_dim"),
        (dict(p_scale="block", p_scaled=True), "p_scale"),  # block: P's own scales (registry BLOCK_P)
        (dict(p_scale="nope"), "p_scale"),
        (dict(p_rounding="floor"), "p_rounding"),
        (dict(dq_accum="bf16"), "dq_accum"),
        (dict(dq_accum="fp16", dq_store="tma_warp"), "dq_store"),  # the dQ modes take per-element adds
        (dict(deterministic=True, dq_store="tma_writer"), "dq_store"),
        (dict(broadcast_q=True, dq_store="tma_warp"), "dq_store"),  # a TMA map cannot take the rebased dq
        (dict(deterministic=1, dq_store="red"), "deterministic"),
        (dict(packed=True, sdp_fp8=True, p_scaled=True, dv_f16=True), "packed"),  # one dO shift per KV head
        (dict(packed=True, dq_accum="fp16", dq_store="red"), "packed"),
        (dict(dq_store="tmem"), "dq_store"),
        (dict(dq_store="bulk"), "dq_store"),  # measured and removed (docs/perf/removed-variants.md)
        (dict(dq_first=1), "dq_first"),
        (dict(q_stage=0), "q_stage"),
        (dict(smem_stats=1), "smem_stats"),
        (dict(stats_early=True), "stats_early"),  # needs smem_stats
        (dict(amax_reduce="vote"), "amax_reduce"),
        (dict(dq_red_width=4, dq_store="red"), "dq_red_width"),
        (dict(dq_red_width=2, dq_store="tma_warp"), "dq_red_width"),
        (dict(sdp_fp8=1), "sdp_fp8"),
        (dict(sdp_fp8=True, dq_accum="fp16", dq_store="red"), "sdp_fp8"),  # fp32, non-deterministic only
        (dict(sdp_fp8=True, broadcast_q=True, dq_store="red"), "sdp_fp8"),
        (dict(dv_f16=1), "dv_f16"),
        (dict(dv_f16=True, sdp_fp8=True), "dv_f16"),  # needs p_scaled as well
        (dict(dv_f16=True, p_scaled=True), "dv_f16"),  # and sdp_fp8
        (dict(factors_ahead=1), "factors_ahead"),
        (dict(factors_ahead=True), "factors_ahead"),  # needs sdp_fp8
    ],
)
def test_bad_fields_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AttentionBwdConfig(**kwargs)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_production_lookup(head_dim, causal):
    v = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal)
    assert v is not None and v.tune == 0
    # TMA dQ reduce-adds (H128: issued by the producer's writer warp), dQ under the dK wgmma, LSE / delta
    # through shared memory, FP8 S^T and dP^T, dK's A operand from shared memory, P in 2^8 units, dV on
    # float16 wgmma; at H128 the query-block factors a step ahead
    assert v.dq_store == ("tma_writer" if head_dim == 128 else "tma_warp")
    assert v.dq_first and v.smem_stats and v.amax_reduce == "redux" and v.sdp_fp8 and v.dk_ss and v.p_scaled
    assert v.dv_f16 and v.factors_ahead == (head_dim == 128)
    assert v.name == f"attention_bwd_h{head_dim}{'_causal' if causal else ''}"
    assert v.key == dict(
        head_dim=head_dim, causal=int(causal), p_scale=0, p_rounding=0, dq_accum=0, deterministic=0, packed=0,
        broadcast_q=0, tune=0, sdp_fp8=1, dv_f16=1,
    )  # fmt: skip
    # the PREVIOUS comparison (tune 25 at H128, 24 at H64): the same config without dv_f16 (and factors_ahead);
    # the handler reads dv_f16 (do's dtype) and sdp_fp8 (the FP8 operands) from the table
    prev_tune = {128: 25, 64: 24}[head_dim]
    prev = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=prev_tune)
    assert not prev.dv_f16 and prev.key["dv_f16"] == 0
    assert dataclasses.replace(prev, dv_f16=True, factors_ahead=v.factors_ahead, tune=0) == v
    # tune 17: production's dQ store and stats path on BF16 wgmma only
    t17 = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=17)
    assert not t17.sdp_fp8 and t17.key["sdp_fp8"] == 0 and t17.dq_store == "tma_warp" and t17.dq_first
    # broadcast_query_attention's variant: BROADCAST_Q's schedule (per-element dQ reductions: the TMA dQ
    # store cannot take broadcast_q's rebased dq address) with the Q coordinate at batch 0
    bq = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, broadcast_q=True)
    want = AttentionBwdConfig(head_dim=head_dim, causal=causal, broadcast_q=True, **BROADCAST_Q[head_dim])
    assert bq.name == v.name + "_bcastq" and bq == want
    with pytest.raises(ValueError, match="broadcast_q"):
        dataclasses.replace(v, broadcast_q=True)


def test_uncovered_arguments_find_nothing():
    assert registry.find(registry.AttentionBwdConfig, head_dim=128, packed=True, dq_accum="fp16") is None
    assert registry.find(registry.AttentionBwdConfig, head_dim=128, p_scale="block", p_rounding="floor") is None
    assert registry.find(registry.AttentionBwdConfig, head_dim=128, dq_accum="fp16", tune=17) is None


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_dq_mode_variants(head_dim, causal):
    """dq_accum "fp16" and deterministic ("fp32", "fp16") are registered for each head_dim x causal, tune 0
    of their own key, per-element adds (kernels/sm90/attention_bwd_dq.py)."""
    base = f"attention_bwd_h{head_dim}{'_causal' if causal else ''}"
    for fields, suffix in (
        (dict(dq_accum="fp16"), "_fp16"),
        (dict(deterministic=True), "_det"),
        (dict(dq_accum="fp16", deterministic=True), "_fp16_det"),
    ):
        v = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, **fields)
        assert v is not None and v.name == base + suffix and v.dq_mode and v.dq_store == "red" and v.tune == 0
        assert v.key["dq_accum"] == (1 if "fp16" in suffix else 0) and v.key["deterministic"] == ("det" in suffix)
    assert not registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal).dq_mode


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_two_comparison_schedules(head_dim, causal):
    """Production plus exactly two comparison schedules per head_dim x causal (tune 17: every GEMM on BF16
    wgmma; PREVIOUS: production without dv_f16 / factors_ahead), each its own config; no other tune."""
    prod = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal)
    assert prod == AttentionBwdConfig(head_dim=head_dim, causal=causal, **PRODUCTION[head_dim])
    assert len(COMPARISONS[head_dim]) == 2
    assert COMPARISONS[head_dim][17] == BF16_SCHEDULE and PREVIOUS[head_dim] in COMPARISONS[head_dim].values()
    for tune in COMPARISONS[head_dim]:
        v = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=tune)
        want = AttentionBwdConfig(head_dim=head_dim, causal=causal, tune=tune, **comparison_fields(tune, head_dim))
        assert v == want and v.name == f"{prod.name}_t{tune}" and dataclasses.replace(v, tune=0) != prod
    variants = registry.ATTENTION_BWD_VARIANTS
    tunes = [v.tune for v in variants if (v.head_dim, v.causal) == (head_dim, causal) and v.tune]
    assert sorted(tunes) == sorted(COMPARISONS[head_dim])
    assert comparison_fields(1, head_dim) is None and comparison_fields(0, head_dim) == PRODUCTION[head_dim]


def test_feature_variants_keep_their_measured_schedules():
    """dQ modes: plain per-element adds; broadcast_q: per-element adds (v2 with the smem stats at H128); block
    P: production's schedule without p_scaled; packed: the PREVIOUS schedule."""
    for h in (64, 128):
        for mode in DQ_MODES:
            v = registry.find(registry.AttentionBwdConfig, head_dim=h, **mode)
            assert v == AttentionBwdConfig(head_dim=h, dq_store="red", **mode)
        block = registry.find(registry.AttentionBwdConfig, head_dim=h, p_scale="block")
        assert block == AttentionBwdConfig(head_dim=h, p_scale="block", **BLOCK_P[h])
        assert PACKED[h] == PREVIOUS[h] and BLOCK_P[h] == dict(BF16_SCHEDULE, sdp_fp8=True, dk_ss=True)
    stats = dict(smem_stats=True, amax_reduce="redux", stats_early=True)
    assert BROADCAST_Q == {128: dict(stats, dq_store="red", dq_red_width=2), 64: dict(dq_store="red")}


def test_variant_names_unique():
    assert len({v.name for v in registry.ATTENTION_BWD_VARIANTS}) == len(registry.ATTENTION_BWD_VARIANTS)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_packed_variants(head_dim, causal):
    """varlen_attention's packed backward: the PREVIOUS comparison's config (tune 25 / 24: no dv_f16, whose dO
    shift per KV head would span every sequence) with packed=True, named *_packed."""
    v = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, packed=True)
    prev_tune = {128: 25, 64: 24}[head_dim]
    prev = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=prev_tune)
    assert v.tune == 0 and v.packed and not v.dv_f16 and v.sdp_fp8
    assert dataclasses.replace(prev, packed=True, tune=0) == v
    assert v.name == f"attention_bwd_h{head_dim}{'_causal' if causal else ''}_packed" and v.key["packed"] == 1
