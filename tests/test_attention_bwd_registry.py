"""AttentionBwdConfig (kernels/registry/attention_bwd.py): validation, names, lookup. CPU only, no DSL."""

from __future__ import annotations

import dataclasses

import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.kernels.registry.attention_bwd import TUNINGS, AttentionBwdConfig


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(head_dim=96), "head_dim"),
        (dict(p_scale="block"), "p_scale"),
        (dict(p_scale="nope"), "p_scale"),
        (dict(p_rounding="floor"), "p_rounding"),
        (dict(dq_accum="fp16"), "dq_accum"),
        (dict(deterministic=True), "deterministic"),
        (dict(packed=True), "packed"),
        (dict(dq_store="tma"), "dq_store"),
        (dict(overlap=3), "overlap"),
        (dict(overlap=1, dq_store="red"), "overlap"),
        (dict(q_stage=0), "q_stage"),
        (dict(smem_stats=1), "smem_stats"),
    ],
)
def test_bad_fields_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AttentionBwdConfig(**kwargs)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_production_lookup(head_dim, causal):
    v = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal)
    assert v is not None and v.tune == 0 and v.dq_store == "bulk" and v.overlap == 0
    assert v.name == f"attention_bwd_h{head_dim}{'_causal' if causal else ''}"
    assert v.key == dict(
        head_dim=head_dim, causal=int(causal), p_scale=0, p_rounding=0, dq_accum=0, deterministic=0, packed=0,
        broadcast_q=0, tune=0,
    )  # fmt: skip
    assert registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=1).dq_store == "red"
    # broadcast_query_attention's variant: the production schedule with the Q coordinate at batch 0
    bq = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, broadcast_q=True)
    assert bq.name == v.name + "_bcastq" and bq == dataclasses.replace(v, broadcast_q=True)


def test_uncovered_arguments_find_nothing():
    assert registry.find(registry.AttentionBwdConfig, head_dim=128, dq_accum="fp16") is None
    assert registry.find(registry.AttentionBwdConfig, head_dim=128, p_scale="block") is None


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tunings_registered_as_non_production(head_dim, causal):
    """Every tuning is registered for each head_dim x causal under its own tune (the GPU test and the
    benchmark loop over TUNINGS); only tune 0 is what the production lookup finds."""
    for tune, fields in TUNINGS:
        v = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=tune)
        assert v is not None and v.tune == tune
        assert all(getattr(v, k) == x for k, x in fields.items())
        assert (v.name == f"attention_bwd_h{head_dim}{'_causal' if causal else ''}") == (tune == 0)
    prod = registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal)
    assert prod == AttentionBwdConfig(head_dim=head_dim, causal=causal)
    assert registry.find(registry.AttentionBwdConfig, head_dim=head_dim, causal=causal, tune=len(TUNINGS)) is None


def test_variant_names_unique():
    assert len({v.name for v in registry.ATTENTION_BWD_VARIANTS}) == len(registry.ATTENTION_BWD_VARIANTS)
    assert [t for t, _ in TUNINGS] == list(range(len(TUNINGS)))
