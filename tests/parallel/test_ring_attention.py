"""Ring attention (context parallelism) on 8 CPU devices: equals single-device MXFP8 attention.

Forward: O differs from the single device only through the P~ quantization (each ring step quantizes
exp(S - m) against its own running max m), a rounding as large as the P quantization itself, so the pinned
floors are (a) ring vs single-device SQNR, and (b) ring and single device equally close to float64 exact
attention (within 0.5 dB, the contract's kernel-vs-reference rule). With P quantization switched off, the
ring equals the single device to float32 rounding, which checks the LSE merge and the gradient routing
exactly. Measured figures: docs/distributed.md.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp8 as mx
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.parallel import ring_attention
from tests.attention.attention_oracle import exact_attention
from tests.attention.attention_testutil import lib_fwd_bwd
from tests.parallel.sharding_testutil import COLLECTIVE, mesh, put

NAMES = ("o", "lse", "dq", "dk", "dv")


def _collectives(hlo_text):
    return [(c["op"], c["shape"]) for c in COLLECTIVE.finditer(hlo_text)]


def _inputs(seed, b, t, s, n, n_kv, h, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, n, h)).astype(dtype)
    k = rng.standard_normal((b, s, n_kv, h)).astype(dtype)
    v = rng.standard_normal((b, s, n_kv, h)).astype(dtype)
    do = rng.standard_normal((b, t, n, h)).astype(dtype)
    dlse = rng.standard_normal((b, n, t)).astype(np.float32)
    return q, k, v, do, dlse


def _ring_fwd_bwd(m, q, k, v, do, dlse=None, *, batch_axis=None, head_axis=None, **kw):
    """Ring O, LSE, dQ, dK, dV (for the cotangent (do, dlse)) as jax arrays, and the compiled HLO text."""
    b, t, n, _ = q.shape
    dlse = np.zeros((b, n, t), np.float32) if dlse is None else dlse
    spec = (batch_axis, "seq", head_axis)
    args = [put(x, m, *spec) for x in (q, k, v, do)] + [put(dlse, m, batch_axis, head_axis, "seq")]

    def run(q, k, v, do, dlse):
        def f(q, k, v):
            return ring_attention(
                q, k, v, mesh=m, axis_name="seq", batch_axis=batch_axis, head_axis=head_axis, return_residual=True, **kw
            )

        (o, lse), vjp = jax.vjp(f, q, k, v)
        return (o, lse, *vjp((do.astype(o.dtype), dlse)))

    compiled = jax.jit(run).lower(*args).compile()
    return compiled(*args), compiled.as_text()


# (mesh shape, mesh axis names, batch_axis, head_axis, is_causal, load_balance, (B, T, S, N, K, H), dtype)
CASES = [
    pytest.param((8,), ("seq",), None, None, False, True, (1, 256, 512, 4, 2, 64), np.float32, id="noncausal_gqa_s2t"),
    pytest.param((8,), ("seq",), None, None, True, True, (2, 512, 512, 4, 2, 64), np.float32, id="causal_zigzag_gqa"),
    pytest.param(
        (2, 4),
        ("data", "seq"),
        "data",
        None,
        True,
        False,
        (2, 256, 256, 2, 1, 64),
        jnp.bfloat16,
        id="causal_contig_bf16",
    ),
    pytest.param(
        (2, 4), ("model", "seq"), None, "model", True, True, (2, 512, 512, 4, 2, 64), np.float32, id="causal_zigzag_tp"
    ),
]

# Floors (dB), a few dB under the measured values (docs/distributed.md), same for every case.
RING_VS_SINGLE = {"o": 29.0, "lse": 120.0, "dq": 36.0, "dk": 36.0, "dv": 70.0}
F64_TOLERANCE_DB = 0.5


@pytest.mark.parametrize("shape,names,batch_axis,head_axis,causal,balance,dims,dtype", CASES)
def test_ring_matches_single_device(shape, names, batch_axis, head_axis, causal, balance, dims, dtype):
    m = mesh(shape, names)
    q, k, v, do, _ = _inputs(sum(dims) + causal + balance, *dims, dtype=dtype)
    ring, hlo = _ring_fwd_bwd(
        m, q, k, v, do, batch_axis=batch_axis, head_axis=head_axis, is_causal=causal, load_balance=balance
    )

    # Layout and dtypes: outputs and gradients stay sequence-sharded, in the input dtype.
    o, lse, dq, dk, dv = ring
    spec = P(batch_axis, "seq", head_axis)
    for x in (o, dq, dk, dv):
        assert x.dtype == dtype
        assert x.sharding.is_equivalent_to(NamedSharding(m, spec), 4), x.sharding
    assert lse.dtype == jnp.float32 and lse.shape == (dims[0], dims[3], dims[1])
    # Only collective-permutes (ring steps, zigzag reordering), and K/V move as packed FP8 bytes.
    ops = {op for op, _ in _collectives(hlo)}
    assert ops == {"collective-permute"}, ops
    b, _, s, _, n_kv, h = dims
    local = (b // (m.shape[batch_axis] if batch_axis else 1), n_kv // (m.shape[head_axis] if head_axis else 1))
    kv_bytes = f"u32[{local[0]},{local[1]},{s // m.shape['seq']},{h // 4}]"  # one device's K (or V) in FP8
    assert any(cs.startswith(kv_bytes) for _, cs in _collectives(hlo)), (kv_bytes, _collectives(hlo))

    ring = [np.asarray(x, np.float64) for x in ring]
    single = lib_fwd_bwd(q, k, v, do, is_causal=causal)
    exact = exact_attention(q, k, v, do, causal=causal)
    for name, r, s1, e in zip(NAMES, ring, single, exact, strict=True):
        assert np.all(np.isfinite(r)), name
        db = sqnr_db(s1, r)
        assert db >= RING_VS_SINGLE[name], (name, db)
        if name != "lse":
            assert sqnr_db(e, r) >= sqnr_db(e, s1) - F64_TOLERANCE_DB, (name, sqnr_db(e, r), sqnr_db(e, s1))


@pytest.fixture
def no_p_quantization(monkeypatch):
    """Softmax probabilities unquantized in the reference forward and backward (for one test)."""

    def identity(p, axis, p_scale, scale_rounding):
        return p

    for mod in ("jax_mxfp8.reference.attention_fwd", "jax_mxfp8.reference.attention_bwd"):
        monkeypatch.setattr(sys.modules[mod], "fake_quant_p", identity)
    jax.clear_caches()  # no compiled program of the real numerics may be reused, nor this one kept
    yield
    jax.clear_caches()


def test_ring_is_exact_without_p_quantization(no_p_quantization):
    """The LSE merge and the dQ / dK / dV routing reproduce the single device to float32 rounding.

    The LSE cotangent is nonzero (its path dS += P dLSE is covered), the config is qkv_blocks="row" (four
    quantizations of K and V travel around the ring), and token magnitudes vary over decades (log-normal), so that a
    block layout that differed from the single device's would show.
    """
    m = mesh((8,), ("seq",))
    q, k, v, do, dlse = _inputs(7, 1, 512, 512, 4, 2, 64)
    rng = np.random.default_rng(8)
    q, k, v = (x * np.exp(2.5 * rng.standard_normal(x.shape[:2] + (1, 1))).astype(np.float32) for x in (q, k, v))
    config = mx.AttentionConfig(qkv_blocks="row")
    ring, _ = _ring_fwd_bwd(m, q, k, v, do, dlse, is_causal=True, config=config)

    def single(q, k, v):
        def f(q, k, v):
            return mx.dot_product_attention(q, k, v, is_causal=True, config=config, return_residual="lse")

        (o, lse), vjp = jax.vjp(f, q, k, v)
        return (o, lse, *vjp((jnp.asarray(do), jnp.asarray(dlse))))

    ref = jax.jit(single)(q, k, v)
    floors = {"o": 110.0, "lse": 120.0, "dq": 75.0, "dk": 75.0, "dv": 100.0}
    for name, r, s1 in zip(NAMES, ring, ref, strict=True):
        assert sqnr_db(s1, r) >= floors[name], (name, sqnr_db(s1, r))


def test_bad_inputs_rejected():
    m = mesh((8,), ("seq",))
    x = jnp.zeros((1, 512, 2, 64), jnp.float32)

    def call(q=x, k=x, v=x, **kw):
        kw = {"mesh": m, "axis_name": "seq", **kw}
        return ring_attention(q, k, v, **kw)

    # Chunks must be multiples of 32: 256 / 8 devices = 32 is fine without load balancing, but the
    # load-balanced causal layout needs 2 * 8 chunks of >= 32.
    y = jnp.zeros((1, 256, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match=r"query sequence length 256 .* multiple of 512"):
        call(y, y, y, is_causal=True)
    with pytest.raises(ValueError, match=r"query sequence length 320"):
        z = jnp.zeros((1, 320, 2, 64), jnp.float32)
        call(z, z, z)
    with pytest.raises(ValueError, match=r"key sequence length 288"):
        z = jnp.zeros((1, 288, 2, 64), jnp.float32)
        call(y, z, z)
    with pytest.raises(ValueError, match="equal to query length"):
        call(y, x, x, is_causal=True, load_balance=False)
    with pytest.raises(ValueError, match="axis_name"):
        call(axis_name="model")
    with pytest.raises(ValueError, match="head_axis"):
        call(head_axis="model")
    with pytest.raises(ValueError, match="cannot also split"):
        call(head_axis="seq")
    with pytest.raises(ValueError, match="value must have key's shape"):
        call(v=y)
    with pytest.raises(ValueError, match="rank 4"):
        call(q=x[0])
    with pytest.raises(ValueError, match="head_dim"):
        w = jnp.zeros((1, 512, 2, 48), jnp.float32)
        call(w, w, w)
    with pytest.raises(ValueError, match="MXArray"):
        call(q=mx.quantize(x))
    with pytest.raises(ValueError, match="heads"):
        call(k=jnp.zeros((1, 512, 3, 64)), v=jnp.zeros((1, 512, 3, 64)))
