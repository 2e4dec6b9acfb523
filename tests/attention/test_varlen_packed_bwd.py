"""varlen_attention's backward on the packed backward kernel (registry PACKED; ops/varlen_kernel.py _packed_bwd):
the packed tables and the packed call's target, the route's agreement with the padded-batch route it
replaces, per-sequence isolation.

CPU: the call emulated (primitives/attention_bwd.py _emulate_packed: every sequence alone). GPU (marked): the
real packed kernel against the padded route on the same forward residuals (dk, dv bit for bit: the same
per-key-tile math; dq up to the order of its float32 reductions), and isolation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.ops import varlen_kernel
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.attention_bwd import packed_tile_table
from tests.attention.varlen_testutil import packed_inputs

CASE = dict(lq=(100, 0, 300, 37), lk=(130, 0, 260, 37), n=4, n_kv=2, h=64, causal=True)


def test_packed_tile_table():
    """The forward's per-sequence table (first query tile, first KV tile, query length, KV length) and the key
    tiles' work list in key-tile order: (sequence, key tile inside it), (-1, 0) where no sequence has keys."""
    q_len, kv_len = jnp.array([100, 0, 300, 37]), jnp.array([130, 0, 260, 37])
    q_start, kv_start = jnp.array([0, 128, 128, 512]), jnp.array([0, 256, 256, 640])
    seqs, work = (np.asarray(x) for x in packed_tile_table(q_len, kv_len, q_start, kv_start, 896, causal=False))
    np.testing.assert_array_equal(seqs, [[0, 1, 1, 4], [0, 2, 2, 5], [100, 0, 300, 37], [130, 0, 260, 37]])
    want = np.array(
        [
            [0, 0, 2, 2, 2, 3, -1],  # tiles 0-1: sequence 0; 2-4: 2 (1 is empty); 5: 3; 6: none
            [0, 1, 0, 1, 2, 0, 0],
        ]
    )
    np.testing.assert_array_equal(work, want)
    assert seqs.dtype == work.dtype == np.int32


def test_packed_tile_table_causal_longest_first():
    """Causal: the key tiles sorted by the 64-row query tiles they visit (key tile t of a sequence: its query
    tiles 2 t .. ceil(q_len / 64) - 1), the most first, ties in key-tile order; the padding tile last as (-1,
    its key tile). By hand for the case above: tile 0 (sequence 0, t 0) visits 2, tile 1 (0, 1) 0, tile 2
    (2, 0) 5, tile 3 (2, 1) 3, tile 4 (2, 2) 1, tile 5 (3, 0) 1, tile 6 none."""
    q_len, kv_len = jnp.array([100, 0, 300, 37]), jnp.array([130, 0, 260, 37])
    q_start, kv_start = jnp.array([0, 128, 128, 512]), jnp.array([0, 256, 256, 640])
    seqs, work = (np.asarray(x) for x in packed_tile_table(q_len, kv_len, q_start, kv_start, 896, causal=True))
    np.testing.assert_array_equal(seqs, [[0, 1, 1, 4], [0, 2, 2, 5], [100, 0, 300, 37], [130, 0, 260, 37]])
    want = np.array(
        [
            [2, 2, 0, 2, 3, 0, -1],  # key tiles 2, 3, 0, 4, 5, 1, 6
            [0, 1, 0, 2, 0, 1, 6],
        ]
    )
    np.testing.assert_array_equal(work, want)
    assert work.dtype == np.int32


