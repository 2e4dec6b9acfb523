"""The Hopper attention kernel's numerics, checked on CPU through its XLA emulation.

jax_mxfp8.primitives.attention_fwd.prepare (the producer pass the kernel consumes) and emulate_fwd (the
kernel's arithmetic: re-encoded operands, exp2 with max offset 8, per-tile V exponents) against
  * the XLA reference with the same config: O and LSE SQNR >= 40 dB (the gate for the kernel);
  * unquantized float64 attention: within 0.5 dB of the reference's own SQNR.
The GPU tests (test_attention_kernel_gpu.py) then hold the kernel to this emulation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.formats.decode import decode_elements
from jax_mxfp8.primitives import attention_layout as layout
from jax_mxfp8.primitives import attention_operands as operands
from tests.attention.attention_kernel_testutil import case_id, case_inputs, emulated, kernel_inputs, square_mx
from tests.attention.attention_oracle import exact_attention, sqnr_db
from tests.attention.attention_testutil import fresh_rng


@jax.jit
def _prepare_jit(a):
    """operands.prepare(a, a, a) with scale 1 and no lengths, under one jit (the CPU tests' call site)."""
    return operands.prepare(a, a, a, scale=1.0, q_len=None, kv_len=None)


CASES = [
    dict(b=1, t=256, s=256, n=2, n_kv=2, h=128, causal=False),
    dict(b=1, t=256, s=384, n=4, n_kv=2, h=64, causal=False),
    dict(b=2, t=320, s=320, n=2, n_kv=1, h=128, causal=True),
    dict(b=2, t=256, s=256, n=2, n_kv=2, h=64, causal=True, lengths=True),
    dict(b=1, t=256, s=256, n=2, n_kv=1, h=128, causal=False, outlier_channels=8.0),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_emulation_matches_reference(case):
    rng = fresh_rng()
    q, k, v, case, causal, lengths = case_inputs(case, rng)
    b, t, s = case["b"], case["t"], case["s"]
    q_len = kv_len = None
    if lengths:
        q_len = jnp.asarray(rng.integers(1, t + 1, b), jnp.int32)
        kv_len = jnp.asarray(rng.integers(1, s + 1, b), jnp.int32)
    # each side under one jit (eager dispatch compiles hundreds of small XLA programs on CI's CPU)
    o_e, lse_e = jax.jit(lambda q, k, v, ql, kl: emulated(q, k, v, causal=causal, q_len=ql, kv_len=kl))(
        q, k, v, q_len, kv_len
    )
    o_r, lse_r = jax.jit(lambda q, k, v, ql, kl: mx.dot_product_attention(
        q, k, v, is_causal=causal, query_seq_lengths=ql, key_value_seq_lengths=kl,
        implementation="xla", return_residual="lse",
    ))(q, k, v, q_len, kv_len)  # fmt: skip
    f64 = [np.asarray(x, np.float64) for x in (q, k, v)]
    o_x, lse_x = exact_attention(*f64, causal=causal, q_len=None if q_len is None else np.asarray(q_len),
                                 kv_len=None if kv_len is None else np.asarray(kv_len))[:2]  # fmt: skip
    o_e, o_r = np.asarray(o_e, np.float64), np.asarray(o_r, np.float64)
    lse_e, lse_r = np.asarray(lse_e, np.float64), np.asarray(lse_r, np.float64)
    assert not np.isnan(o_e).any()
    np.testing.assert_array_equal(np.isneginf(lse_e), np.isneginf(lse_r))
    fin = np.isfinite(lse_r)
    assert sqnr_db(o_e, o_r) >= 40.0
    assert sqnr_db(lse_e[fin], lse_r[fin]) >= 40.0
    assert abs(sqnr_db(o_e, o_x) - sqnr_db(o_r, o_x)) <= 0.5


def test_prepare_is_exact_where_blocks_share_a_scale():
    """Equal block scales across a row block: Q' == Q^ and K' == K^ bit for bit; V'^T is V^ permuted."""
    rng = fresh_rng()
    x = rng.uniform(1.0, 1.75, (1, 2, 128, 128)).astype(np.float32)  # every block amax in [1, 2): one scale
    x *= np.where(rng.random(x.shape) < 0.5, -1.0, 1.0)
    a = square_mx(jnp.asarray(x))
    assert len(np.unique(np.asarray(a.scale))) == 1
    ops = _prepare_jit(a)
    for y in (ops.q, ops.k):
        np.testing.assert_array_equal(np.asarray(y).view(np.uint8), np.asarray(a.data).view(np.uint8))
    perm = layout.pv_permutation()
    vt = np.asarray(ops.vt).view(np.uint8).reshape(1, 2, 128, 4, 32)
    want = np.asarray(a.data).view(np.uint8).swapaxes(-1, -2).reshape(1, 2, 128, 4, 32)[..., perm]
    np.testing.assert_array_equal(vt, want)
    e = int(np.asarray(a.scale).flat[0]) - 127
    np.testing.assert_array_equal(np.asarray(ops.ks), np.float32(2.0**e))
    np.testing.assert_array_equal(np.asarray(ops.vs) * np.asarray(ops.vi), 1.0)


def test_prepare_realigns_to_the_row_maximum():
    """A block 2^3 smaller than its row's largest is re-rounded 3 binades down, from its MX elements."""
    x = np.ones((1, 1, 32, 64), np.float32)
    x[..., 32:] = (1 + np.arange(32) / 32)[None, None, :, None] / 8
    a = square_mx(jnp.asarray(x))
    ops = _prepare_jit(a)
    sc = np.asarray(a.scale).astype(int) - 127
    d = np.asarray(decode_elements(a.data))
    got = np.asarray(decode_elements(ops.q))[..., :32, :]  # rows past T are padding
    shift = 2.0 ** (sc[..., 0, 1] - sc[..., 0, 0])
    want = np.asarray(jnp.asarray(d[..., 32:] * shift).astype(jnp.float8_e4m3fn).astype(jnp.float32))
    np.testing.assert_array_equal(got[..., 32:], want)
    np.testing.assert_array_equal(got[..., :32], d[..., :32])
    assert float(np.asarray(ops.qs).flat[0]) == np.float32(np.log2(np.e)) * 2.0 ** sc[..., 0, 0].max()


def test_nan_block_propagates_like_reference():
    rng = fresh_rng()
    q, k, v = kernel_inputs(rng, 1, 128, 128, 1, 1, 64)
    k = k.at[0, 5, 0, 3].set(jnp.nan)
    o_e, _ = jax.jit(lambda q, k, v: emulated(q, k, v, causal=False))(q, k, v)
    o_r = jax.jit(lambda q, k, v: mx.dot_product_attention(q, k, v, implementation="xla"))(q, k, v)
    np.testing.assert_array_equal(np.isnan(np.asarray(o_e)), np.isnan(np.asarray(o_r, np.float32)))
    assert np.isnan(np.asarray(o_e)).all()


def test_kernel_choice_falls_back_where_not_covered():
    from jax_mxfp8.ops.attention_core import kernel_unsupported

    base = dict(head_dim=128, is_causal=False, has_bias=False, has_mask=False, out_dtype=jnp.bfloat16, mx_inputs=[])
    assert kernel_unsupported(mx.AttentionConfig(), **base) is None
    assert kernel_unsupported(mx.AttentionConfig(scale_rounding="floor"), **base) is None
    assert kernel_unsupported(mx.AttentionConfig(p_scale="block"), **base) is None
    block = mx.AttentionConfig(p_scale="block")
    assert kernel_unsupported(block, **{**base, "is_causal": True, "head_dim": 64}) is None
    assert "floor" in kernel_unsupported(mx.AttentionConfig(p_scale="block", scale_rounding="floor"), **base)
    assert "qkv_blocks" in kernel_unsupported(mx.AttentionConfig(qkv_blocks="row"), **base)
    assert "kv_tile" in kernel_unsupported(mx.AttentionConfig(kv_tile=64), **base)
    assert "bias" in kernel_unsupported(mx.AttentionConfig(), **{**base, "has_bias": True})
    assert kernel_unsupported(mx.AttentionConfig(), **{**base, "out_dtype": jnp.float32}) is None
    assert "float16" in kernel_unsupported(mx.AttentionConfig(), **{**base, "out_dtype": jnp.float16})
    assert "head_dim=256" in kernel_unsupported(mx.AttentionConfig(), **{**base, "head_dim": 256})
    if jax.default_backend() != "gpu":
        with pytest.raises(RuntimeError, match="implementation='cuda'"):
            q = jnp.zeros((1, 32, 1, 64), jnp.bfloat16)
            mx.dot_product_attention(q, q, q, implementation="cuda")
