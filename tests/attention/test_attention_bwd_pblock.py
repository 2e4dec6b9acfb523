"""p_scale="block" in the Hopper attention backward kernel (registry BLOCK_P; kernels/sm90/attention_bwd_blocks.py
quantize_p_blocks): dV = Pq^T dO with P quantized per 32 queries of each key (dV's contracting axis), one E8M0
scale per block from its own amax (rule "up"), as reference/attention_bwd.py's fake_quant_p(p, -2, "block").

CPU: the lookup, and the kernel path (emulated) against the reference backward on the same residuals.
GPU (marked): the kernel against the reference with the same config (the gates: >= 35 dB, float64
SQNR within 0.5 dB of the reference's); and on an attention sink, where every other key's P (~2^-20) is below what the
constant scale keeps, dv of those keys equals the block reference's (nonzero) and not the constant one's (0):
the blocks are not the constant scale under another name.
"""

from __future__ import annotations

import numpy as np
import pytest

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.kernels.registry.attention_bwd import BF16_SCHEDULE, BLOCK_P, AttentionBwdConfig
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import library
from tests.attention.attention_bwd_kernel_testutil import (
    check_written,
    exact_bwd,
    forward_f32,
    kernel_bwd,
    make_case,
    mx_operands,
    reference_bwd,
)
from tests.attention.attention_bwd_testutil import CASES, need_variant, same_residual_grads
from tests.attention.attention_testutil import fresh_rng

BLOCK = AttentionConfig(p_scale="block")


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_block_variants_registered(head_dim, causal):
    """One variant per (head_dim, causal) for rule "up": production's schedule without p_scaled (so without
    dv_f16 or the dQ writer warp); "floor" has none (the forward kernel takes only "up", so a "floor" call runs
    the reference both ways)."""
    v, why = abwd.kernel_variant(head_dim=head_dim, causal=causal, p_scale="block", p_rounding="up")
    assert why is None and v.p_scale == "block" and v.p_rounding == "up" and v.tune == 0
    want = dict(BF16_SCHEDULE, sdp_fp8=True, dk_ss=True)
    assert v == AttentionBwdConfig(head_dim=head_dim, causal=causal, p_scale="block", **want)
    assert v.sdp_fp8 and not v.p_scaled and not v.dv_f16 and BLOCK_P[head_dim] == want
    assert v.name == f"attention_bwd_h{head_dim}{'_causal' if causal else ''}_pblock"
    v, why = abwd.kernel_variant(head_dim=head_dim, causal=causal, p_scale="block", p_rounding="floor")
    assert v is None and "p_rounding='floor'" in why
    for mode in (dict(dq_accum="fp16"), dict(deterministic=True)):
        assert abwd.kernel_variant(head_dim=head_dim, causal=causal, p_scale="block", **mode)[0] is None


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(p_scaled=True), "p_scaled"),  # 2^8 P units would move the block scales of tiny blocks
        (dict(dq_accum="fp16", dq_store="red"), "dq_accum"),
        (dict(broadcast_q=True, dq_store="red"), "broadcast_q"),
    ],
)
def test_block_needs_its_schedule(fields, field):
    with pytest.raises(ValueError, match=field):
        AttentionBwdConfig(head_dim=128, p_scale="block", **fields)


@pytest.mark.parametrize("case", [CASES[0], pytest.param(CASES[1], marks=pytest.mark.slow)], ids=["gqa", "mha"])
def test_block_kernel_path_equals_reference_on_same_residuals(case):
    """implementation="emulated" with p_scale="block" takes the backward kernel path (recorded), and its
    gradients on the emulated forward's residuals are >= 40 dB from the reference backward's (the call reads
    V re-encoded as every sdp_fp8 variant does: test_attention_bwd_kernel_path_cpu.py says why not bits)."""
    need_variant(case, BLOCK)
    got, want = same_residual_grads(case, BLOCK)
    for name, a, w in zip("qkv", got, want, strict=True):
        a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
        assert np.isfinite(a).all() and np.abs(a).max() > 0, f"d{name}"
        assert sqnr_db(w, a) >= 40.0, (f"d{name}", sqnr_db(w, a))