def test_packed_call_takes_its_tables_and_target():
    """A packed variant's call lowers to jax_mxfp8_attention_bwd_packed with seqs and work in lens' place (15
    operands), and a packed variant refuses dense lens (and a dense one the tables), and tables of the other
    work-list order (causal: longest first)."""
    h, tp, n, f8 = 64, 256, 2, jnp.float8_e4m3fn
    zeros = lambda shape, dt=jnp.bfloat16: jnp.zeros(shape, dt)  # noqa: E731
    fp8 = abwd.SdpFp8Operands(
        zeros((1, n, tp, h), f8), zeros((1, 1, tp, h), f8), zeros((1, 1, tp, h), f8), zeros((1, n, tp, h), f8),
        *(jnp.ones(s, jnp.float32) for s in ((1, n, tp // 32), (1, 1, tp // 32), (1, 1, tp // 32), (1, n, tp // 32))),
    )  # fmt: skip
    tables = packed_tile_table(
        jnp.array([100, 90]), jnp.array([120, 100]), jnp.array([0, 128]), jnp.array([0, 128]), tp, causal=True
    )
    ops = abwd.BwdOperands(
        zeros((1, n, tp, h)), zeros((1, 1, tp, h)), None, zeros((1, n, tp, h)), zeros((1, n, tp), jnp.float32),
        zeros((1, n, tp), jnp.float32), tables, fp8,
    )  # fmt: skip
    variant = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=True, packed=True)
    run = jax.jit(lambda o: abwd.attention_bwd(o, variant=variant, scale=0.125, path="cuda"))
    text = run.trace(ops).lower(lowering_platforms=("cuda",)).as_text()
    call = next(line for line in text.splitlines() if "@jax_mxfp8_attention_bwd_packed(" in line)
    operands = call.split("@jax_mxfp8_attention_bwd_packed(", 1)[1].split(")", 1)[0].split(",")
    assert len(operands) == 15, call
    dense = jnp.stack([jnp.array([tp]), jnp.array([tp])]).astype(jnp.int32)
    with pytest.raises(ValueError, match="PackedTables"):
        abwd.attention_bwd(
            abwd.BwdOperands(*ops.args()[:3], ops.do, ops.lse, ops.delta, dense, fp8), variant=variant, scale=1.0
        )
    plain = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=True)
    with pytest.raises(ValueError, match="lens \\(2, B\\)"):
        abwd.attention_bwd(ops, variant=plain, scale=1.0)
    # the work list's order must be the variant's: a key-tile-order list on a causal variant (or the reverse)
    # would zero the dk, dv rows of the wrong tiles, so the call refuses it
    key_order = packed_tile_table(
        jnp.array([100, 90]), jnp.array([120, 100]), jnp.array([0, 128]), jnp.array([0, 128]), tp, causal=False
    )
    with pytest.raises(ValueError, match="causal=True"):
        abwd.attention_bwd(dataclasses.replace(ops, lens=key_order), variant=variant, scale=1.0)
    non_causal = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=False, packed=True)
    with pytest.raises(ValueError, match="causal=False"):
        abwd.attention_bwd(ops, variant=non_causal, scale=1.0)


def _grads(case, q, k, v, cu_q, cu_k, ct, impl):
    @jax.jit
    def run(q, k, v, ct):
        f = lambda q, k, v: jax_mxfp8.varlen_attention(
            q, k, v, cu_q, cu_k, max_seqlen_q=max(case["lq"]), max_seqlen_k=max(case["lk"]),
            is_causal=case["causal"], implementation=impl,
        )  # fmt: skip
        return jax.vjp(f, q, k, v)[1](ct)

    return [np.asarray(g, np.float32) for g in run(q, k, v, ct)]


def _both_routes(monkeypatch, case, impl, rng):
    """Gradients of the packed backward and of the padded route (packed_variant -> None), same inputs."""
    q, k, v, cu_q, cu_k = packed_inputs(rng, case["lq"], case["lk"], case["n"], case["n_kv"], case["h"])
    ct = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    calls = []
    real = varlen_kernel._packed_bwd
    monkeypatch.setattr(varlen_kernel, "_packed_bwd", lambda *a: calls.append(1) or real(*a))
    packed = _grads(case, q, k, v, cu_q, cu_k, ct, impl)
    assert calls, "the packed backward did not run"
    monkeypatch.setattr(kbwd, "packed_variant", lambda *a: None)
    padded = _grads(case, q, k, v, cu_q, cu_k, ct, impl)
    return packed, padded, (q, k, v, cu_q, cu_k, ct)


