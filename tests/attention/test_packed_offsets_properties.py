"""The offsets rule of the public packed entry points (varlen_attention, broadcast_query_attention with packed
key/value), as properties over random offsets (hypothesis, bounded), through the public API only.

For random (B + 1,) offsets, often bad (decreasing, negative, past T_total, longer than max_seqlen):
  * concrete offsets raise a ValueError naming the offsets argument exactly when they break the documented
    rule (non-decreasing, within [0, T_total], no sequence longer than max_seqlen);
  * traced offsets give the answer of their sanitized form, bit for bit, with the sanitization modelled in
    NumPy (clamp to [0, T_total], then a running maximum);
  * each sequence's rows equal the op run on that sequence alone (traced offsets [start, end]), and rows in no
    sequence are 0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_mxfp8 as mx
from tests.attention.offsets_oracle import sanitized, valid

T, N, K, H, TQ = 96, 2, 1, 32, 40
PROPERTY = settings(max_examples=15, deadline=None, database=None, derandomize=True)


@functools.cache
def _operands():
    rng = np.random.default_rng(5)
    q = jnp.asarray(rng.standard_normal((T, N, H)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((T, K, H)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((T, K, H)), jnp.float32)
    q1 = jnp.asarray(rng.standard_normal((TQ, N, H)), jnp.float32)
    return q, k, v, q1


def _varlen(cu, max_len):
    q, k, v, _ = _operands()
    return mx.varlen_attention(q, k, v, cu, cu, max_seqlen_q=max_len, max_seqlen_k=max_len, implementation="xla")


def _broadcast(cu, max_len):
    _, k, v, q1 = _operands()
    return mx.broadcast_query_attention(q1, k, v, cu, max_seqlen_k=max_len, implementation="xla")


OPS = {"varlen_attention": (_varlen, "cu_seqlens_q"), "broadcast_query_attention": (_broadcast, "cu_seqlens_k")}


@functools.cache
def _traced(op: str, max_len: int):
    fn = OPS[op][0]
    jitted = jax.jit(lambda cu: fn(cu, max_len))
    return lambda cu: np.asarray(jitted(jnp.asarray(cu, jnp.int32)))


offsets = st.builds(
    lambda cu, sort: sorted(cu) if sort else cu,
    st.sampled_from([2, 4]).flatmap(lambda n: st.lists(st.integers(-30, T + 30), min_size=n, max_size=n)),
    st.booleans(),
)


@pytest.mark.parametrize("op", list(OPS))
@PROPERTY
@given(cu=offsets, short=st.booleans())
def test_concrete_offsets_raise_exactly_when_they_break_the_rule(op, cu, short):
    fn, name = OPS[op]
    max_len = 40 if short else T
    try:
        fn(jnp.asarray(cu, jnp.int32), max_len)
        raised = None
    except ValueError as e:
        raised = str(e)
    assert (raised is None) == valid(cu, T, max_len), (cu, max_len, raised)
    if raised is not None:
        assert raised.startswith(name) or raised.startswith(name.replace("cu_seqlens", "max_seqlen")), raised


@pytest.mark.parametrize("op", list(OPS))
@PROPERTY
@given(cu=offsets)
def test_traced_offsets_give_their_sanitized_answer_and_sequences_stay_apart(op, cu):
    got = _traced(op, T)(cu)
    s = sanitized(cu, T)
    np.testing.assert_array_equal(got, _traced(op, T)(s))
    for b in range(len(s) - 1):
        alone = _traced(op, T)([s[b], s[b + 1]])  # the sequence by itself (one-sequence offsets)
        if op == "varlen_attention":
            np.testing.assert_array_equal(got[s[b] : s[b + 1]], alone[s[b] : s[b + 1]])
        else:
            np.testing.assert_array_equal(got[b], alone[0])
            if s[b + 1] == s[b]:
                assert not np.any(got[b])  # an empty key sequence: 0
    if op == "varlen_attention":
        assert not np.any(got[: s[0]]) and not np.any(got[s[-1] :])  # rows in no sequence
