"""The Hopper attention backward kernel's dQ modes (kernels/sm90/attention_bwd_dq.py) through its FFI target.

Gates: dq_accum "fp16" (dQ * 2^e in float16) and the deterministic mode ("fp32", "fp16"):
  * dq SQNR >= 35 dB against the XLA reference with the same AttentionConfig (dq_accum, dq_fp16_scale_log2);
    dk, dv bit-identical to tune 0's (the dQ mode changes only how dQ is added);
  * deterministic "fp32": dq within float32 reordering of tune 0's (>= 110 dB: the same partials in another
    order); the dq_sem counters end at the number of KV tiles adding into each query tile (the ordering
    protocol ran for every tile), computed here independently;
  * deterministic: 20 runs on the same inputs bit-identical (dq, dk, dv);
  * "fp16" beyond float16's range (e = 15, large dO): Inf / NaN in dq wherever |dQ| 2^e is far above 65504,
    never a finite wrong value.
Helpers (inputs, references, the `_into` call) from tests/attention/test_attention_bwd_kernel_gpu.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.metrics import sqnr_db
from tests.attention.attention_bwd_kernel_testutil import (
    MIN_DB,
    SAME_MATH_DQ_DB,
    check_written,
    forward_f32,
    kernel_bwd,
    make_case,
    mx_operands,
    reference_bwd,
)
from tests.attention.attention_testutil import fresh_rng

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90_attention_bwd")]

MODES = {
    "fp16": dict(dq_accum="fp16"),
    "det": dict(deterministic=True),
    "fp16_det": dict(dq_accum="fp16", deterministic=True),
}
CASES = [
    dict(b=2, t=512, s=640, n=4, n_kv=2, h=128, causal=False),
    dict(b=3, t=320, s=320, n=4, n_kv=2, h=128, causal=True, lengths=True),
    dict(b=2, t=320, s=448, n=4, n_kv=2, h=64, causal=True, lengths=True),
    dict(b=1, t=384, s=640, n=2, n_kv=1, h=64, causal=False),
]
RUNS = 20


def _case_id(c) -> str:
    return f"b{c['b']}t{c['t']}s{c['s']}n{c['n']}k{c['n_kv']}h{c['h']}" + ("_causal" if c["causal"] else "")


def _config(mode, e) -> AttentionConfig:
    return AttentionConfig(dq_accum=mode.get("dq_accum", "fp32"), dq_fp16_scale_log2=e)


def expected_sem(case, tp) -> np.ndarray:
    """dq_sem (B, N, Tp / 32) after a deterministic call: [b, n, 2 m + c] = the KV tiles (128 keys, below
    kv_len; causal: tile j adds into query tile m iff 128 j <= 64 m + 63) that add into query tile m (rows
    < q_len), per head-dim half c (H64: c = 0 only)."""
    b, n_kv, g, _, h = case["q"].shape
    out = np.zeros((b, n_kv * g, tp // 32), np.int32)
    for bi in range(b):
        tiles = -(-int(case["kv_len"][bi]) // 128)
        for m in range(tp // 64):
            if 64 * m >= case["q_len"][bi]:
                continue
            count = min(tiles, (64 * m + 63) // 128 + 1) if case["causal"] else tiles
            out[bi, :, 2 * m] = count
            if h == 128:
                out[bi, :, 2 * m + 1] = count
    return out


@pytest.mark.parametrize("spec", CASES, ids=_case_id)
@pytest.mark.parametrize("name", list(MODES))
def test_dq_mode_matches_reference(spec, name):
    mode = MODES[name]
    e = 12 if mode.get("dq_accum") == "fp16" else 0
    case = make_case(fresh_rng(), **spec)
    ops = mx_operands(case)
    o, lse = forward_f32(case, ops)
    ref = reference_bwd(case, ops, o, lse, _config(mode, 12))
    # tune 17: the float32 dQ on the modes' GEMM precision (BF16 wgmma; production's S^T, dP^T are FP8)
    base, _ = kernel_bwd(case, ops, o, lse, tune=17)
    got, raw = kernel_bwd(case, ops, o, lse, mode=mode, dq_scale_log2=e)
    check_written(case, raw)
    db = sqnr_db(ref[0], got[0])
    print("SQNR", _case_id(spec), name, f"dq vs reference {db:.2f} dB, vs tune 17 {sqnr_db(base[0], got[0]):.2f} dB")
    assert db >= MIN_DB, f"{name} dq: {db:.2f} dB vs the reference < {MIN_DB}"
    assert np.array_equal(got[1], base[1]) and np.array_equal(got[2], base[2]), f"{name}: dk / dv differ from tune 17"
    for x, r in zip(got[1:], ref[1:], strict=True):
        assert sqnr_db(r, x) >= MIN_DB
    if name == "det":
        assert sqnr_db(base[0], got[0]) >= SAME_MATH_DQ_DB
    if mode.get("deterministic"):
        np.testing.assert_array_equal(raw["dq_sem"], expected_sem(case, raw["tp"]))


@pytest.mark.parametrize("name", ["det", "fp16_det"])
def test_deterministic_runs_are_bit_identical(name):
    """RUNS calls on the same inputs give the same bits (dq, dk, dv); the non-deterministic variant of the
    same dq_accum is run as well and its number of distinct dq results printed (evidence that the inputs
    exercise the reduction order; not asserted: atomics may happen to agree)."""
    mode = MODES[name]
    e = 12 if mode.get("dq_accum") == "fp16" else 0
    spec = dict(b=2, t=1024, s=1024, n=4, n_kv=2, h=128, causal=False)
    case = make_case(fresh_rng(), **spec)
    ops = mx_operands(case)
    o, lse = forward_f32(case, ops)
    t0 = time.perf_counter()
    first, raw0 = kernel_bwd(case, ops, o, lse, mode=mode, dq_scale_log2=e)
    print(f"{name}: first run done after {time.perf_counter() - t0:.2f} s", flush=True)
    for _ in range(RUNS - 1):
        got, raw = kernel_bwd(case, ops, o, lse, mode=mode, dq_scale_log2=e)
        assert np.array_equal(raw["dq_raw"].view(np.uint8), raw0["dq_raw"].view(np.uint8)), f"{name}: dq differs"
        assert np.array_equal(got[1], first[1]) and np.array_equal(got[2], first[2])
    loose = {k: v for k, v in mode.items() if k != "deterministic"}
    seen = {kernel_bwd(case, ops, o, lse, mode=loose, dq_scale_log2=e)[1]["dq_raw"].tobytes() for _ in range(5)}
    dt = time.perf_counter() - t0
    print(f"{name}: {RUNS} runs in {dt:.2f} s, bit-identical; non-deterministic {loose or 'fp32'}: {len(seen)} of 5")


@pytest.mark.parametrize("name", ["fp16", "fp16_det"])
def test_fp16_overflow_is_visible(name):
    """e = 15 and dO x 32: |dQ| 2^15 exceeds float16's 65504 for many elements. Wherever the float32
        reference's |dQ| 2^e > 2 * 65504 the kernel's dq is Inf or NaN; elsewhere finite kernel values match the
        reference's on the elements finite in both (>= 35 dB; a prefix of the KV tiles' sum may overflow where
    the final dQ would not: then Inf in one order and not in another)."""
    spec = dict(b=1, t=256, s=512, n=2, n_kv=1, h=128, causal=False)
    case = make_case(fresh_rng(), **spec)
    case["do"] = case["do"] * 32.0  # ~8% of |dQ| 2^15 above 2 * 65504, ~50% of the reference's dq finite
    ops = mx_operands(case)
    o, lse = forward_f32(case, ops)
    ref32 = reference_bwd(case, ops, o, lse)[0]
    got, _ = kernel_bwd(case, ops, o, lse, mode=MODES[name], dq_scale_log2=15)
    big = np.abs(ref32) * 2.0**15 > 2 * 65504
    assert big.mean() > 0.01, "the case does not overflow (the test could not fail)"
    assert not np.isfinite(got[0][big]).any(), f"{name}: finite dq where |dQ| 2^15 overflows float16"
    ref16 = reference_bwd(case, ops, o, lse, AttentionConfig(dq_accum="fp16", dq_fp16_scale_log2=15))[0]
    assert not np.isfinite(ref16[big]).any()
    both = np.isfinite(got[0]) & np.isfinite(ref16)
    assert both.mean() > 0.25 and sqnr_db(ref16[both], got[0][both]) >= MIN_DB