def test_packed_backward_equals_padded_route(monkeypatch):
    """Emulated: the packed route's gradients and the padded route's on the same inputs (both the reference's
    math per sequence; XLA's float32 sums differ in order between the two shapes, so not bits)."""
    packed, padded, _ = _both_routes(monkeypatch, CASE, "emulated", np.random.default_rng(11))
    for name, a, b in zip("qkv", packed, padded, strict=True):
        assert np.isfinite(a).all() and np.abs(a).max() > 0, name
        assert sqnr_db(b.astype(np.float64), a.astype(np.float64)) >= 60.0, name
        np.testing.assert_array_equal(a[-5:], 0.0)  # rows in no sequence


def _isolation(case, impl):
    """A NaN key in sequence 2 (rows 100..399 of q; its keys 130..389): every other sequence's gradients are
    bit-identical to the clean run's, and its own are NaN."""
    rng = np.random.default_rng(5)
    q, k, v, cu_q, cu_k = packed_inputs(rng, case["lq"], case["lk"], case["n"], case["n_kv"], case["h"])
    ct = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    base = _grads(case, q, k, v, cu_q, cu_k, ct, impl)
    got = _grads(case, q, k.at[200].set(jnp.nan), v, cu_q, cu_k, ct, impl)
    rows = {"q": (np.r_[0:100, 400:437], slice(100, 400)), "kv": (np.r_[0:130, 390:427], slice(130, 390))}
    for name, a, b in zip("qkv", got, base, strict=True):
        others, own = rows["q" if name == "q" else "kv"]
        np.testing.assert_array_equal(a[others], b[others], err_msg=f"d{name}: another sequence moved")
        assert np.isnan(a[own]).any(), f"d{name}: the NaN key did not reach its own sequence"


def test_packed_backward_isolates_sequences():
    _isolation(CASE, "emulated")


# --------------------------------------------------------------------------------------------------- GPU
def _needs_gpu():
    ok, why = library.kernels_runnable(("sm_90a",))
    if not ok:
        pytest.skip(why)


GPU_CASES = [CASE, dict(lq=(1000, 129, 2048, 64), lk=(1000, 129, 2048, 64), n=8, n_kv=2, h=128, causal=False)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=["h64_causal", "h128"])
def test_packed_kernel_backward_equals_padded_route(monkeypatch, case):
    """The packed kernel and the dense kernel on the padded batch, on the same packed forward's residuals: dk,
    dv bit for bit (the same per-key-tile math and order; the dense production's dv_f16 equals this bfloat16
    dO path bit for bit within 22 binades), dq up to its float32 reduction order and bfloat16 rounding; and
    >= 35 dB from the XLA reference route."""
    _needs_gpu()
    packed, padded, (q, k, v, cu_q, cu_k, ct) = _both_routes(monkeypatch, case, "cuda", np.random.default_rng(13))
    np.testing.assert_array_equal(packed[1], padded[1], err_msg="dk")
    np.testing.assert_array_equal(packed[2], padded[2], err_msg="dv")
    # dq: float32 reductions in another order, then rounded to bfloat16 (a last float32 bit can flip a bfloat16
    # rounding): 97.8 dB measured at H128 (call 4); a wrong tile or mask is far below 60
    assert sqnr_db(padded[0].astype(np.float64), packed[0].astype(np.float64)) >= 60.0
    ref = _grads(case, q, k, v, cu_q, cu_k, ct, "xla")
    for name, a, r in zip("qkv", packed, ref, strict=True):
        db = sqnr_db(r.astype(np.float64), a.astype(np.float64))
        print(f"d{name}: {db:.1f} dB vs the XLA reference")
        assert db >= 35.0, name


@pytest.mark.gpu
def test_packed_kernel_backward_isolates_sequences():
    _needs_gpu()
    _isolation(CASE, "cuda")
