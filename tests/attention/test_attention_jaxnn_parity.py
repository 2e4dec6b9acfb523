"""jax.nn.dot_product_attention parity: the cases of jax's own tests/nn_test.py dot_product_attention tests
(testDotProductAttention, testDotProductAttentionMask, testDotProductAttentionBiasGradient: same shapes,
dtypes, GQA groups, vmap, mask modes, sliding windows) re-run with jax_mxfp8.dot_product_attention as the
answer and jax.nn's XLA path as the reference, with MX-sized tolerances; plus local_window_size,
return_residual (jax.nn's (B, T, N) layout, dtype and stopped gradient) and the documented fully-masked-row
difference.

Tolerance: jax's own tests compare cuDNN to XLA at atol/rtol 0.01-0.02. MXFP8 quantizes Q, K, V, P (and
dO, dS in the backward) to E4M3 (3 mantissa bits), so elementwise tolerances that tight do not apply; each
array is compared by its relative error ||ours - ref|| / ||ref|| (MAX_REL below). jax's test matrix is
thinned (dtype x groups x vmap combinations that repeat a covered path are left out); the cases marked
slow run in CI too.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx

B, T, S, N, H = 2, 128, 128, 4, 32
MAX_REL = {"out": 0.08, "dq": 0.11, "dk": 0.11, "dv": 0.09, "dbias": 0.09}
"""Relative-error bounds, ~1.5x the largest measured over all these cases (jax 0.10.2, CPU): out 0.054,
dq 0.072, dk 0.070, dv 0.057, dbias 0.055 (smallest: out 0.039, dq 0.053). A wrong mask, window or bias
gives errors of order 1."""


def _rel(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30))


def _check(name: str, ours, ref):
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, (name, ours.shape, ref.shape, ours.dtype, ref.dtype)
    assert np.all(np.isfinite(np.asarray(ours, np.float32))), name
    err = _rel(ours, ref)
    if os.environ.get("JAX_MXFP8_PRINT_ERRORS"):
        print(f"REL {name} {err:.4f}")
    assert err < MAX_REL[name], (name, err)


def _qkv(dtype, n_kv=N, key=0):
    ks = jax.random.split(jax.random.key(key), 5)
    q = jax.random.normal(ks[0], (B, T, N, H), dtype)
    k = jax.random.normal(ks[1], (B, S, n_kv, H), dtype)
    v = jax.random.normal(ks[2], (B, S, n_kv, H), dtype)
    do = jax.random.normal(ks[3], (B, T, N, H), dtype)
    return q, k, v, do, ks[4]


def _fwd_bwd(fn, args, do, n_grads):
    out, vjp = jax.vjp(fn, *args)
    return out, vjp(do)[:n_grads]


# ------------------------------------------------------------------------- testDotProductAttention cases
@pytest.mark.parametrize(
    "dtype,groups,use_vmap",
    [
        pytest.param(jnp.bfloat16, 1, False, marks=pytest.mark.slow),
        (jnp.float16, 2, True),
        pytest.param(jnp.bfloat16, 4, True, marks=pytest.mark.slow),
    ],
)
def test_gqa_and_vmap(dtype, groups, use_vmap):
    q, k, v, do, _ = _qkv(dtype, n_kv=N // groups)
    ours = mx.dot_product_attention
    if use_vmap:
        ours = jax.vmap(ours, in_axes=(0, 0, 0))
    out, (dq, dk, dv) = _fwd_bwd(ours, (q, k, v), do, 3)
    ref, (rq, rk, rv) = _fwd_bwd(jax.nn.dot_product_attention, (q, k, v), do, 3)
    for name, a, r in (("out", out, ref), ("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        _check(name, a, r)


# --------------------------------------------------------------------- testDotProductAttentionMask cases
MASK_MODES = [
    "bias",
    "causal",
    "padding",
    "custom",
    ("causal", "padding"),
    ("custom", "padding"),
    ("bias", "causal"),
    ("causal", "sliding_window"),
]
FAST_MODES = {("causal", "padding"), ("causal", "sliding_window")}


@pytest.mark.parametrize(
    "mode", [m if m in FAST_MODES else pytest.param(m, marks=pytest.mark.slow) for m in MASK_MODES], ids=str
)
def test_mask_modes(mode):
    mode = (mode,) if isinstance(mode, str) else mode
    q, k, v, do, kb = _qkv(jnp.bfloat16)
    bias = mask = q_len = kv_len = window = None
    is_causal = "causal" in mode
    if "padding" in mode:
        q_len, kv_len = jnp.array([T // 2, T // 4], jnp.int32), jnp.array([S // 4, S // 2], jnp.int32)
    if "custom" in mode:
        mask = jnp.tril(jnp.ones((T, S), bool))[None, None]
    if "bias" in mode:
        bias = jax.random.normal(kb, (1, N, T, S), jnp.bfloat16)
    if "sliding_window" in mode:
        window = (3, 2) if is_causal else (3, 0)

    def call(attn, q, k, v, bias):
        return attn(
            q,
            k,
            v,
            bias,
            mask,
            is_causal=is_causal,
            query_seq_lengths=q_len,
            key_value_seq_lengths=kv_len,
            local_window_size=window,
        )

    n = 4 if bias is not None else 3
    args = (q, k, v, bias)
    out, grads = _fwd_bwd(functools.partial(call, mx.dot_product_attention), args, do, n)
    ref, rgrads = _fwd_bwd(functools.partial(call, jax.nn.dot_product_attention), args, do, n)
    _check("out", out, ref)
    for name, a, r in zip(("dq", "dk", "dv", "dbias"), grads, rgrads):
        _check(name, a, r)


# -------------------------------------------------------------- testDotProductAttentionBiasGradient cases
@pytest.mark.parametrize(
    "batch,use_vmap",
    [(1, False), pytest.param(16, True, marks=pytest.mark.slow)],
)
def test_bias_gradient(batch, use_vmap):
    ks = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(ks[0], (batch, S, N, H), jnp.bfloat16)
    bias = jax.random.normal(ks[1], (batch, N, S, S), jnp.bfloat16)
    mask = jnp.ones((1, 1, S), bool)

    def attention(impl, x, bias, mask):
        return impl(x, x, x, bias=bias, mask=mask)

    fns = [functools.partial(attention, f) for f in (mx.dot_product_attention, jax.nn.dot_product_attention)]
    if use_vmap:
        fns = [jax.vmap(f, in_axes=(0, 0, None)) for f in fns]
    (out, (dx, db)), (ref, (rx, rb)) = (_fwd_bwd(lambda x, b, f=f: f(x, b, mask), (x, bias), x, 2) for f in fns)
    _check("out", out, ref)
    _check("dq", dx, rx)
    _check("dbias", db, rb)


# ------------------------------------------------------------------------------------- local_window_size
@pytest.mark.parametrize(
    "window,is_causal",
    [
        ((3, 2), False),
        ((16, 0), True),
        (5, False),
        ((0, 7), False),
    ],
)
def test_local_window_size(window, is_causal):
    q, k, v, do, _ = _qkv(jnp.bfloat16)
    kw = dict(is_causal=is_causal, local_window_size=window)
    out, grads = _fwd_bwd(lambda *a: mx.dot_product_attention(*a, **kw), (q, k, v), do, 3)
    ref, rgrads = _fwd_bwd(lambda *a: jax.nn.dot_product_attention(*a, **kw), (q, k, v), do, 3)
    _check("out", out, ref)
    for name, a, r in zip(("dq", "dk", "dv"), grads, rgrads):
        _check(name, a, r)
    # the window really masks: a key outside every query's window does not change the output
    left, right = (window, window) if isinstance(window, int) else window
    if right < S - 1:
        # key S-1 is seen only by queries t >= S - 1 - right; negating its value keeps every MX block scale
        far = v.at[:, -1].multiply(-1)
        delta = mx.dot_product_attention(q, k, far, **kw) - out
        seen = np.arange(T) >= S - 1 - right
        assert np.all(np.asarray(delta)[:, ~seen] == 0) and np.any(np.asarray(delta)[:, seen] != 0)
    # the kernel never takes a window: the reason says so
    with pytest.raises(ValueError, match="sliding-window"):
        mx.dot_product_attention(q, k, v, implementation="emulated", **kw)


def test_bad_window_and_residual_arguments():
    q, k, v, _, _ = _qkv(jnp.bfloat16)
    for bad in (-1, (1,), (1, 2, 3), (1.5, 2), "3", (True, 1)):
        with pytest.raises(ValueError, match="local_window_size"):
            mx.dot_product_attention(q, k, v, local_window_size=bad)
    with pytest.raises(ValueError, match="return_residual"):
        mx.dot_product_attention(q, k, v, return_residual="bnt")


# --------------------------------------------------------------------------------------- return_residual
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_return_residual_is_jax_nns(dtype):
    q, k, v, do, _ = _qkv(dtype)
    kw = dict(is_causal=True, query_seq_lengths=jnp.array([T, T // 2], jnp.int32))
    out, res = mx.dot_product_attention(q, k, v, return_residual=True, **kw)
    ref, rres = jax.nn.dot_product_attention(q, k, v, return_residual=True, **kw)
    assert res.shape == rres.shape == (B, T, N) and res.dtype == rres.dtype == dtype
    valid = np.arange(T)[None, :, None] < np.array([T, T // 2])[:, None, None]
    valid = np.broadcast_to(valid, res.shape)
    r, rr = np.asarray(res, np.float64), np.asarray(rres, np.float64)
    assert np.max(np.abs(r - rr)[valid]) < 0.1  # the LSE of MX-quantized logits; ~4-5 in magnitude here
    # our float32 (B, N, T) LSE is the same numbers, transposed
    _, lse = mx.dot_product_attention(q, k, v, return_residual="lse", **kw)
    assert lse.shape == (B, N, T) and lse.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(jnp.swapaxes(lse, 1, 2).astype(dtype)), np.asarray(res))
    # unbatched: (T, N)
    _, res1 = mx.dot_product_attention(q[0], k[0], v[0], return_residual=True)
    assert res1.shape == (T, N)


def test_return_residual_gradient_is_stopped_like_jax_nn():
    q, k, v, _, _ = _qkv(jnp.float32)
    for attn in (mx.dot_product_attention, jax.nn.dot_product_attention):
        g = jax.grad(lambda q, a=attn: jnp.sum(a(q, k, v, return_residual=True)[1]))(q)
        assert np.all(np.asarray(g) == 0), attn
    # with the residual's cotangent ignored, the output's gradient is that of return_residual=False
    g_out = jax.grad(lambda q: jnp.sum(mx.dot_product_attention(q, k, v) ** 2))(q)
    g_both = jax.grad(lambda q: jnp.sum(mx.dot_product_attention(q, k, v, return_residual=True)[0] ** 2))(q)
    np.testing.assert_array_equal(np.asarray(g_out), np.asarray(g_both))
    # the "lse" residual keeps its gradient (sum over keys of softmax * dS: nonzero)
    g_lse = jax.grad(lambda q: jnp.sum(mx.dot_product_attention(q, k, v, return_residual="lse")[1]))(q)
    assert np.any(np.asarray(g_lse) != 0)


def test_fully_masked_rows_differ_from_jax_nn_as_documented():
    """A query row with no valid key: 0 and LSE -inf here; jax.nn's XLA path: mean of V and a finite LSE."""
    q, k, v, _, _ = _qkv(jnp.float32)
    mask = jnp.ones((1, 1, T, S), bool).at[:, :, 5, :].set(False)
    out, res = mx.dot_product_attention(q, k, v, mask=mask, return_residual=True)
    ref, rres = jax.nn.dot_product_attention(q, k, v, mask=mask, return_residual=True)
    assert np.all(np.asarray(out)[:, 5] == 0) and np.all(np.isneginf(np.asarray(res)[:, 5]))
    np.testing.assert_allclose(np.asarray(ref)[:, 5], np.asarray(v).mean(axis=1), rtol=1e-4, atol=1e-5)
    assert np.all(np.isfinite(np.asarray(rres)[:, 5])) and np.all(np.asarray(rres)[:, 5] < -1e30)
    keep = np.arange(T) != 5  # every other row agrees within MX tolerance
    assert _rel(np.asarray(out)[:, keep], np.asarray(ref)[:, keep]) < MAX_REL["out"]