# --------------------------------------------------------------------------------------------------- GPU
GPU_CASES = [
    dict(b=2, t=512, s=512, n=4, n_kv=4, h=128, causal=False),
    dict(b=3, t=320, s=320, n=4, n_kv=2, h=128, causal=True, lengths=True),
    dict(b=2, t=320, s=448, n=4, n_kv=2, h=64, causal=True, lengths=True),
    dict(b=1, t=384, s=640, n=4, n_kv=2, h=64, causal=False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("spec", GPU_CASES, ids=lambda c: f"h{c['h']}{'_causal' if c['causal'] else ''}")
def test_block_kernel_matches_reference(spec):
    ok, why = library.kernels_runnable(("sm_90a",))
    if not ok:
        pytest.skip(why)
    case = make_case(fresh_rng(), **spec)
    ops = mx_operands(case)
    o, lse = forward_f32(case, ops)
    ref = reference_bwd(case, ops, o, lse, BLOCK)
    exact = exact_bwd(case)
    got, raw = kernel_bwd(case, ops, o, lse, mode=dict(p_scale="block"))
    check_written(case, raw)
    row = {}
    for name, kx, rx, ex in zip(("dq", "dk", "dv"), got, ref, exact, strict=True):
        vs_ref, k64, r64 = sqnr_db(rx, kx), sqnr_db(ex, kx), sqnr_db(ex, rx)
        row[name] = (round(vs_ref, 2), round(k64, 2), round(r64, 2))
        assert vs_ref >= 35.0, f"{name}: {vs_ref:.2f} dB vs the block reference"
        assert abs(k64 - r64) <= 0.5, f"{name}: float64 SQNR {k64:.2f} vs the reference's {r64:.2f} dB"
    print("SQNR (vs ref, kernel f64, ref f64)", row)


@pytest.mark.gpu
def test_block_keeps_what_const_flushes():
    """Key 0 is a sink 14 nats above the others for every query (channel 0: q = 8, k_0 = 14, tau = 1/8; the
    others' logits within +-0.4 of 0), so the other keys' P ~ 2^-20.2 sits below half the constant scale's
    smallest subnormal (2^-18): p_scale "const" gives their dv exactly 0, "block" (their own 32-query blocks'
    scales) keeps them to E4M3 precision."""
    ok, why = library.kernels_runnable(("sm_90a",))
    if not ok:
        pytest.skip(why)
    rng = fresh_rng()
    b, n_kv, g, t, s, h = 1, 1, 2, 256, 384, 64
    q = rng.standard_normal((b, n_kv, g, t, h)) * 0.3
    q[..., 0] = 8.0
    k = rng.standard_normal((b, n_kv, s, h)) * 0.3
    k[..., 0] = 0.0
    k[:, :, 0, :] = 0.0  # the sink's logit exactly 14 (its own noise would move every other P by e^+-0.3)
    k[:, :, 0, 0] = 14.0
    case = dict(
        q=q, k=k, v=rng.standard_normal((b, n_kv, s, h)), do=rng.standard_normal((b, n_kv, g, t, h)),
        q_len=np.full(b, t, np.int32), kv_len=np.full(b, s, np.int32), causal=False, tau=1.0 / 8.0,
    )  # fmt: skip
    ops = mx_operands(case)
    o, lse = forward_f32(case, ops)
    ref, ref_const = reference_bwd(case, ops, o, lse, BLOCK), reference_bwd(case, ops, o, lse)
    got, raw = kernel_bwd(case, ops, o, lse, mode=dict(p_scale="block"))
    check_written(case, raw)
    rest = slice(1, s)  # the keys other than the sink
    assert not np.any(ref_const[2][:, :, rest]), "the constant scale kept some of the tiny P (the case is wrong)"
    assert np.all(np.abs(ref[2][:, :, rest]).max(axis=-1) > 0), "the block reference lost a non-sink key's dv"
    db = sqnr_db(ref[2][:, :, rest], got[2][:, :, rest])
    print(f"non-sink keys' dv: {db:.1f} dB vs the block reference")
    assert db >= 35.0
    assert sqnr_db(ref[2], got[2]) >= 35.0 and sqnr_db(ref[1], got[1]) >= 35.0
