"""The packed-sequence Hopper attention kernel (varlen_attention, implementation="cuda") on the GPU.

The packed variant runs the dense kernel's tile code with per-sequence tile offsets and a work list, so
per sequence it must give the dense kernel's bits on the padded batch; it must also meet the 40 dB gate
against the XLA reference, write every row of every sequence's query tiles (NaN-poisoned buffers), keep
sequences isolated (a NaN or a huge V in one sequence changes no other sequence's bits) and be
deterministic. Fresh random inputs for every check.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.ops import attention_core as dense_ops
from jax_mxfp8.ops import varlen_kernel
from jax_mxfp8.primitives import attention_fwd as afwd
from jax_mxfp8.primitives import attention_packed as packed
from tests.attention.attention_oracle import sqnr_db
from tests.attention.attention_testutil import fresh_rng
from tests.attention.varlen_testutil import dense_kernel_on_padded, packed_inputs

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90_attention_fwd")]


CASES = [
    dict(lq=(100, 0, 300, 37), lk=(100, 0, 300, 37), n=4, n_kv=2, h=128, causal=False),
    dict(lq=(100, 0, 300, 37), lk=(100, 0, 300, 37), n=4, n_kv=2, h=128, causal=True),
    dict(lq=(257, 128, 31, 1000), lk=(64, 300, 200, 999), n=2, n_kv=1, h=128, causal=False),
    dict(lq=(129, 1, 256, 700), lk=(129, 5, 256, 700), n=4, n_kv=4, h=64, causal=True),
    dict(lq=(640, 33, 2048), lk=(700, 40, 2048), n=2, n_kv=2, h=64, causal=False),
    dict(lq=(257, 128, 31, 1000), lk=(64, 300, 200, 999), n=2, n_kv=1, h=128, causal=True, p_scale="block"),
]


def _id(c):
    lq = "_".join(map(str, c["lq"]))
    return f"lq{lq}-h{c['h']}-n{c['n']}k{c['n_kv']}-c{int(c['causal'])}-{c.get('p_scale', 'const')}"


def _packed(rng, c):
    return packed_inputs(rng, c["lq"], c["lk"], c["n"], c["n_kv"], c["h"], slack=7)


def _varlen(c, impl):
    return jax.jit(
        lambda q, k, v, cu_q, cu_k: mx.varlen_attention(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max_seqlen_q=max(c["lq"]),
            max_seqlen_k=max(c["lk"]),
            is_causal=c["causal"],
            implementation=impl,
            config=mx.AttentionConfig(p_scale=c.get("p_scale", "const")),
        )
    )


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_packed_kernel_equals_dense_kernel_and_meets_the_gate(case):
    rng = fresh_rng()
    args = _packed(rng, case)
    got = np.asarray(_varlen(case, "cuda")(*args), np.float32)
    dense = np.asarray(jax.jit(lambda *a: dense_kernel_on_padded(case, *a))(*args), np.float32)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, dense)  # same tile code, same operand bytes
    ref = np.asarray(_varlen(case, "xla")(*args), np.float64)
    assert sqnr_db(ref, got.astype(np.float64)) >= 40.0
    np.testing.assert_array_equal(got[sum(case["lq"]) :], 0.0)  # rows in no sequence


def test_packed_kernel_writes_every_row_of_its_tiles():
    """NaN-filled output buffers: every row of every sequence's query tiles is written (0 / -inf past the
    sequence's length), and O, LSE equal the emulation's on the sequences' rows."""
    rng = fresh_rng()
    c = dict(lq=(300, 0, 129, 64), lk=(200, 10, 0, 500), n=4, n_kv=2, h=128, causal=True)
    q, k, v, cu_q, cu_k = _packed(rng, c)
    st = varlen_kernel.VarlenStatic(
        dense=dense_ops.AttentionStatic(
            config=mx.AttentionConfig(),
            scale=128**-0.5,
            is_causal=True,
            is_mx=(False,) * 3,
            out_dtype=np.dtype(jnp.bfloat16),
            group=2,
            impl="cuda",
        ),
        max_q=300,
        max_k=500,
        total_q=q.shape[0],
        total_k=k.shape[0],
    )
    _, ops, work, lq = varlen_kernel.prepare_packed(st, q, k, v, cu_q, cu_k)
    rows, n = lq.rows, 4
    poison = (jnp.full((1, rows, n, 128), jnp.nan, jnp.bfloat16), jnp.full((1, n, rows), jnp.nan, jnp.float32))
    o, lse = jax.jit(lambda ops, w, out: afwd.attention_fwd_packed(ops, w, causal=True, out=out))(ops, work, poison)
    o_e, lse_e = packed.emulate_packed_fwd(ops, causal=True)
    o = np.asarray(o, np.float32)[0]  # (rows, N, H)
    lse, o_e, lse_e = np.asarray(lse)[0], np.asarray(o_e)[0].transpose(1, 0, 2), np.asarray(lse_e)[0]
    starts, lens = np.asarray(lq.starts), np.asarray(c["lq"])
    klens = np.asarray(c["lk"])
    for b in range(4):
        tiles = slice(starts[b], starts[b] + -(-lens[b] // 128) * 128)
        assert not np.isnan(o[tiles]).any() and not np.isnan(lse[:, tiles]).any()
        valid = slice(starts[b], starts[b] + lens[b])
        past = slice(starts[b] + lens[b], tiles.stop)
        np.testing.assert_array_equal(o[past], 0.0)
        assert np.all(np.isneginf(lse[:, past]))
        if lens[b] and klens[b]:
            # as in test_attention_kernel_gpu: FP8 wgmma accumulation and ex2.approx differ from the float32
            # emulation, so dB bounds, not bits (the bits are checked against the dense kernel above)
            assert sqnr_db(o_e[valid].astype(np.float64), o[valid].astype(np.float64)) >= 40.0
            fin = np.isfinite(lse_e[:, valid])
            np.testing.assert_array_equal(np.isfinite(lse[:, valid]), fin)
            assert sqnr_db(lse_e[:, valid][fin].astype(np.float64), lse[:, valid][fin].astype(np.float64)) >= 40.0
        else:  # no key: O = 0, LSE = -inf on its rows
            np.testing.assert_array_equal(o[valid], 0.0)
            assert np.all(np.isneginf(lse[:, valid]))


def test_packed_kernel_isolates_sequences_and_is_deterministic():
    rng = fresh_rng()
    c = dict(lq=(200, 77, 300, 500), lk=(200, 77, 300, 500), n=2, n_kv=1, h=128, causal=False)
    q, k, v, cu_q, cu_k = _packed(rng, c)
    f = _varlen(c, "cuda")
    base = np.asarray(f(q, k, v, cu_q, cu_k), np.float32)
    for _ in range(19):
        assert np.asarray(f(q, k, v, cu_q, cu_k), np.float32).tobytes() == base.tobytes()
    s1 = slice(200, 277)
    v2 = v.at[s1].set(v[s1] * jnp.bfloat16(2.0**70))
    k2 = k.at[210].set(jnp.nan)
    got = np.asarray(f(q, k2, v2, cu_q, cu_k), np.float32)
    others = np.r_[0:200, 277 : sum(c["lq"])]
    np.testing.assert_array_equal(got[others], base[others])
    assert np.isnan(got[s1]).all()


def test_packed_kernel_gradients():
    """The backward (dot_product_attention's, on residuals gathered to the padded batch) against the XLA path."""
    rng = fresh_rng()
    c = dict(lq=(300, 100, 37), lk=(300, 100, 37), n=2, n_kv=2, h=128, causal=True)
    q, k, v, cu_q, cu_k = _packed(rng, c)
    ct = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    grads = [jax.vjp(lambda *a, i=impl: _varlen(c, i)(*a, cu_q, cu_k), q, k, v)[1](ct) for impl in ("cuda", "xla")]
    for a, b in zip(*grads, strict=True):
        assert sqnr_db(np.asarray(b, np.float64), np.asarray(a, np.float64)) >= 30.0
