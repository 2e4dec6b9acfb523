"""The Blackwell attention forward's compile-time side on CPU (no DSL, no GPU): the variant list and the
operand interface a handler checks (kernels/sm100/attention_fwd_config.py), the TMEM columns the kernel takes
from the proven map (kernels/sm100/attention_tmem.py), and the performance model's unit counts against the
kernel's masking rule counted independently (the packed tables:
tests/attention/test_attention_sm100_packed_tables.py)."""

from __future__ import annotations

import itertools

import pytest

from jax_mxfp8.kernels.registry.base import P_SCALE_CODE
from jax_mxfp8.kernels.sm100 import attention_fwd_perf_model as model
from jax_mxfp8.kernels.sm100 import attention_tmem
from jax_mxfp8.kernels.sm100.attention_fwd_config import (
    ATTENTION_FWD_SM100_VARIANTS,
    REGISTER_FILE,
    REGISTERS,
    SMEM_LIMIT,
    AttentionFwdSm100Config,
    find_variant,
)
from jax_mxfp8.kernels.sm100.perf_model import B200, GB300


def test_variant_list_covers_every_feature_combination_once():
    names = [v.name for v in ATTENTION_FWD_SM100_VARIANTS]
    assert len(names) == len(set(names)) == 24
    assert all(v.tune == 0 for v in ATTENTION_FWD_SM100_VARIANTS)
    for h, c, p in itertools.product((64, 128), (False, True), ("const", "block")):
        for packed, bq in ((False, False), (True, False), (False, True)):
            v = find_variant(head_dim=h, causal=c, p_scale=p, packed=packed, broadcast_q=bq)
            assert v.key == {
                "head_dim": h,
                "causal": int(c),
                "p_scale": P_SCALE_CODE[p],
                "packed": int(packed),
                "broadcast_q": int(bq),
                "tune": 0,
            }
    with pytest.raises(ValueError, match="no sm100 attention forward variant"):
        find_variant(head_dim=256)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_tmem_columns_are_the_proven_maps(head_dim):
    cfg = find_variant(head_dim=head_dim, causal=False, p_scale="const", packed=False, broadcast_q=False)
    proven = attention_tmem.forward_map(head_dim)
    proven.check()
    starts = {r.name.split("@")[0]: r.start for r in proven.regions}
    assert cfg.tmem_columns == starts
    assert cfg.tmem_alloc_columns == 512
    assert not cfg.tmem_map().problems()
    sf = attention_tmem.SF_COLS
    want = sorted(starts[k] + i * sf for k in ("SF_QK_0", "SF_QK_1", "SF_PV_0", "SF_PV_1") for i in (0, 1))
    assert list(cfg.scale_copy_columns) == want
    if head_dim == 128:  # the accumulators fill the allocation; P and the scale slots live inside S
        assert [starts[k] for k in ("S_0", "S_1", "O_0", "O_1")] == [0, 128, 256, 384]
        assert 0 < starts["P_0"] and starts["SF_PV_0"] + 2 * sf <= 128


def test_resources_fit_one_sm():
    for v in ATTENTION_FWD_SM100_VARIANTS:
        assert v.smem_bytes <= SMEM_LIMIT
        assert v.tx_bytes == {"q": 128 * v.head_dim + 512, "kv": 128 * v.head_dim + 512}
    assert 32 * (8 * REGISTERS["softmax"] + 4 * REGISTERS["correction"] + 4 * REGISTERS["other"]) == REGISTER_FILE


def test_bad_configs_raise_naming_the_field():
    with pytest.raises(ValueError, match="head_dim"):
        AttentionFwdSm100Config(head_dim=96)
    with pytest.raises(ValueError, match="p_scale"):
        AttentionFwdSm100Config(p_scale="row")
    with pytest.raises(ValueError, match="broadcast_q"):
        AttentionFwdSm100Config(packed=True, broadcast_q=True)
    with pytest.raises(ValueError, match="kv_stages"):
        AttentionFwdSm100Config(head_dim=128, kv_stages=20)


def test_unsupported_problems_are_named():
    dense = find_variant(head_dim=128, causal=False, p_scale="const", packed=False, broadcast_q=False)
    ok = dict(batch=2, q_batch=2, t=1000, s=700, heads=8, kv_heads=2)
    assert dense.unsupported(**ok) is None
    assert "multiple of kv_heads" in dense.unsupported(**{**ok, "kv_heads": 3})
    assert "q_batch" in dense.unsupported(**{**ok, "q_batch": 1})
    assert "2^31" in dense.unsupported(**{**ok, "t": 2**29, "heads": 64, "kv_heads": 64})
    bq = find_variant(head_dim=64, causal=True, p_scale="block", packed=False, broadcast_q=True)
    assert bq.unsupported(**{**ok, "q_batch": 1}) is None
    packed = find_variant(head_dim=64, causal=False, p_scale="const", packed=True, broadcast_q=False)
    assert packed.unsupported(**{**ok, "batch": 1, "q_batch": 1}) is None
    assert "one batch row" in packed.unsupported(**{**ok, "q_batch": 1})
    assert dense.tensor_names == ("q", "q_sf_hd", "k", "k_sf_hd", "v", "v_sf_seq", "lens", "o", "lse")
    assert packed.tensor_names == ("q", "q_sf_hd", "k", "k_sf_hd", "v", "v_sf_seq", "seqs", "work", "o", "lse")


def _tiles(pair: int, q_len: int, kv_len: int, causal: bool) -> int:
    """KV tiles a pair visits, from the mask itself: tiles holding a key some valid row of the pair sees."""
    rows = range(pair * 256, min(pair * 256 + 256, q_len))
    keys = [k for k in range(kv_len) if any((not causal) or k <= r for r in rows)] if rows else []
    return (max(keys) // 128 + 1) if keys else 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("q_len", "kv_len"), [(1000, 1000), (4096, 4096), (300, 130), (77, 900)])
def test_model_units_follow_the_masking_rule(causal, q_len, kv_len):
    units = model.item_units(q_len, kv_len, causal)
    pairs = list(range(-(-q_len // 256)))
    order = pairs[::-1] if causal else pairs
    for (u, masked), m in zip(units, order, strict=True):
        n = _tiles(m, q_len, kv_len, causal) if causal else -(-kv_len // 128)
        assert u == 2 * n
        want = 0
        for s in range(2):
            first = m * 256 + s * 128
            for j in range(n):  # a tile needs the mask when some key of it is invisible to some row of the tile
                keys = range(j * 128, j * 128 + 128)
                want += any(k >= kv_len or (causal and k > first) for k in keys)
        assert masked == want


def test_model_stays_under_the_peak_and_names_the_bound():
    for v in ATTENTION_FWD_SM100_VARIANTS:
        for gpu in (B200, GB300):
            p = model.predict_fwd(v, model.table_shape(v), gpu, (537, 800))
            assert 0 < p.tflops < gpu.fp8_dense_tflops
            assert p.bound in ("mma", "mufu", "issue")
    h128 = find_variant(head_dim=128, causal=False, p_scale="const", packed=False, broadcast_q=False)
    assert model.predict_fwd(h128, model.table_shape(h128), B200, (300, 300)).bound == "mufu"  # B200: 16 ex2/clk
    assert model.predict_fwd(h128, model.table_shape(h128), GB300, (300, 300)).bound == "mufu"
    assert model.predict_fwd(h128, model.table_shape(h128), GB300, (900, 900)).bound == "issue"
