"""varlen_attention with traced cu_seqlens: rows outside [0, T_total) never act as keys
or queries, whatever the offsets say; the checked mode (check_offsets=True under checkify) reports them.

What it catches: unchecked offsets under jit, where a last offset beyond T_total gathers the last packed row
again and again (phantom keys) and changes the real rows' outputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jax_mxfp8 as mx
from jax_mxfp8.reference.varlen import sanitize_offsets
from tests.seeding_testutil import test_rng

T, N, H = 200, 2, 64  # the kernel path (emulated) takes bfloat16 with H 64 / 128
MAX = 256


@functools.cache
def _fn(impl: str, check: bool = False):
    extra = {"check_offsets": True} if check else {}

    def f(q, k, v, cu):
        return mx.varlen_attention(q, k, v, cu, cu, max_seqlen_q=MAX, max_seqlen_k=MAX, implementation=impl, **extra)

    return jax.jit(f)


def _inputs():
    rng = test_rng()
    q, k, v = (jnp.asarray(rng.standard_normal((T, N, H)), jnp.bfloat16) for _ in range(3))
    return q, k, v


def _run(impl, q, k, v, cu):
    return np.asarray(_fn(impl)(q, k, v, jnp.asarray(cu, jnp.int32)), np.float32)


@pytest.mark.parametrize("impl", ["xla", "emulated"])
def test_traced_offsets_outside_the_packed_rows_add_no_keys(impl):
    q, k, v = _inputs()
    want = _run(impl, q, k, v, [0, 100, T])
    # the last offset past T_total: before the fix the last row was repeated 60 times as extra keys
    np.testing.assert_array_equal(_run(impl, q, k, v, [0, 100, T + 60]), want)
    # a negative first offset: the sequence starts at row 0
    np.testing.assert_array_equal(_run(impl, q, k, v, [-40, 100, T]), want)
    # a non-monotonic offset is raised to its predecessor: an empty sequence, nothing overlaps
    np.testing.assert_array_equal(_run(impl, q, k, v, [0, 100, 60, T]), _run(impl, q, k, v, [0, 100, 100, T]))


def test_sanitize_offsets_is_identity_on_valid_offsets():
    cu = jnp.asarray([0, 0, 17, 64, 200], jnp.int32)
    np.testing.assert_array_equal(sanitize_offsets(cu, 200), cu)
    np.testing.assert_array_equal(sanitize_offsets(jnp.asarray([-3, 50, 20, 900]), 200), [0, 50, 50, 200])


def test_checked_mode_reports_bad_traced_offsets():
    q, k, v = _inputs()
    checked = checkify.checkify(_fn("xla", True))
    err, out = checked(q, k, v, jnp.asarray([0, 100, T], jnp.int32))
    assert err.get() is None
    np.testing.assert_array_equal(np.asarray(out, np.float32), _run("xla", q, k, v, [0, 100, T]))
    for bad, what in (([0, 100, T + 1], "non-decreasing offsets within"), ([0, 120, 60], "non-decreasing"),
                      ([-1, 100, T], "within [0, 200]")):  # fmt: skip
        err, _ = checked(q, k, v, jnp.asarray(bad, jnp.int32))
        assert err.get() is not None and what in err.get(), (bad, err.get())
        with pytest.raises(checkify.JaxRuntimeError, match="cu_seqlens_q"):
            err.throw()
    err, _ = checkify.checkify(
        jax.jit(
            lambda q, k, v, cu: mx.varlen_attention(
                q, k, v, cu, cu, max_seqlen_q=64, max_seqlen_k=64, implementation="xla", check_offsets=True
            )
        )
    )(q, k, v, jnp.asarray([0, 100, T], jnp.int32))
    assert "max_seqlen_q=64 is smaller than the longest sequence (100)" in err.get()
