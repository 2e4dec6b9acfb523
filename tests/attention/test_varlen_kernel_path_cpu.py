"""varlen_attention's packed kernel path on CPU, with the kernel call emulated (primitives.attention_fwd
emulate_packed_fwd) and the realign step in XLA: the layout maps, the work list, per-sequence isolation,
and agreement with the dense kernel path on the padded batch (which tests/attention/test_attention_kernel_gpu.py
checks against the real kernel). The real packed kernel runs in tests/attention/test_varlen_kernel_gpu.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops import attention_core as dense
from jax_mxfp8.ops import varlen_kernel
from jax_mxfp8.primitives import attention_packed as packed
from jax_mxfp8.reference.varlen import (
    aligned_rows,
    aligned_starts,
    aligned_to_packed,
    aligned_to_padded,
    seq_lengths,
    to_aligned,
    to_padded,
)
from tests.attention.varlen_testutil import dense_kernel_on_padded, packed_inputs
from tests.seeding_testutil import test_rng

CASES = [
    dict(lq=(100, 0, 300, 37), lk=(100, 0, 300, 37), n=4, n_kv=2, h=64, causal=False),
    dict(lq=(100, 0, 300, 37), lk=(100, 0, 300, 37), n=4, n_kv=2, h=128, causal=True),
    dict(lq=(257, 128, 31), lk=(64, 300, 200), n=2, n_kv=1, h=128, causal=False),
    dict(lq=(129, 1, 256), lk=(129, 5, 256), n=2, n_kv=2, h=64, causal=True),
]


def _id(case):
    return f"lq{'_'.join(map(str, case['lq']))}-h{case['h']}-n{case['n']}k{case['n_kv']}-c{int(case['causal'])}"


def _run(case, impl, q, k, v, cu_q, cu_k):
    return jax_mxfp8.varlen_attention(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_seqlen_q=max(case["lq"]),
        max_seqlen_k=max(case["lk"]),
        is_causal=case["causal"],
        implementation=impl,
    )


@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.slow
def test_packed_kernel_path_equals_dense_kernel_on_padded_batch(case):
    rng = test_rng()
    q, k, v, cu_q, cu_k = packed_inputs(rng, case["lq"], case["lk"], case["n"], case["n_kv"], case["h"])
    ct = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)

    # Each route runs as one program, the offsets closed over (concrete: varlen_attention's checks still run
    # on them); eager dispatch compiled thousands of small programs (~80 s per case on CI's CPU).
    def fwd_bwd(f):
        @jax.jit
        def run(q, k, v, ct):
            o, vjp = jax.vjp(f, q, k, v)
            return o, vjp(ct)

        return run(q, k, v, ct)

    got, g_packed = fwd_bwd(lambda *a: _run(case, "emulated", *a, cu_q, cu_k))
    want, g_dense = fwd_bwd(lambda *a: dense_kernel_on_padded(case, *a, cu_q, cu_k, "emulated"))
    assert got.dtype == jnp.bfloat16 and got.shape == q.shape
    assert not np.any(np.isnan(np.asarray(got, np.float32)))
    # The emulation runs emulate_fwd on per-sequence windows of another shape than the padded batch's, and
    # XLA:CPU's exp2/log2 may round an ulp differently with the shape: near-bits here, exact bits on the GPU.
    assert sqnr_db(np.asarray(want, np.float64), np.asarray(got, np.float64)) >= 90.0
    # against the contract reference (XLA path): the kernel's re-encoding stays within the 40 dB gate
    ref = jax.jit(lambda *a: _run(case, "xla", *a, cu_q, cu_k))(q, k, v)
    assert sqnr_db(ref, got) >= 40.0

    # The backward is dot_product_attention's, fed residuals gathered to the padded batch: the MX operands
    # must be the dense path's bit for bit, O and LSE as close as the outputs above (the gradients then
    # differ only by those ulps and XLA's fusion choices in two differently jitted programs).
    max_q, max_k = max(case["lq"]), max(case["lk"])
    pad_q, pad_k = -(-max_q // 32) * 32, -(-max_k // 32) * 32
    st = varlen_kernel.VarlenStatic(
        dense=dense.AttentionStatic(
            config=jax_mxfp8.AttentionConfig(),
            scale=1.0 / np.sqrt(case["h"]),
            is_causal=case["causal"],
            is_mx=(False,) * 3,
            out_dtype=np.dtype(jnp.bfloat16),
            group=case["n"] // case["n_kv"],
            impl="emulated",
        ),
        max_q=max_q,
        max_k=max_k,
        total_q=q.shape[0],
        total_k=k.shape[0],
    )

    @jax.jit
    def residuals(q, k, v):
        _, (qm, km, vm, o_al, lse_al, *_) = varlen_kernel._kernel_forward(st, q, k, v, cu_q, cu_k)
        lens_q, lens_k = seq_lengths(cu_q, max_q), seq_lengths(cu_k, max_k)
        (o_d, lse_d), (quants, *_) = dense.mx_attention_fwd(
            st.dense,
            to_padded(q, cu_q, lens_q, pad_q),
            to_padded(k, cu_k, lens_k, pad_k),
            to_padded(v, cu_k, lens_k, pad_k),
            None,
            None,
            lens_q,
            lens_k,
        )
        lay_q = varlen_kernel._layout(cu_q, q.shape[0], max_q)
        lay_k = varlen_kernel._layout(cu_k, k.shape[0], max_k)
        o_p = aligned_to_padded(o_al[0], lay_q.starts, lay_q.lengths, pad_q)
        lse_p = aligned_to_padded(lse_al[0].T, lay_q.starts, lay_q.lengths, pad_q, fill=-jnp.inf).transpose(0, 2, 1)
        mx_pairs = {
            name: (varlen_kernel._padded_mx(mx, lay, pad), quants[f"{name}:square"])
            for name, mx, lay, pad in (("q", qm, lay_q, pad_q), ("k", km, lay_k, pad_k), ("v", vm, lay_k, pad_k))
        }
        return o_d, lse_d, o_p, lse_p, mx_pairs

    o_d, lse_d, o_p, lse_p, mx_pairs = residuals(q, k, v)
    assert sqnr_db(np.asarray(o_d, np.float64), np.asarray(o_p, np.float64)) >= 90.0
    finite = np.isfinite(np.asarray(lse_d))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse_p)), finite)
    # LSE = m + log(l) with m the row's largest logit (order 1 here): an ulp of XLA:CPU's exp2 / log2 in one of the
    # two programs moves it by ~2.4e-7 absolute however close to 0 the sum lands, so the bound is absolute at a
    # few ulps of the logits' scale as well as relative.
    np.testing.assert_allclose(np.asarray(lse_p)[finite], np.asarray(lse_d)[finite], rtol=1e-6, atol=1e-6)
    for name, (got_mx, want_mx) in mx_pairs.items():
        np.testing.assert_array_equal(
            np.asarray(got_mx.data, np.float32), np.asarray(want_mx.data, np.float32), err_msg=name
        )
        np.testing.assert_array_equal(np.asarray(got_mx.scale), np.asarray(want_mx.scale), err_msg=name)

    for a, b in zip(g_packed, g_dense, strict=True):
        assert sqnr_db(np.asarray(b, np.float64), np.asarray(a, np.float64)) >= 60.0


def test_packed_kernel_path_isolates_sequences():
    """Changing one sequence (NaN, a 2^70 larger V that would move a shared V exponent bound) leaves every
    other sequence's output bit-identical; rows in no sequence stay 0."""
    case = dict(lq=(200, 77, 300), lk=(200, 77, 300), n=2, n_kv=1, h=64, causal=False)
    rng = np.random.default_rng(7)
    q, k, v, cu_q, cu_k = packed_inputs(rng, case["lq"], case["lk"], 2, 1, 64)
    base = np.asarray(_run(case, "emulated", q, k, v, cu_q, cu_k), np.float32)
    s1 = slice(200, 277)
    v2 = v.at[s1].set(v[s1] * jnp.bfloat16(2.0**70))
    k2 = k.at[210].set(jnp.nan)
    got = np.asarray(_run(case, "emulated", q, k2, v2, cu_q, cu_k), np.float32)
    others = np.r_[0:200, 277:577]
    np.testing.assert_array_equal(got[others], base[others])
    assert np.all(np.isnan(got[s1]))  # the NaN key reaches every query of its own sequence
    np.testing.assert_array_equal(base[577:], 0.0)


