"""The Blackwell attention forward's arithmetic (jax_mxfp8/primitives/attention_sm100_emulation.py) on CPU:

* domain="natural" (the reference's exponent) equals the XLA reference (reference/attention_fwd.py) bit for bit:
  operand decoding from E4M3 bytes + blocked scales, tile order, masking, the kernel's P quantization
  ("const" and "block"), rescaling, epilogue;
* domain="log2" (the kernel's exp2 form) is within the stated elementwise bound of the reference, >= 60 dB
  from it, and within 0.5 dB of the reference's SQNR against float64 unquantized attention;
* broadcast q, packed jagged sequences (split addressing) equal their dense forms bit for bit; a NaN in one
  sequence or batch row leaves every other bit for bit unchanged; logits of 1e30 stay finite.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.formats.quantize import dequantize
from jax_mxfp8.primitives import attention_sm100_operands as ops
from jax_mxfp8.primitives import attention_sm100_packed as packed
from jax_mxfp8.primitives.attention_sm100_emulation import emulate_fwd_sm100, head_major
from jax_mxfp8.reference.attention_fwd import attention_fwd
from jax_mxfp8.reference.attention_tiling import Masking
from tests.attention.attention_oracle import exact_attention, sqnr_db
from tests.attention.attention_testutil import fresh_rng

# (B, T, S, N, K, H, lengths)
CASES = {
    "gqa_h64_lens": (2, 256, 384, 4, 2, 64, ((200, 256), (300, 384))),
    "mqa_h128": (1, 128, 256, 4, 1, 128, None),
    "mha_h64_short_kv": (2, 128, 128, 2, 2, 64, ((128, 96), (40, 128))),
}


def _inputs(rng, case, scale_x=1.0):
    b, t, s, n, k, h, _ = CASES[case]
    q = rng.standard_normal((b, t, n, h)).astype(np.float32) * np.float32(scale_x)
    kk = rng.standard_normal((b, s, k, h)).astype(np.float32)
    v = rng.standard_normal((b, s, k, h)).astype(np.float32)
    return q, kk, v


def _lens(case):
    lens = CASES[case][6]
    return None if lens is None else jnp.asarray(np.array(lens).T, jnp.int32)  # (2, B)


def _zero_past(x, lens_row):
    if lens_row is None:
        return x
    keep = np.arange(x.shape[1])[None, :] < np.asarray(lens_row)[:, None]
    return np.where(keep[:, :, None, None], x, 0).astype(np.float32)


def _operands(q, k, v, lens):
    q = _zero_past(q, None if lens is None else lens[0])
    k = _zero_past(k, None if lens is None else lens[1])
    v = _zero_past(v, None if lens is None else lens[1])
    mx = [ops.quantize_square(jnp.asarray(x)) for x in (q, k, v)]
    return mx, [ops.sm100_operand(m) for m in mx]


def _reference(mx, lens, *, causal, scale, p_scale):
    mq, mk, mv = mx
    b, t, n, h = mq.shape
    s, k = mk.shape[1], mk.shape[2]
    q_len = None if lens is None else lens[0]
    kv_len = None if lens is None else lens[1]
    o, lse = attention_fwd(
        head_major(dequantize(mq), n // k),
        head_major(dequantize(mk), 1)[:, :, 0],
        head_major(dequantize(mv), 1)[:, :, 0],
        Masking(causal, s, q_len, kv_len, None, None),
        scale=scale,
        config=AttentionConfig(p_scale=p_scale),
    )
    return np.asarray(o).reshape(b, n, t, h).transpose(0, 2, 1, 3), np.asarray(lse).reshape(b, n, t)


def _emulate(operands, lens, **kw):
    o, lse = jax.jit(lambda q, k, v, ln: emulate_fwd_sm100(q, k, v, ln, **kw))(*operands, lens)
    return np.asarray(o), np.asarray(lse)


@pytest.mark.parametrize("p_scale", ["const", "block"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_natural_domain_equals_reference(case, causal, p_scale):
    rng = fresh_rng()
    lens = _lens(case)
    mx, operands = _operands(*_inputs(rng, case), lens)
    scale = CASES[case][5] ** -0.5
    o, lse = _emulate(operands, lens, causal=causal, scale=scale, p_scale=p_scale, domain="natural")
    o_ref, lse_ref = _reference(mx, lens, causal=causal, scale=scale, p_scale=p_scale)
    np.testing.assert_array_equal(o, o_ref)
    np.testing.assert_array_equal(lse, lse_ref)


def _o_bound(mx, lens, *, causal, scale, o_ref):
    """|O_kernel - O_reference| bound (docs/perf/blackwell-attention.md "Emulation"): every P element of the two
    can differ by one E4M3 step of its block (<= 2^-3 of it, plus a subnormal step <= 2^-16 in units of the
    row max), l and the rescale factors by float32 roundings: per (row, channel)
    sum_s (1.1 * 2^-3 w_s + 2^-16) |V_s| / sum_s w_s + 2^-16 |O|, w_s = e^(S_s - max S) over the valid keys."""
    qv, kv, vv = (np.asarray(dequantize(m), np.float64) for m in mx)
    g = qv.shape[2] // kv.shape[2]
    kk, vh = np.repeat(kv, g, axis=2), np.repeat(vv, g, axis=2)
    logits = scale * np.einsum("btnh,bsnh->bnts", qv, kk)
    b, n, t, s = logits.shape
    ok = np.ones((b, n, t, s), bool)
    if causal:
        ok &= np.tril(np.ones((t, s), bool))[None, None]
    if lens is not None:
        ln = np.asarray(lens)
        ok &= (np.arange(t)[None, :] < ln[0][:, None])[:, None, :, None]
        ok &= (np.arange(s)[None, :] < ln[1][:, None])[:, None, None, :]
    logits = np.where(ok, logits, -np.inf)
    m = np.max(logits, axis=-1, keepdims=True)
    w = np.where(ok, np.exp(logits - np.where(np.isfinite(m), m, 0.0)), 0.0)
    lsum = np.maximum(w.sum(-1), 1e-300)[..., None]
    step = np.einsum("bnts,bsnh->bnth", 1.1 * 2.0**-3 * w + 2.0**-16 * ok, np.abs(vh)) / lsum
    return step.transpose(0, 2, 1, 3) + 2.0**-16 * np.abs(o_ref)


def _log2_params():
    """Every case x causal x p_scale; only the GQA one outside the slow set (the CPU compile dominates)."""
    for case in CASES:
        for causal in (False, True):
            for p_scale in ("const", "block"):
                marks = () if case == "gqa_h64_lens" else (pytest.mark.slow,)
                yield pytest.param(case, causal, p_scale, marks=marks, id=f"{case}-{causal}-{p_scale}")


@pytest.mark.parametrize(("case", "causal", "p_scale"), list(_log2_params()))
def test_log2_domain_within_bound_and_sqnr(case, causal, p_scale):
    rng = fresh_rng()
    lens = _lens(case)
    q, k, v = _inputs(rng, case)
    mx, operands = _operands(q, k, v, lens)
    scale = CASES[case][5] ** -0.5
    o, lse = _emulate(operands, lens, causal=causal, scale=scale, p_scale=p_scale, domain="log2")
    o_ref, lse_ref = _reference(mx, lens, causal=causal, scale=scale, p_scale=p_scale)
    assert np.all(np.abs(o - o_ref) <= _o_bound(mx, lens, causal=causal, scale=scale, o_ref=o_ref))
    assert np.array_equal(np.isfinite(lse), np.isfinite(lse_ref))
    fin = np.isfinite(lse_ref)
    assert sqnr_db(o, o_ref) >= 60.0, sqnr_db(o, o_ref)
    assert sqnr_db(lse[fin], lse_ref[fin]) >= 100.0
    ql = None if lens is None else np.asarray(lens[0])
    kl = None if lens is None else np.asarray(lens[1])
    o64, _ = exact_attention(
        _zero_past(q, ql), _zero_past(k, kl), _zero_past(v, kl), scale=scale, causal=causal, q_len=ql, kv_len=kl
    )
    ref_db, emu_db = sqnr_db(o_ref, o64), sqnr_db(o, o64)
    print(
        f"\n{case} causal={causal} p_scale={p_scale}: O vs float64 ref {ref_db:.2f} dB, emulated {emu_db:.2f} dB, "
        f"emulated vs ref {sqnr_db(o, o_ref):.1f} dB"
    )
    assert abs(emu_db - ref_db) <= 0.5


def test_broadcast_q_equals_tiled_q():
    rng = fresh_rng()
    q, k, v = _inputs(rng, "gqa_h64_lens")
    q1 = q[:1]
    lens = jnp.asarray([[256, 256], [300, 384]], jnp.int32)
    _, (op_q1, op_k, op_v) = _operands(q1, k, v, None)
    _, (op_qb, _, _) = _operands(np.repeat(q1, 2, axis=0), k, v, None)
    kw = dict(causal=False, scale=0.125, p_scale="const")
    np.testing.assert_array_equal(
        _emulate((op_q1, op_k, op_v), lens, **kw)[0], _emulate((op_qb, op_k, op_v), lens, **kw)[0]
    )


def test_nan_in_one_batch_row_stays_there():
    rng = fresh_rng()
    q, k, v = _inputs(rng, "gqa_h64_lens")
    lens = _lens("gqa_h64_lens")
    clean = _emulate(_operands(q, k, v, lens)[1], lens, causal=True, scale=0.125)
    v[1, 10, 0, 5] = np.nan  # batch row 1, KV head 0, key 10
    dirty = _emulate(_operands(q, k, v, lens)[1], lens, causal=True, scale=0.125)
    np.testing.assert_array_equal(dirty[0][0], clean[0][0])
    np.testing.assert_array_equal(dirty[1][0], clean[1][0])
    o1 = dirty[0][1]
    # the NaN makes its square block (keys 0..31, channels 0..31 of KV head 0) NaN (scale byte 0xFF): every
    # valid row of query heads 0, 1 sees key 0, so those channels are NaN there; nothing else is
    assert np.all(np.isnan(o1[:300, :2, :32])) and np.all(o1[300:] == 0)
    assert np.array_equal(np.isnan(o1), np.isnan(o1) & (np.arange(4)[:, None] < 2) & (np.arange(64) < 32))
    np.testing.assert_array_equal(o1[:, 2:], clean[0][1][:, 2:])


def _packed_inputs(rng, lq, lk, n, k, h):
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(lq)]), jnp.int32)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(lk)]), jnp.int32)
    q = rng.standard_normal((1, sum(lq), n, h)).astype(np.float32)
    kk = rng.standard_normal((1, sum(lk), k, h)).astype(np.float32)
    v = rng.standard_normal((1, sum(lk), k, h)).astype(np.float32)
    return cu_q, cu_k, q, kk, v


def _run_packed(cu_q, cu_k, q, k, v, max_q, max_k, **kw):
    return jax.jit(lambda *a: _packed_forward(*a, max_q, max_k, **kw))(cu_q, cu_k, q, k, v)


def _packed_forward(cu_q, cu_k, q, k, v, max_q, max_k, **kw):
    cq, ck = packed.chunk_starts(cu_q[1:] - cu_q[:-1]), packed.chunk_starts(cu_k[1:] - cu_k[:-1])
    n_chunks = 16

    def pack(x, cu, c, ml, o):
        return packed.pack_operand(jnp.asarray(x), cu, c, max_len=ml, n_chunks=n_chunks, orientations=o)

    pq, pk, pv = (
        pack(q, cu_q, cq, max_q, ("hd",)),
        pack(k, cu_k, ck, max_k, ("hd",)),
        pack(v, cu_k, ck, max_k, ("seq",)),
    )
    return packed.emulate_packed_fwd_sm100(pq, pk, pv, cu_q, cu_k, cq, ck, max_len_q=max_q, max_len_k=max_k, **kw)


def test_packed_equals_padded_batch_and_isolates_nan():
    """Split addressing: compact data, per-sequence padded scales; each sequence as in a padded batch of the
    same width (to float32 rounding: XLA may order a float32 reduction differently for the two array shapes; the kernel
    runs one tile schedule for both), and a NaN in one sequence's V changes no other sequence's bits (same
    shapes, so exact)."""
    rng = fresh_rng()
    lq, lk = [100, 300, 64, 129], [250, 300, 37, 200]
    cu_q, cu_k, q, k, v = _packed_inputs(rng, lq, lk, 4, 2, 64)
    kw = dict(causal=True, scale=0.125, p_scale="block")
    o, lse = (np.asarray(a) for a in _run_packed(cu_q, cu_k, q, k, v, 300, 300, **kw))
    width = 384

    def padded(x, cu, lens):
        return np.stack([np.pad(x[0, cu[i] : cu[i + 1]], [(0, width - lens[i]), (0, 0), (0, 0)]) for i in range(4)])

    cq, ck = np.asarray(cu_q), np.asarray(cu_k)
    _, dense = _operands(padded(q, cq, lq), padded(k, ck, lk), padded(v, ck, lk), None)
    od, lsed = _emulate(dense, jnp.asarray([lq, lk], jnp.int32), **kw)
    for i in range(4):
        np.testing.assert_allclose(o[0, cq[i] : cq[i + 1]], od[i, : lq[i]], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(lse[0, :, cq[i] : cq[i + 1]], lsed[i, :, : lq[i]], rtol=1e-6, atol=1e-6)
    v[0, ck[1] + 5, 0, 3] = np.nan  # sequence 1, key 5
    o2, lse2 = (np.asarray(a) for a in _run_packed(cu_q, cu_k, q, k, v, 300, 300, **kw))
    for i in (0, 2, 3):
        np.testing.assert_array_equal(o2[0, cq[i] : cq[i + 1]], o[0, cq[i] : cq[i + 1]])
        np.testing.assert_array_equal(lse2[0, :, cq[i] : cq[i + 1]], lse[0, :, cq[i] : cq[i + 1]])
    assert np.any(np.isnan(o2[0, cq[1] : cq[2]]))


@pytest.mark.parametrize("domain", ["log2", "natural"])
def test_huge_logits_stay_finite(domain):
    """|S| up to ~1e30: P~ = 2^(t - m) <= 1 exactly (t - m <= 0 from the same rounded t), so 2^8 P~ <= 256 never
    saturates and no exponent overflows; O is the value of the winning key, as the reference's."""
    rng = fresh_rng()
    q, k, v = _inputs(rng, "mqa_h128", scale_x=1e28)
    mx, operands = _operands(q, k, v, None)
    for causal in (False, True):
        o, lse = _emulate(operands, None, causal=causal, scale=128**-0.5, domain=domain)
        o_ref, lse_ref = _reference(mx, None, causal=causal, scale=128**-0.5, p_scale="const")
        assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse)) and np.max(np.abs(lse)) > 1e28
        assert sqnr_db(o, o_ref) >= 40.0


def test_rejects_bad_arguments():
    rng = fresh_rng()
    _, operands = _operands(*_inputs(rng, "mqa_h128"), None)
    with pytest.raises(ValueError, match="p_scale"):
        emulate_fwd_sm100(*operands, None, causal=False, scale=1.0, p_scale="tile")
    with pytest.raises(ValueError, match="domain"):
        emulate_fwd_sm100(*operands, None, causal=False, scale=1.0, domain="e")
    with pytest.raises(ValueError, match="lens"):
        emulate_fwd_sm100(*operands, jnp.zeros((2, 3), jnp.int32), causal=False, scale=1.0)
