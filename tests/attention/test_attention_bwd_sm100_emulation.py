"""The Blackwell attention backward's arithmetic (jax_mxfp8/primitives/attention_bwd_sm100_emulation.py) on CPU:

* domain="natural" equals the XLA reference backward (reference/attention_bwd.py attention_bwd, from the
  unquantized dO and O) bit for bit for dq, dk, dv: the fused pre-pass (dO square quantization, Delta), every
  GEMM reading its own orientation's scale bytes, P ("const" / "block" along the queries), dS quantized once
  per 32x32 block, dQ in float32 or float16 x 2^e (one rounding per key tile, ascending), GQA sums;
* domain="log2" (the kernel's exp2 form): dq, dk, dv within 0.5 dB of the reference's SQNR against float64
  unquantized gradients, and >= 40 dB from the reference;
* dq_accum "fp16_reduce" (the float16 TMA reduce-add: two roundings per tile) stays within float16 accumulation
  error of "fp16"; broadcast q sums dq over the batch; packed jagged sequences equal the padded batch bit for
  bit and a NaN in one sequence leaves the others' gradients unchanged.
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
from jax_mxfp8.primitives.attention_bwd_sm100_emulation import bwd_prepass, emulate_bwd_sm100
from jax_mxfp8.primitives.attention_sm100_emulation import emulate_fwd_sm100, head_major
from jax_mxfp8.reference.attention_bwd import attention_bwd
from jax_mxfp8.reference.attention_tiling import Masking
from tests.attention.attention_oracle import exact_attention, sqnr_db
from tests.attention.attention_testutil import fresh_rng

B, T, S, N, K, H = 2, 256, 384, 4, 2, 64
LENS = ((200, 256), (300, 384))  # (query, key) length per batch row


def _problem(rng, lens=LENS, h=H):
    q = rng.standard_normal((B, T, N, h)).astype(np.float32)
    k = rng.standard_normal((B, S, K, h)).astype(np.float32)
    v = rng.standard_normal((B, S, K, h)).astype(np.float32)
    do = rng.standard_normal((B, T, N, h)).astype(np.float32)
    ln = None if lens is None else np.array(lens).T  # (2, B)
    if ln is not None:
        q = np.where((np.arange(T) < ln[0][:, None])[:, :, None, None], q, 0).astype(np.float32)
        keep_k = (np.arange(S) < ln[1][:, None])[:, :, None, None]
        k, v = (np.where(keep_k, x, 0).astype(np.float32) for x in (k, v))
    return q, k, v, do, (None if ln is None else jnp.asarray(ln, jnp.int32))


def _run(q, k, v, do, lens, *, causal, p_scale, dq_accum="fp32", domain, scale=H**-0.5):
    """Forward emulation (log2), pre-pass, backward emulation. Returns (operands, o, lse, (dq, dk, dv))."""
    mx = [ops.quantize_square(jnp.asarray(x)) for x in (q, k, v)]
    q_op, k_op, v_op = (ops.sm100_operand(m) for m in mx)

    @jax.jit
    def run(q_op, k_op, v_op, do, lens):
        o, lse = emulate_fwd_sm100(q_op, k_op, v_op, lens, causal=causal, scale=scale, p_scale=p_scale)
        do_op, delta = bwd_prepass(do, o, None, None if lens is None else lens[0])
        kw = dict(causal=causal, scale=scale, p_scale=p_scale, dq_accum=dq_accum, domain=domain)
        return o, lse, emulate_bwd_sm100(q_op, k_op, v_op, do_op, lse, delta, lens, **kw)

    o, lse, grads = run(q_op, k_op, v_op, jnp.asarray(do), lens)
    return mx, o, lse, tuple(np.asarray(g) for g in grads)


def _reference_bwd(mx, o, lse, do, lens, *, causal, p_scale, dq_accum, scale=H**-0.5):
    mq, mk, mv = mx
    g = N // K
    if lens is not None:
        do = np.where((np.arange(T) < np.asarray(lens[0])[:, None])[:, :, None, None], do, 0).astype(np.float32)
    qh, kh, vh = (
        head_major(dequantize(mq), g),
        head_major(dequantize(mk), 1)[:, :, 0],
        head_major(dequantize(mv), 1)[:, :, 0],
    )
    masking = Masking(causal, S, None if lens is None else lens[0], None if lens is None else lens[1], None, None)
    dq, dk, dv, _ = attention_bwd(
        qh, kh, vh, qh, kh, head_major(o, g), lse.reshape(B, K, g, T), head_major(jnp.asarray(do), g), None,
        masking, scale=scale, config=AttentionConfig(p_scale=p_scale, dq_accum=dq_accum),
    )  # fmt: skip
    return (
        np.asarray(dq).reshape(B, N, T, -1).transpose(0, 2, 1, 3),
        np.asarray(dk).transpose(0, 2, 1, 3),
        np.asarray(dv).transpose(0, 2, 1, 3),
    )


@pytest.mark.parametrize("dq_accum", ["fp32", "fp16"])
@pytest.mark.parametrize("p_scale", ["const", "block"])
@pytest.mark.parametrize("causal", [False, True])
def test_natural_domain_equals_reference(causal, p_scale, dq_accum):
    q, k, v, do, lens = _problem(fresh_rng())
    mx, o, lse, grads = _run(q, k, v, do, lens, causal=causal, p_scale=p_scale, dq_accum=dq_accum, domain="natural")
    want = _reference_bwd(mx, o, lse, do, lens, causal=causal, p_scale=p_scale, dq_accum=dq_accum)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want, strict=True):
        np.testing.assert_array_equal(got, ref, err_msg=name)


def _sqnr_params():
    for causal in (False, True):
        for p_scale in ("const", "block"):
            marks = () if not causal else (pytest.mark.slow,)
            yield pytest.param(causal, p_scale, marks=marks, id=f"causal={causal}-{p_scale}")


@pytest.mark.parametrize(("causal", "p_scale"), list(_sqnr_params()))
def test_log2_domain_sqnr(causal, p_scale):
    q, k, v, do, lens = _problem(fresh_rng())
    mx, o, lse, grads = _run(q, k, v, do, lens, causal=causal, p_scale=p_scale, domain="log2")
    want = _reference_bwd(mx, o, lse, do, lens, causal=causal, p_scale=p_scale, dq_accum="fp32")
    ln = np.asarray(lens)
    _, _, *exact = exact_attention(q, k, v, do, scale=H**-0.5, causal=causal, q_len=ln[0], kv_len=ln[1])
    for name, got, ref, x64 in zip(("dq", "dk", "dv"), grads, want, exact, strict=True):
        ref_db, emu_db, gap = sqnr_db(ref, x64), sqnr_db(got, x64), sqnr_db(got, ref)
        print(f"\ncausal={causal} {p_scale} {name}: vs float64 ref {ref_db:.2f} dB, emulated {emu_db:.2f} dB, "
              f"emulated vs ref {gap:.1f} dB")  # fmt: skip
        assert abs(emu_db - ref_db) <= 0.5 and gap >= 40.0, name


def test_dq_fp16_reduce_within_float16_error():
    q, k, v, do, lens = _problem(fresh_rng())
    kw = dict(causal=False, p_scale="const", domain="log2")
    dq16 = _run(q, k, v, do, lens, dq_accum="fp16", **kw)[3][0]
    dq_red = _run(q, k, v, do, lens, dq_accum="fp16_reduce", **kw)[3][0]
    dq32 = _run(q, k, v, do, lens, dq_accum="fp32", **kw)[3][0]
    # float16 keeps 11 significant bits (~66 dB per rounding); the reduce-add rounds each tile's partial once
    # more and adds in any order, the deterministic mode rounds once per tile: both stay far above the MX error
    for name, got in (("fp16", dq16), ("fp16_reduce", dq_red)):
        print(f"\ndq {name} vs fp32: {sqnr_db(got, dq32):.1f} dB")
        assert sqnr_db(got, dq32) >= 50.0, name
    assert sqnr_db(dq_red, dq16) >= 50.0


def test_broadcast_q_sums_dq_over_the_batch():
    rng = fresh_rng()
    q, k, v, do, _ = _problem(rng, lens=None)
    q1 = q[:1]
    lens = jnp.asarray([[T, T], [S, 300]], jnp.int32)

    @jax.jit
    def run(q1, qb, k, v, do):
        k_op, v_op = ops.sm100_operand(ops.quantize_square(k)), ops.sm100_operand(ops.quantize_square(v))
        q1_op, qb_op = ops.sm100_operand(ops.quantize_square(q1)), ops.sm100_operand(ops.quantize_square(qb))
        o, lse = emulate_fwd_sm100(qb_op, k_op, v_op, lens, causal=False, scale=0.125)
        do_op, delta = bwd_prepass(do, o, None, lens[0])
        kw = dict(causal=False, scale=0.125)
        one = emulate_bwd_sm100(q1_op, k_op, v_op, do_op, lse, delta, lens, **kw)
        return one, emulate_bwd_sm100(qb_op, k_op, v_op, do_op, lse, delta, lens, **kw)

    args = (q1, np.repeat(q1, B, axis=0), k, v, do)
    (dq1, dk1, dv1), (dqb, dkb, dvb) = run(*(jnp.asarray(a) for a in args))
    assert dq1.shape == (1, T, N, H)
    np.testing.assert_array_equal(np.asarray(dq1), np.sum(np.asarray(dqb), axis=0, keepdims=True))
    np.testing.assert_array_equal(np.asarray(dk1), np.asarray(dkb))
    np.testing.assert_array_equal(np.asarray(dv1), np.asarray(dvb))


def test_prepass_delta_and_do_operand():
    rng = fresh_rng()
    do = rng.standard_normal((B, T, N, H)).astype(np.float32)
    o = rng.standard_normal((B, T, N, H)).astype(np.float32)
    dlse = rng.standard_normal((B, N, T)).astype(np.float32)
    q_len = jnp.asarray([100, 256], jnp.int32)
    do_op, delta = bwd_prepass(jnp.asarray(do), jnp.asarray(o), jnp.asarray(dlse), q_len)
    keep = (np.arange(T) < np.asarray(q_len)[:, None])[:, :, None, None]
    dz = np.where(keep, do, 0.0)
    want = np.einsum("btnh,btnh->bnt", dz.astype(np.float64), o.astype(np.float64)) - dlse
    np.testing.assert_allclose(np.asarray(delta), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(do_op.data), np.asarray(ops.quantize_square(jnp.asarray(dz)).data))
    assert do_op.sf_hd is not None and do_op.sf_seq is not None


def test_packed_equals_padded_batch_and_isolates_nan():
    rng = fresh_rng()
    lq, lk = [100, 256, 64], [250, 200, 37]
    n, kh, h = 2, 1, 64
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(lq)]), jnp.int32)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(lk)]), jnp.int32)
    cq, ck = np.asarray(cu_q), np.asarray(cu_k)
    x = {
        "q": rng.standard_normal((1, sum(lq), n, h)).astype(np.float32),
        "k": rng.standard_normal((1, sum(lk), kh, h)).astype(np.float32),
        "v": rng.standard_normal((1, sum(lk), kh, h)).astype(np.float32),
        "do": rng.standard_normal((1, sum(lq), n, h)).astype(np.float32),
    }
    width, kw = 256, dict(causal=True, scale=0.125, p_scale="const")

    @jax.jit
    def run_packed(x):
        chq, chk = packed.chunk_starts(cu_q[1:] - cu_q[:-1]), packed.chunk_starts(cu_k[1:] - cu_k[:-1])

        def pack(a, cu, c, o=ops.ORIENTATIONS):
            return packed.pack_operand(jnp.asarray(a), cu, c, max_len=width, n_chunks=8, orientations=o)

        pq, pk, pv = pack(x["q"], cu_q, chq), pack(x["k"], cu_k, chk), pack(x["v"], cu_k, chk)
        lim = dict(max_len_q=width, max_len_k=width)
        o, lse = packed.emulate_packed_fwd_sm100(pq, pk, pv, cu_q, cu_k, chq, chk, **lim, **kw)
        pdo = pack(x["do"], cu_q, chq)
        delta = jnp.sum(jnp.asarray(x["do"]) * o, axis=-1).transpose(0, 2, 1)  # (1, N, Tq)
        return packed.emulate_packed_bwd_sm100(pq, pk, pv, pdo, lse, delta, cu_q, cu_k, chq, chk, **lim, **kw)

    def rows(a, cu, lens):
        return np.stack([np.pad(a[0, cu[i] : cu[i + 1]], [(0, width - lens[i]), (0, 0), (0, 0)]) for i in range(3)])

    dq, dk, dv = (np.asarray(g) for g in run_packed(x))
    lens = jnp.asarray([lq, lk], jnp.int32)

    @jax.jit
    def run_dense(dense):
        q_op, k_op, v_op = (ops.sm100_operand(ops.quantize_square(dense[s])) for s in ("q", "k", "v"))
        o, lse = emulate_fwd_sm100(q_op, k_op, v_op, lens, **kw)
        do_op, delta = bwd_prepass(dense["do"], o, None, lens[0])
        return emulate_bwd_sm100(q_op, k_op, v_op, do_op, lse, delta, lens, **kw)

    dense = {
        name: rows(a, cq if name in ("q", "do") else ck, lq if name in ("q", "do") else lk) for name, a in x.items()
    }
    gd = [np.asarray(g) for g in run_dense({name: jnp.asarray(a) for name, a in dense.items()})]
    # To float32 rounding, not bits: XLA may order a float32 reduction differently for the packed and the padded shapes.
    for i in range(3):
        np.testing.assert_allclose(dq[0, cq[i] : cq[i + 1]], gd[0][i, : lq[i]], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(dk[0, ck[i] : ck[i + 1]], gd[1][i, : lk[i]], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(dv[0, ck[i] : ck[i + 1]], gd[2][i, : lk[i]], rtol=1e-6, atol=1e-6)
    x["k"][0, ck[1] + 7, 0, 9] = np.nan  # sequence 1
    dq2, dk2, dv2 = (np.asarray(g) for g in run_packed(x))
    for i in (0, 2):
        np.testing.assert_array_equal(dq2[0, cq[i] : cq[i + 1]], dq[0, cq[i] : cq[i + 1]])
        np.testing.assert_array_equal(dk2[0, ck[i] : ck[i + 1]], dk[0, ck[i] : ck[i + 1]])
        np.testing.assert_array_equal(dv2[0, ck[i] : ck[i + 1]], dv[0, ck[i] : ck[i + 1]])
    assert np.any(np.isnan(dq2[0, cq[1] : cq[2]]))


def test_rejects_bad_arguments():
    q, k, v, do, lens = _problem(fresh_rng(), lens=None)
    q_op, k_op, v_op, do_op = (ops.sm100_operand(ops.quantize_square(jnp.asarray(x))) for x in (q, k, v, do))
    lse = delta = jnp.zeros((B, N, T), jnp.float32)
    with pytest.raises(ValueError, match="dq_accum"):
        emulate_bwd_sm100(q_op, k_op, v_op, do_op, lse, delta, None, causal=False, scale=1.0, dq_accum="bf16")
    with pytest.raises(ValueError, match="dq_scale_log2"):
        emulate_bwd_sm100(q_op, k_op, v_op, do_op, lse, delta, None, causal=False, scale=1.0, dq_scale_log2=16)
    with pytest.raises(ValueError, match="lse"):
        emulate_bwd_sm100(q_op, k_op, v_op, do_op, lse[:, :, :8], delta, None, causal=False, scale=1.0)
