"""AttentionBwdConfig (kernels/registry/attention_bwd.py): validation, names, lookup. CPU only, no DSL."""

from __future__ import annotations

import dataclasses

import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.kernels.registry.attention_bwd import (
    BROADCAST_Q,
    PRODUCTION,
    TUNINGS,
    AttentionBwdConfig,
    tuning_fields,
)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(head_dim=96), "head_dim"),
        (dict(p_scale="block", p_scaled=True), "p_scale"),  # block: P's own scales (registry BLOCK_P)
        (dict(p_scale="nope"), "p_scale"),
        (dict(p_rounding="floor"), "p_rounding"),
        (dict(dq_accum="bf16"), "dq_accum"),
        (dict(dq_accum="fp16"), "dq_store"),  # the dQ modes take per-element adds
        (dict(deterministic=True), "dq_store"),
        (dict(deterministic=1, dq_store="red"), "deterministic"),
        (dict(packed=True, sdp_fp8=True, p_scaled=True, dv_f16=True), "packed"),  # one dO shift per KV head
        (dict(packed=True, dq_accum="fp16", dq_store="red"), "packed"),
        (dict(dq_store="tmem"), "dq_store"),
        (dict(dq_store="tma", overlap=1), "overlap"),  # the TMA dQ stores: overlap 0; "tma": dq_keys "cta"
        (dict(dq_store="tma", dq_keys="own", head_dim=64), "dq_keys"),
        (dict(dq_first=1), "dq_first"),
        (dict(dq_first=True, overlap=1), "dq_first"),
        (dict(overlap=3), "overlap"),
        (dict(overlap=1, dq_store="red"), "overlap"),
        (dict(q_stage=0), "q_stage"),
        (dict(smem_stats=1), "smem_stats"),
        (dict(amax_reduce="vote"), "amax_reduce"),
        (dict(dq_keys="half"), "dq_keys"),
        (dict(dq_red_width=3, dq_store="red"), "dq_red_width"),
        (dict(dq_red_width=2), "dq_red_width"),
        (dict(dq_keys="own", overlap=1), "dq_keys"),
        (dict(dq_keys="own", head_dim=128), "dq_keys"),
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
    assert v is not None and v.tune == 0 and v.overlap == 0
    # tune 17's config at both head dims (session 5): TMA dQ reduce-add per warp, dQ under the dK wgmma; since
    # session 8 S^T and dP^T on FP8 wgmma (sdp_fp8, tune 19's measurements); since session 9 dK's A operand
    # from shared memory and P computed in 2^8 units (dk_ss, p_scaled: tune 24's)
    # and at H128 the dQ writer warp (dq_store "tma_writer", tune 25's)
    assert v.dq_store == ("tma_writer" if head_dim == 128 else "tma_warp")
    assert v.dq_first and v.smem_stats and v.amax_reduce == "redux" and v.sdp_fp8 and v.dk_ss and v.p_scaled
    assert v.dv_f16 and v.factors_ahead == (head_dim == 128)  # session 10
    assert v.name == f"attention_bwd_h{head_dim}{'_causal' if causal else ''}"
    assert v.key == dict(
        head_dim=head_dim, causal=int(causal), p_scale=0, p_rounding=0, dq_accum=0, deterministic=0, packed=0,
        broadcast_q=0, tune=0, sdp_fp8=1, dv_f16=1,
    )  # fmt: skip
    # dV on float16 wgmma since session 10 (the handler reads dv_f16 from the table: do's dtype); the session 9
    # production is tune 25 (H128) / 24 (H64): the same config without it
    s9_tune = {128: 25, 64: 24}[head_dim]
    base = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=s9_tune)
    assert not base.dv_f16 and base.key["dv_f16"] == 0
    assert dataclasses.replace(base, dv_f16=True, factors_ahead=v.factors_ahead, tune=0) == v
    # tune 17: the same schedule on BF16 wgmma only; tune 19: the session 8 production (its sdp_fp8 form);
    # the handler reads sdp_fp8 from the table
    t17 = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=17)
    assert not t17.sdp_fp8 and t17.key["sdp_fp8"] == 0 and t17.dq_store == "tma_warp" and t17.dq_first
    t19 = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=19)
    assert t19.sdp_fp8 and t19.key["sdp_fp8"] == 1 and not t19.dk_ss and not t19.p_scaled
    # tune 28 (27 at H64) is production's config there, so it is not registered; 24, 25 are at both head dims
    prod_tune = 28 if head_dim == 128 else 27
    assert registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=prod_tune) is None
    for other in (24, 25):
        assert registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=other) is not None
    v1 = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=13)
    assert v1.dq_store == "bulk" and not v1.smem_stats  # the v1 production, kept as a tuning
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
    assert registry.find(registry.AttentionBwdConfig, head_dim=128, dq_accum="fp16", tune=1) is None


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
def test_tunings_registered_as_non_production(head_dim, causal):
    """Every tuning is registered for each head_dim x causal under its own tune (the GPU test and the
    benchmark loop over TUNINGS) unless tuning_fields leaves it out (another head dim only, or the same
    config as production); only tune 0 is what the production lookup finds."""
    prod = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal)
    assert prod == AttentionBwdConfig(head_dim=head_dim, causal=causal, **PRODUCTION[head_dim])
    registered = 0
    for tune, _ in TUNINGS:
        fields = tuning_fields(tune, head_dim)
        v = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=tune)
        if fields is None:
            assert v is None
            continue
        registered += 1
        assert v is not None and v.tune == tune
        assert all(getattr(v, k) == x for k, x in fields.items())
        assert (v.name == f"attention_bwd_h{head_dim}{'_causal' if causal else ''}") == (tune == 0)
        if tune != 0:
            assert dataclasses.replace(v, tune=0) != prod  # no tuning duplicates production
    assert registered >= len(TUNINGS) - 4  # tune 10 (H64 only); 26-29: one head dim each (28 / 27: production)
    assert registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=len(TUNINGS)) is None


def test_variant_names_unique():
    assert len({v.name for v in registry.ATTENTION_BWD_VARIANTS}) == len(registry.ATTENTION_BWD_VARIANTS)
    assert [t for t, _ in TUNINGS] == list(range(len(TUNINGS)))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_packed_variants(head_dim, causal):
    """varlen_attention's packed backward: the session 9 production's config (tune 25 / 24: no dv_f16, whose dO
    shift per KV head would span every sequence) with packed=True, named *_packed."""
    v = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, packed=True)
    s9 = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune={128: 25, 64: 24}[head_dim])
    assert v.tune == 0 and v.packed and not v.dv_f16 and v.sdp_fp8
    assert dataclasses.replace(s9, packed=True, tune=0) == v
    assert v.name == f"attention_bwd_h{head_dim}{'_causal' if causal else ''}_packed" and v.key["packed"] == 1