@functools.partial(jax.jit, static_argnames=("max_len", "rows", "total"))
def _aligned_maps(x, cu, *, max_len, rows, total):
    """starts, to_aligned and aligned_to_packed of it, in one program (eager dispatch compiled every small op
    anew for each draw's shapes: ~60 s for the 20 draws below)."""
    lens = seq_lengths(cu, max_len)
    starts = aligned_starts(lens, 128)
    al = to_aligned(x, cu, lens, starts, rows)
    return starts, al, aligned_to_packed(al, cu, lens, starts, total)


@pytest.mark.slow  # ~20 s of CPU for the 20 draws' compiles: the 3.12 CI leg (-m "not slow") stays short
def test_aligned_layout_maps_round_trip():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n_seq = int(rng.integers(1, 7))
        lengths = rng.integers(0, 400, n_seq)
        total = int(lengths.sum() + rng.integers(0, 9))
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        rows = aligned_rows(total, n_seq, max(int(lengths.max(initial=1)), 1), 128)
        assert rows % 128 == 0 and rows >= int(np.sum(-(-lengths // 128) * 128))
        x = (rng.standard_normal((total, 3)) + 1.0).astype(np.float32)
        starts, al, back = _aligned_maps(
            jnp.asarray(x), jnp.asarray(cu), max_len=int(lengths.max(initial=1)) or 1, rows=rows, total=total
        )
        starts, al, back = np.asarray(starts), np.asarray(al), np.asarray(back)
        for b in range(n_seq):
            s0, c0, n = int(starts[b]), int(cu[b]), int(lengths[b])
            assert s0 % 128 == 0
            np.testing.assert_array_equal(al[s0 : s0 + n], x[c0 : c0 + n])
            np.testing.assert_array_equal(al[s0 + n : s0 + -(-n // 128) * 128], 0.0)
        np.testing.assert_array_equal(back[: int(lengths.sum())], x[: int(lengths.sum())])
        np.testing.assert_array_equal(back[int(lengths.sum()) :], 0.0)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_work_list_covers_every_query_tile_once_longest_first(causal):
    rng = np.random.default_rng(11)
    lq = rng.integers(0, 700, 9)
    lk = lq if causal else rng.integers(1, 700, 9)
    q_len, kv_len = jnp.asarray(lq, jnp.int32), jnp.asarray(lk, jnp.int32)
    qs, ks = aligned_starts(q_len, 128), aligned_starts(kv_len, 128)
    rows = aligned_rows(int(lq.sum()), 9, int(lq.max()), 128)
    seqs, work = packed.packed_tables(q_len, kv_len, qs, ks, causal=causal, q_rows=rows)
    seqs, work = np.asarray(seqs), np.asarray(work)
    np.testing.assert_array_equal(seqs[0] * 128, np.asarray(qs))
    np.testing.assert_array_equal(seqs[2:], np.stack([lq, lk]))
    items = [(int(b), int(m)) for b, m in work.T if b >= 0]
    want = [(b, m) for b in range(9) for m in range(-(-int(lq[b]) // 128))]
    assert sorted(items) == sorted(want)
    assert work.shape[1] == rows // 128 and np.all(work[0, len(items) :] == -1)

    def cost(b, m):
        n = -(-int(lk[b]) // 128)
        return min(n, (min((m + 1) * 128, int(lq[b])) - 1) // 128 + 1) if causal else n

    costs = [cost(b, m) for b, m in items]
    assert costs == sorted(costs, reverse=True)
