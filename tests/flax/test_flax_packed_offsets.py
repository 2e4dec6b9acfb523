"""The Flax packed (jagged) attention path takes its offsets by one rule whatever the precision: MXFP8
(varlen_attention) and the BF16 policy (a padded batch through jax.nn) raise the same ValueError for bad
concrete offsets or a max_seqlen shorter than a sequence, and give the answer of the sanitized offsets for
bad traced ones (RoPE positions included). Checked for MXAttention, TransformerBlock and
functional.jagged_attention, with fixed cases and bounded hypothesis properties against a NumPy model of the
sanitization (clamp to [0, T_total], then a running maximum)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_mxfp8.flax as mf
from jax_mxfp8.flax import functional as F
from tests.attention.offsets_oracle import sanitized, valid

T, D = 192, 64
PRECISIONS = {"mxfp8": mf.MXFP8, "bf16": mf.BF16}
PROPERTY = settings(max_examples=30, deadline=None, database=None, derandomize=True)


@functools.cache
def _attention(precision: str) -> mf.MXAttention:
    return mf.MXAttention(D, 2, precision=PRECISIONS[precision], rngs=nnx.Rngs(0))


@functools.cache
def _x() -> jax.Array:
    return jax.random.normal(jax.random.key(1), (T, D), jnp.float32)


@functools.cache
def _traced(precision: str, max_len: int):
    """The attention layer jitted with the offsets as a traced argument."""
    graph, state = nnx.split(_attention(precision))

    @jax.jit
    def f(state, x, cu):
        return nnx.merge(graph, state)(x, cu_seqlens=cu, max_seqlen=max_len)

    return lambda cu: np.asarray(f(state, _x(), jnp.asarray(cu, jnp.int32)))


def _checked_call(layer, cu) -> None:
    """The layer's call with concrete offsets, traced abstractly (the checks run on the concrete offsets, the
    attention is not computed)."""
    offsets = jnp.asarray(cu, jnp.int32)  # concrete: made outside the trace
    jax.eval_shape(lambda x: layer(x, cu_seqlens=offsets, max_seqlen=T), _x())


def _error(fn) -> str | None:
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize(
    "cu, max_len, match",
    [
        ([0, 64, 32, 192], 160, r"cu_seqlens=\[0, 64, 32, 192\] must be non-decreasing offsets within \[0, 192\]"),
        ([0, 64, 192], 100, r"max_seqlen=100 is smaller than the longest sequence \(128\)"),
        ([0, 64, 200], 160, r"within \[0, 192\]"),
        ([-1, 64, 192], 160, r"within \[0, 192\]"),
        ([[0, 64, 192]], 160, "cu_seqlens must be an integer array of shape"),
        ([0.0, 64.0, 192.0], 160, "cu_seqlens must be an integer array"),
        ([0, 64, 192], 0, "max_seqlen=0"),
        ([0, 64, 192], 128.0, "max_seqlen=128.0"),
    ],
)
def test_bad_concrete_offsets_raise_the_same_error_on_every_precision(cu, max_len, match):
    cu = jnp.asarray(cu)
    for name in PRECISIONS:
        with pytest.raises(ValueError, match=match):
            _attention(name)(_x(), cu_seqlens=cu, max_seqlen=max_len)
    q = jnp.zeros((T, 2, 32))
    jagged = lambda p: F.jagged_attention(q, q, q, cu, max_len, p, is_causal=True)  # noqa: E731
    messages = {_error(lambda p=p: jagged(p)) for p in PRECISIONS.values()}
    assert len(messages) == 1 and messages != {None}, messages
    block = mf.TransformerBlock(D, 2, policy=mf.PrecisionPolicy.bf16(), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=match):
        block(_x(), cu_seqlens=cu, max_seqlen=max_len)


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_bad_traced_offsets_give_the_sanitized_offsets_answer(precision):
    bad = [0, 64, 32, 192]
    np.testing.assert_array_equal(_traced(precision, T)(bad), _traced(precision, T)(sanitized(bad, T)))
    np.testing.assert_array_equal(_traced(precision, T)([-5, 100, 400]), _traced(precision, T)([0, 100, 192]))


@pytest.mark.parametrize("precision", list(PRECISIONS))
@PROPERTY
@given(data=st.data())
def test_offsets_property(precision, data):
    """Random (often bad) offsets: concrete ones raise exactly when they break the rule (the same message on
    every precision), traced ones give the answer of their NumPy-sanitized form."""
    b = data.draw(st.sampled_from([1, 3]), label="B")  # two shapes of offsets: two compilations per precision
    cu = data.draw(st.lists(st.integers(-20, T + 20), min_size=b + 1, max_size=b + 1), label="cu")
    if data.draw(st.booleans(), label="sorted"):
        cu = sorted(cu)
    layer = _attention(precision)
    good = valid(cu, T, T)
    err = _error(lambda: _checked_call(layer, cu))
    assert (err is None) == good, (cu, err)
    if not good:
        other = "bf16" if precision == "mxfp8" else "mxfp8"
        assert err == _error(lambda: _checked_call(_attention(other), cu))
    s = sanitized(cu, T)
    got = _traced(precision, T)(cu)
    np.testing.assert_array_equal(got, _traced(precision, T)(s))
    assert np.all(got[: s[0]] == 0) and np.all(got[s[-1] :] == 0)  # rows outside every sequence
