"""One set of attention cases run over every implementation (the tokamax habit: a shared test base).

`AttentionImplementationCases` holds the cases; each subclass names one `implementation` of
jax_mxfp8.dot_product_attention / varlen_attention:
  "xla"       the reference (the contract's numerics);
  "emulated"  the Hopper kernel path with the kernel calls' XLA emulation (runs on CPU in CI);
  "cuda"      the kernel itself (marked gpu: the GPU machine only).
Every check compares against something the implementation under test did not produce: float64 unquantized
attention (tests/attention_emulation.exact_attention) and, for the kernel paths, the "xla" reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from tests.attention.attention_oracle import exact_attention, sqnr_db

# (b, t, s, n, n_kv, h, causal, lengths): small, but with GQA, MQA, causal, padding and T, S not multiples of 128
CASES = {
    "gqa": (2, 128, 160, 4, 2, 64, False, True),
    "mqa-causal": (1, 160, 160, 2, 1, 128, True, False),
    "mha-causal-lengths": (2, 96, 128, 2, 2, 64, True, True),
}


def _inputs(case, seed):
    b, t, s, n, n_kv, h, causal, lengths = case
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((b, s, n_kv, h)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((b, s, n_kv, h)), jnp.bfloat16)
    do = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16)
    q_len = jnp.asarray([t - 17 * i for i in range(b)], jnp.int32) if lengths else None
    kv_len = jnp.asarray([s - 29 * i for i in range(b)], jnp.int32) if lengths else None
    return q, k, v, do, q_len, kv_len


def _fwd_bwd(implementation, case, q, k, v, do, q_len, kv_len, config=None):
    causal = case[6]

    def f(q, k, v):
        return mx.dot_product_attention(
            q,
            k,
            v,
            is_causal=causal,
            query_seq_lengths=q_len,
            key_value_seq_lengths=kv_len,
            implementation=implementation,
            config=config,
        )

    o, vjp = jax.vjp(jax.jit(f), q, k, v)
    return (o, *vjp(do))


def _f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


class AttentionImplementationCases:
    """The cases; subclasses set IMPLEMENTATION."""

    IMPLEMENTATION: str = "xla"

    @pytest.mark.parametrize("name", sorted(CASES))
    def test_forward_and_gradients_against_float64_and_reference(self, name):
        case = CASES[name]
        q, k, v, do, q_len, kv_len = _inputs(case, seed=sum(map(ord, name)))
        got = _fwd_bwd(self.IMPLEMENTATION, case, q, k, v, do, q_len, kv_len)
        exact = exact_attention(
            *(_f64(x) for x in (q, k, v)), _f64(do), causal=case[6], q_len=q_len, kv_len=kv_len
        )
        o_exact, dq_e, dk_e, dv_e = exact[0], *exact[2:]
        rows = np.ones(q.shape[:2], bool) if q_len is None else np.arange(q.shape[1])[None] < np.asarray(q_len)[:, None]
        for what, g, e in zip(("o", "dq", "dk", "dv"), got, (o_exact, dq_e, dk_e, dv_e), strict=True):
            g = _f64(g)
            assert np.isfinite(g).all(), what
            floor = 20.0 if what == "o" else 14.0  # MXFP8 forward ~25-30 dB; gradients carry dO and dS quantization
            assert sqnr_db(g, e) >= floor, (what, sqnr_db(g, e))
        o = _f64(got[0])
        assert (o[~rows] == 0).all(), "query rows past the lengths must be 0"
        if self.IMPLEMENTATION != "xla":
            ref = _fwd_bwd("xla", case, q, k, v, do, q_len, kv_len)
            for what, g, r, gate in zip(("o", "dq", "dk", "dv"), got, ref, (40.0, 30.0, 30.0, 30.0), strict=True):
                assert sqnr_db(_f64(g), _f64(r)) >= gate, (what, sqnr_db(_f64(g), _f64(r)))
                # within 0.5 dB of the reference's distance to float64 (forward: the contract's gate)
            assert abs(sqnr_db(_f64(got[0]), o_exact) - sqnr_db(_f64(ref[0]), o_exact)) <= 0.5

    def test_block_p_scale(self):
        case = CASES["gqa"]
        q, k, v, do, q_len, kv_len = _inputs(case, seed=11)
        config = mx.AttentionConfig(p_scale="block")
        o = _fwd_bwd(self.IMPLEMENTATION, case, q, k, v, do, q_len, kv_len, config)[0]
        o_exact = exact_attention(*(_f64(x) for x in (q, k, v)), q_len=q_len, kv_len=kv_len)[0]
        assert sqnr_db(_f64(o), o_exact) >= 20.0

    def test_nan_stays_in_its_batch_row(self):
        case = CASES["gqa"]
        q, k, v, do, q_len, kv_len = _inputs(case, seed=5)
        k_bad = k.at[1, 3].set(jnp.nan)
        o = _f64(_fwd_bwd(self.IMPLEMENTATION, case, q, k_bad, v, do, q_len, kv_len)[0])
        o_clean = _f64(_fwd_bwd(self.IMPLEMENTATION, case, q, k, v, do, q_len, kv_len)[0])
        np.testing.assert_array_equal(o[0], o_clean[0])  # batch row 0 never sees the NaN key
        assert np.isnan(o[1, : int(q_len[1])]).any()  # the row holding it: NaN, not a silent number

    def test_varlen(self):
        lens = (77, 200, 32)
        rng = np.random.default_rng(3)
        total = sum(lens)
        q = jnp.asarray(rng.standard_normal((total, 2, 64)), jnp.bfloat16)
        k = jnp.asarray(rng.standard_normal((total, 1, 64)), jnp.bfloat16)
        v = jnp.asarray(rng.standard_normal((total, 1, 64)), jnp.bfloat16)
        cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
        kw = dict(max_seqlen_q=max(lens), max_seqlen_k=max(lens), is_causal=True)
        # one program (eager dispatch: hundreds of small ones on CI's CPU); cu closed over stays concrete
        varlen = jax.jit(lambda q, k, v: mx.varlen_attention(q, k, v, cu, cu, implementation=self.IMPLEMENTATION, **kw))
        got = _f64(varlen(q, k, v))
        for lo, hi in zip(np.asarray(cu)[:-1], np.asarray(cu)[1:], strict=True):
            e = exact_attention(*(_f64(x[lo:hi][None]) for x in (q, k, v)), causal=True)[0][0]
            assert sqnr_db(got[lo:hi], e) >= 20.0


class TestXla(AttentionImplementationCases):
    IMPLEMENTATION = "xla"


class TestEmulated(AttentionImplementationCases):
    IMPLEMENTATION = "emulated"


@pytest.mark.gpu
class TestCuda(AttentionImplementationCases):
    IMPLEMENTATION = "cuda"
