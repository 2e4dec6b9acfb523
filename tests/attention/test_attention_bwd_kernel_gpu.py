"""The Hopper MXFP8 attention backward kernel (sm_90a, kernels/sm90/attention_bwd.py) through its FFI target.

Calls `jax_mxfp8_attention_bwd_into` directly (the `_into` hook: NaN-poisoned dq, dk, dv aliased to the
results) on operands built here the way the pre-pass builds them (the contract's MX values in bfloat16,
head-major, padded to 128 rows). Gates: dq, dk, dv SQNR >= 35 dB against the XLA reference
(reference/attention_bwd.py on the same dequantized operands); each output's SQNR against a float64
attention backward on the unquantized inputs within 0.5 dB of the reference's own; every element written,
rows past the lengths exactly 0; a large-logits case (|S| ~ 1e6) stays finite. Fresh random inputs per check.
Production and the two comparison schedules (registry COMPARISONS: tune 17 on BF16 wgmma only, and PREVIOUS:
production without dv_f16, in the library when built with --with-tunes) meet the same gates; schedules of
the same GEMM precision compute the same math, so their dk and dv are equal bit for bit (fixed accumulation
order inside a CTA) and dq up to the order of the float32 reductions across KV tiles (SQNR >=
SAME_MATH_DQ_DB). The kinds: sdp_fp8 (production: S^T and dP^T on FP8 wgmma from FP8 copies of Q, K, V, dO
re-encoded to one exponent per 32 rows, made here by the library's own square quantize + realign,
jax_mxfp8_attention_bwd_fp8_into) and BF16 wgmma only (tune 17); the re-encoding rounds some elements
differently, so the two kinds' SQNR against each other (against tune 0) is printed, not gated. The causal
launch order over several L2 sections (kernels/sm90/tile_scheduler.py): the whole call against one call per
(batch row, KV head) on the same operands, dk and dv (deterministic mode: dq too) bit for bit.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.kernels.registry.attention_bwd import COMPARISONS
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.primitives import library
from tests.attention.attention_bwd_kernel_testutil import (
    F64_SLACK_DB,
    MIN_DB,
    SAME_MATH_DQ_DB,
    call_kernel,
    check_same_math,
    check_written,
    exact_bwd,
    forward_f32,
    kernel_bwd,
    kernel_inputs,
    kernel_variant,
    make_case,
    mx_operands,
    reference_bwd,
)
from tests.attention.attention_testutil import fresh_rng

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90_attention_bwd")]

CASES = [
    dict(b=2, t=512, s=512, n=4, n_kv=4, h=128, causal=False),
    dict(b=1, t=640, s=640, n=4, n_kv=2, h=128, causal=True),
    dict(b=3, t=256, s=384, n=2, n_kv=1, h=128, causal=False, lengths=True),
    dict(b=3, t=320, s=320, n=4, n_kv=2, h=128, causal=True, lengths=True),
    dict(b=1, t=384, s=640, n=4, n_kv=2, h=64, causal=False),
    dict(b=2, t=320, s=448, n=4, n_kv=2, h=64, causal=True, lengths=True),
]


def case_id(c) -> str:
    return (
        f"b{c['b']}t{c['t']}s{c['s']}n{c['n']}k{c['n_kv']}h{c['h']}"
        + ("_causal" if c["causal"] else "")
        + ("_len" if c.get("lengths") else "")
    )


# production and the comparison schedules (registry/attention_bwd.py COMPARISONS); same inputs, same oracles.
# JAX_MXFP8_TEST_TUNES="0,17" restricts a device run to those (tune 0, production, always runs).
_ONLY = os.environ.get("JAX_MXFP8_TEST_TUNES")
_ALL_TUNES = sorted({0, *(t for tunes in COMPARISONS.values() for t in tunes)})
TUNES = tuple(t for t in _ALL_TUNES if not _ONLY or t == 0 or str(t) in _ONLY.split(","))


@pytest.mark.parametrize("spec", CASES, ids=case_id)
def test_kernel_matches_reference(spec):
    case = make_case(fresh_rng(), **spec)
    ops = mx_operands(case)
    o, lse = forward_f32(case, ops)
    ref = reference_bwd(case, ops, o, lse)
    exact = exact_bwd(case)
    ran = 0
    # math class (sdp_fp8, p_scaled) -> (tune, outputs) of the first tune run of that class (tune 0 for
    # production's): the tunes of one class compute the same products (dk, dv bit for bit)
    bases = {}
    t0 = None  # tune 0's outputs
    failures = []  # every tune is checked (and printed) even when an earlier one fails
    for tune in TUNES:
        variant = registry.find(registry.AttentionBwdConfig, head_dim=spec["h"], causal=spec["causal"], tune=tune)
        if variant is None or not library.has_kernel(variant.name):
            continue
        ran += 1
        got, raw = kernel_bwd(case, ops, o, lse, tune=tune)
        row = {"case": case_id(spec), "tune": tune}
        base = bases.setdefault((variant.sdp_fp8, variant.p_scaled), (tune, got))
        t0 = got if tune == 0 else t0
        try:
            check_written(case, raw)
            for name, kx, rx, ex in zip(("dq", "dk", "dv"), got, ref, exact, strict=True):
                vs_ref = sqnr_db(rx, kx)
                k64, r64 = sqnr_db(ex, kx), sqnr_db(ex, rx)
                row[name] = dict(vs_ref=round(vs_ref, 2), kernel_f64=round(k64, 2), ref_f64=round(r64, 2))
                assert vs_ref >= MIN_DB, f"tune {tune} {name}: {vs_ref:.2f} dB vs the reference < {MIN_DB}"
                assert abs(k64 - r64) <= F64_SLACK_DB, f"tune {tune} {name}: float64 SQNR {k64:.2f} vs {r64:.2f} dB"
            if base[0] != tune:
                check_same_math(tune, got, base[1], base[0])
            elif t0 is not None and tune != 0:  # the first tune of the other kind: printed against tune 0
                row["vs_tune0"] = [round(sqnr_db(b0, x), 1) for b0, x in zip(t0, got, strict=True)]
        except AssertionError as e:
            failures.append(str(e))
        print("SQNR", row)
    assert not failures, "\n".join(failures)
    if not ran:
        pytest.skip(f"no attention_bwd variant for head_dim={spec['h']} causal={spec['causal']}")


@pytest.mark.parametrize("tune", TUNES)
def test_large_logits_stay_finite(tune):
    """q, k scaled so |S| ~ 1e6: P = exp(min(S - LSE, 0)) keeps every gradient finite."""
    spec = dict(b=1, t=256, s=256, n=2, n_kv=1, h=128, causal=True)
    case = make_case(fresh_rng(), **spec, logit_scale=1000.0)
    ops = mx_operands(case)
    o, lse = forward_f32(case, ops)
    got, raw = kernel_bwd(case, ops, o, lse, tune=tune)
    check_written(case, raw)
    s_abs = np.abs(np.einsum("bkgth,bksh->bkgts", case["q"], case["k"]) * case["tau"])
    assert s_abs.max() > 1e5
    for x in got:
        assert np.all(np.isfinite(x))


@pytest.mark.parametrize("h", [128, 64])
def test_dv_f16_wide_do_range(h):
    """dv_f16 (production: dO in float16 times 2^-shift per (batch, KV head)) on dO whose 32-row blocks span 20
    binades inside each KV head's group: float16 subnormals reach the float16 wgmma, and dv must still equal
    the PREVIOUS comparison's (bfloat16 dO; tune 25 at H128, 24 at H64) bit for bit, dk too."""
    spec = dict(b=2, t=256, s=256, n=4, n_kv=2, h=h, causal=True)
    rng = fresh_rng()
    case = make_case(rng, **spec)
    case["do"] = case["do"] * 2.0 ** rng.integers(-20, 1, size=(2, 2, 2, 256 // 32, 1)).repeat(32, axis=3)
    ops = mx_operands(case)
    o, lse = forward_f32(case, ops)
    prod = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=True)
    if prod is None or not prod.dv_f16:
        pytest.skip("production has no dv_f16")
    got, raw = kernel_bwd(case, ops, o, lse)
    base, _ = kernel_bwd(case, ops, o, lse, tune={128: 25, 64: 24}[h])
    check_written(case, raw)
    check_same_math(0, got, base, {128: 25, 64: 24}[h])


# the causal launch order's L2 sections (kernels/sm90/tile_scheduler.py KeyTileScheduler), written out here: a
# section holds hs = SECTION_BYTES / (4 H bytes per query row) // (Tp G query rows per KV head) KV head rows
# (at least 1, at most B K), item-major inside; the grid's B K head rows form ceil(B K / hs) sections.
SECTION_BYTES = 32 << 20
# 2 sections, the last one partial (4 + 2 head rows) and crossing the batch boundary (head rows 0-2 are batch
# 0); t = 8000 pads to Tp = 8192; lengths differ per batch row, so a CTA decoded to the wrong batch row
# computes with the wrong lengths.
SECTIONS_SPEC = dict(b=2, t=8000, s=8000, n=6, n_kv=3, h=128, causal=True, lengths=True)
_Q_SIDE = ("qh", "doh", "lse", "delta", "q8", "do8", "qs", "dos", "dq", "dq_sem")  # axis 1: query heads


def causal_sections(b: int, n_kv: int, g: int, tp: int, h: int) -> tuple[int, int]:
    """(hs, sections) of the causal longest-first launch order for B b, K n_kv, G g, Tp tp, H h."""
    hs = min(max(SECTION_BYTES // (4 * h) // (tp * g), 1), b * n_kv)
    return hs, -(-(b * n_kv) // hs)


def _one_head(operands: dict, bi: int, kv: int, g: int) -> dict:
    """kernel_inputs' operands (or outputs) of batch row bi and KV head kv alone (B = K = 1, N = G)."""
    out = {}
    for name, x in operands.items():
        if name == "lens":
            out[name] = x[:, bi : bi + 1]
            continue
        heads = slice(kv * g, (kv + 1) * g) if name in _Q_SIDE else slice(kv, kv + 1)
        out[name] = x[bi : bi + 1, heads]
    return out


@pytest.mark.parametrize("mode", [None, {"deterministic": True}], ids=["production", "deterministic"])
def test_causal_sections_match_one_head_at_a_time(mode):
    """The causal launch order over several L2 sections (SECTIONS_SPEC: 2 sections of 4 and 2 KV head rows)
    against the same kernel called once per (batch row, KV head) on the same operands (one section of one
    head row each: the launch number is the key tile). Each CTA's arithmetic is the same either way, so dk, dv
    are equal bit for bit; dq too in the deterministic mode (ascending key tiles per query tile), production's
    up to the float32 order of its atomic adds (>= SAME_MATH_DQ_DB). Every element of the whole call written
    (NaN-poisoned outputs), and the last head row's gradients meet the XLA reference (>= MIN_DB)."""
    spec = SECTIONS_SPEC
    g, t, s = spec["n"] // spec["n_kv"], spec["t"], spec["s"]
    tp = -(-t // 128) * 128
    hs, sections = causal_sections(spec["b"], spec["n_kv"], g, tp, spec["h"])
    assert sections >= 2 and (spec["b"] * spec["n_kv"]) % hs, f"SECTIONS_SPEC forms {sections} sections of {hs}"
    case = make_case(fresh_rng(), **spec)
    ops = mx_operands(case)
    o, lse = forward_f32(case, ops)
    variant = kernel_variant(case, mode=mode)
    args, outs, shift = kernel_inputs(case, ops, o, lse, variant)
    full = [np.asarray(x) for x in call_kernel(variant, case["tau"], args, outs)]
    raw = dict(dq=full[0], dk=full[1], dv=full[2], tp=tp, sp=-(-s // 128) * 128)
    check_written(case, raw)
    for bi in range(spec["b"]):
        for kv in range(spec["n_kv"]):
            one = call_kernel(variant, case["tau"], _one_head(args, bi, kv, g), _one_head(outs, bi, kv, g))
            dq1, dk1, dv1 = (np.asarray(x)[0] for x in one[:3])
            where = f"batch row {bi}, KV head {kv}"
            assert np.array_equal(full[1][bi, kv], dk1[0]), f"dk of {where} differs from its one-head call"
            assert np.array_equal(full[2][bi, kv], dv1[0]), f"dv of {where} differs from its one-head call"
            dq = full[0][bi, kv * g : (kv + 1) * g]
            if variant.deterministic:
                assert np.array_equal(dq, dq1), f"deterministic dq of {where} differs from its one-head call"
            else:
                db = sqnr_db(dq1.astype(np.float64), dq.astype(np.float64))
                assert db >= SAME_MATH_DQ_DB, f"dq of {where}: {db:.1f} dB vs its one-head call"
    last = {k: v[-1:, -1:] if k in ("q", "k", "v", "do") else v for k, v in case.items()}
    last.update(q_len=case["q_len"][-1:], kv_len=case["kv_len"][-1:])
    ref = reference_bwd(last, {k: v[-1:, -1:] for k, v in ops.items()}, o[-1:, -1:], lse[-1:, -1:])
    got = (full[0][-1:, -g:, :t].reshape(1, 1, g, t, -1), full[1][-1:, -1:, :s], full[2][-1:, -1:, :s])
    if shift is not None:  # dv_f16: the kernel's dv is times 2^-shift[b, kv]
        got = got[:2] + (got[2] * 2.0 ** float(np.asarray(shift)[-1, -1]),)
    for name, r, x in zip(("dq", "dk", "dv"), ref, got, strict=True):
        db = sqnr_db(r, x.astype(np.float64))
        assert db >= MIN_DB, f"{name} of the last head row: {db:.2f} dB vs the reference < {MIN_DB}"
