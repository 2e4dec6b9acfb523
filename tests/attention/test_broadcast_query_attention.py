"""broadcast_query_attention: one query sequence against B key/value sequences.

The contract (ops/broadcast_attention.py): varlen_attention on the query tiled B times, O and dK, dV bit for
bit, dQ the float32 sum of the copies' gradients; checked against that tiling (the library's own op, on
each implementation) and against an independent float64 formulation (tests/attention/attention_oracle.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp8 as mx
from jax_mxfp8.ops.attention_core import square_sequence_major
from jax_mxfp8.ops.broadcast_attention import broadcast_query_attention
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import attention_fwd as afwd
from jax_mxfp8.primitives import attention_operands as operands
from jax_mxfp8.primitives import library
from tests.attention.attention_oracle import exact_attention, mx_attention, sqnr_db
from tests.attention.attention_testutil import fresh_rng
from tests.attention.broadcast_testutil import LK, NK, TQ, H, N, broadcast_fwd_bwd, broadcast_inputs

AGREEMENT_DB = 55.0  # vs the float64 emulation of the MX contract (as tests/attention/test_attention_varlen.py)
EXACT_DB = 20.0  # vs exact float64 attention (MXFP8 error: measured 23-36 dB at N(0, 1) inputs)


def test_float64_and_padded_form():
    """The packed and the padded key/value forms agree bit for bit, and both track float64 attention."""
    q, k, v, do, cu_k = broadcast_inputs(fresh_rng())
    o, dq, dk, dv = broadcast_fwd_bwd("xla", False)(q, k, v, do, cu_k)
    b, s = len(LK), 128
    kp = np.zeros((b, s, NK, H), np.float32)
    vp = np.zeros_like(kp)
    for i, (a, e) in enumerate(zip(np.asarray(cu_k[:-1]), np.asarray(cu_k[1:]), strict=True)):
        kp[i, : e - a], vp[i, : e - a] = np.asarray(k[a:e]), np.asarray(v[a:e])
    lens = jnp.asarray(LK, jnp.int32)
    f = lambda q, k, v: broadcast_query_attention(q, k, v, key_value_seq_lengths=lens, implementation="xla")
    o_p, vjp = jax.vjp(f, q, jnp.asarray(kp), jnp.asarray(vp))
    dq_p, dk_p, _ = vjp(do)
    np.testing.assert_array_equal(np.asarray(o_p), np.asarray(o))
    np.testing.assert_array_equal(np.asarray(dq_p), np.asarray(dq))
    tp = 64  # the emulation quantizes whole 32-row blocks: pad the query rows, mark them padding
    qt = np.zeros((b, tp, N, H))
    qt[:, :TQ] = np.asarray(q, np.float64)
    dop = np.zeros((b, tp, N, H))
    dop[:, :TQ] = np.asarray(do)
    mo, _, mdq, mdk, mdv = mx_attention(qt, kp, vp, dop, q_len=[TQ] * b, kv_len=list(LK))
    eo, _, edq, _, _ = exact_attention(qt, kp, vp, dop, q_len=np.full(b, TQ), kv_len=np.asarray(LK))
    assert sqnr_db(o, mo[:, :TQ]) > AGREEMENT_DB
    assert sqnr_db(dq, mdq[:, :TQ].sum(0)) > AGREEMENT_DB
    valid = lambda x: np.concatenate([np.asarray(x[i, :n]) for i, n in enumerate(LK)])
    assert sqnr_db(dk[: sum(LK)], valid(mdk)) > AGREEMENT_DB
    assert sqnr_db(dv[: sum(LK)], valid(mdv)) > AGREEMENT_DB
    np.testing.assert_array_equal(np.asarray(dk_p[:, 0]), np.asarray(dk[np.asarray(cu_k[:-1])]))
    np.testing.assert_array_equal(np.asarray(dk[sum(LK) :]), 0.0)  # rows in no sequence: no gradient
    assert sqnr_db(o, eo[:, :TQ]) > EXACT_DB and sqnr_db(dq, edq[:, :TQ].sum(0)) > EXACT_DB


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(query_rank=4), "query must have rank 3"),
        (dict(max_seqlen_k=None), "need max_seqlen_k"),
        (dict(key_value_seq_lengths=jnp.ones((3,), jnp.int32)), "key_value_seq_lengths is for padded"),
        (dict(heads=1), "not a multiple"),
    ],
)
def test_bad_inputs(kwargs, match):
    q, k, v, _, cu_k = broadcast_inputs(fresh_rng())
    if kwargs.pop("query_rank", 3) == 4:
        q = q[None]
    if kwargs.pop("heads", None):
        k, v = jnp.concatenate([k, k], 1), jnp.concatenate([v, v], 1)  # 2 KV heads for 2 query heads
        q = q[:, :1]
    args = dict(max_seqlen_k=max(LK), implementation="xla") | kwargs
    with pytest.raises(ValueError, match=match):
        broadcast_query_attention(q, k, v, cu_k, **args)


def _kernel_call_pair(path: str, causal: bool, p_scale: str):
    """attention_fwd with broadcast_q on one query row vs the same call on its tiled copy, NaN-poisoned outputs."""
    rng = fresh_rng()
    b, t, s = 3, 96, 128 if path == "emulated" else 256  # small on CPU (compile time)
    q = jnp.asarray(rng.standard_normal((1, N, t, H)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((b, NK, s, H)), jnp.bfloat16) for _ in range(2))
    sq = lambda x: mx.quantize(x, axis=(-2, -1), block="square", implementation="xla")
    ql, kl = jnp.full((b,), 90, jnp.int32), jnp.asarray([s, 70, 0], jnp.int32)  # one empty KV sequence
    k, v = (jnp.where(jnp.arange(s)[None, None, :, None] < kl[:, None, None, None], x, 0) for x in (k, v))
    # one program (eager dispatch compiles many small ones)
    ops = jax.jit(lambda q, k, v: operands.prepare(sq(q), sq(k), sq(v), scale=H**-0.5, q_len=ql, kv_len=kl))(q, k, v)
    tiled = dataclasses.replace(ops, q=jnp.broadcast_to(ops.q, (b,) + ops.q.shape[1:]), qs=jnp.tile(ops.qs, (b, 1, 1)))
    tp = ops.q.shape[2]
    kw = dict(causal=causal, t=tp, p_scale=p_scale, path=path)
    if path == "cuda":
        ok, why = library.kernels_runnable(afwd.ARCHS)  # loads the library: the _into hook is registered then
        assert ok, why
        poison = (jnp.full((b, tp, N, H), jnp.nan, jnp.bfloat16), jnp.full((b, N, tp), jnp.nan, jnp.float32))
        got = jax.jit(lambda ops, out: afwd.attention_fwd(ops, broadcast_q=True, out=out, **kw))(ops, poison)
    else:
        got = jax.jit(lambda ops: afwd.attention_fwd(ops, broadcast_q=True, **kw))(ops)
    want = jax.jit(lambda ops: afwd.attention_fwd(ops, **kw))(tiled)
    return [np.asarray(x, np.float32) for x in (*got, *want)]


def test_broadcast_q_call_emulated():
    o, lse, o_t, lse_t = _kernel_call_pair("emulated", True, "const")
    np.testing.assert_array_equal(o, o_t)
    np.testing.assert_array_equal(lse, lse_t)
    assert np.all(o[2] == 0) and np.all(np.isneginf(lse[2]))  # the empty KV sequence


@pytest.mark.gpu
@pytest.mark.parametrize("causal,p_scale", [(False, "const"), (True, "const"), (False, "block")])
def test_broadcast_q_kernel_reads_batch_zero(causal, p_scale):
    """The broadcast_q kernel on q (1, N, Tp, H) = the production kernel on its tiled copy, bit for bit, and it
    writes every output element (NaN-poisoned buffers)."""
    o, lse, o_t, lse_t = _kernel_call_pair("cuda", causal, p_scale)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    np.testing.assert_array_equal(o, o_t)
    np.testing.assert_array_equal(lse, lse_t)


def _bwd_call_pair(path: str, causal: bool, kv_lens=None, poison: bool = False):
    """The backward call with broadcast_q on one query row vs the production call on its tiled copy.

    kv_lens: the B key/value lengths (default: a full, a partial and an empty sequence). poison (path
    "cuda"): the broadcast call writes into NaN-filled dq, dk, dv, dq_sem buffers (the `_into` hook).
    Returns (got, want, ops): the calls' (dq, dk, dv) and the broadcast call's operands."""
    rng = fresh_rng()
    t, s = 96, 128 if path == "emulated" else 256  # small on CPU (compile time)
    kl = jnp.asarray([s, 70, 0] if kv_lens is None else kv_lens, jnp.int32)
    b = kl.shape[0]
    q = jnp.asarray(rng.standard_normal((1, t, N, H)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((b, s, NK, H)), jnp.bfloat16) for _ in range(2))
    do, o = (jnp.asarray(rng.standard_normal((b, t, N, H)), jnp.bfloat16) for _ in range(2))
    ql = jnp.full((b,), 90, jnp.int32)

    @jax.jit  # one program (eager dispatch compiles many small ones)
    def prepare(q, k, v, do, o):
        sq = lambda x, lens: square_sequence_major(x, lens, "up", path)  # noqa: E731
        qm, km, vm, dom = sq(q, ql[:1]), sq(k, kl), sq(v, kl), sq(do, ql)
        # the forward's LSE of these operands (any finite values would do for the bits comparison)
        kk = jnp.repeat(mx.dequantize(km, jnp.float32), N // NK, axis=2)
        logits = jnp.einsum("tnh,bsnh->bnts", mx.dequantize(qm, jnp.float32)[0], kk) * H**-0.5
        keep = jnp.arange(s)[None, None, None, :] < kl[:, None, None, None]
        if causal:
            keep = keep & (jnp.arange(s)[None, :] <= jnp.arange(t)[:, None])
        lse = jax.nn.logsumexp(jnp.where(keep, logits, -jnp.inf), axis=-1)
        return abwd.bwd_operands(qm, km, vm, dom, do, o, lse, None, q_len=ql, kv_len=kl, broadcast_q=True)

    ops = prepare(q, k, v, do, o)
    tiled = dataclasses.replace(ops, q=jnp.broadcast_to(ops.q, (b,) + ops.q.shape[1:]))
    var_b, _ = abwd.kernel_variant(head_dim=H, causal=causal, broadcast_q=True)
    # the tiled query on the same BF16-wgmma math (tune 17: production's schedule without sdp_fp8's FP8 S^T, dP^T)
    var_t, _ = abwd.kernel_variant(head_dim=H, causal=causal, tune=17)
    if path == "cuda" and not library.has_kernel(var_t.name):
        pytest.skip(f"{var_t.name} is not in the library (comparison schedules: build_library.py --with-tunes)")
    run = lambda var: jax.jit(lambda ops: abwd.attention_bwd(ops, variant=var, scale=H**-0.5, path=path))
    if poison:
        ok, why = library.kernels_runnable(("sm_90a",))  # loads the library: the _into hook is registered then
        assert ok, why
        nan = lambda shape: jnp.full(shape, jnp.nan, jnp.float32)
        kshape, tp = ops.k.shape, ops.q.shape[2]
        out = (nan(ops.q.shape), nan(kshape), nan(kshape), jnp.full((b, N, tp // 32), -1, jnp.int32))
        f = lambda ops, out: abwd.attention_bwd(ops, variant=var_b, scale=H**-0.5, path=path, out=out)
        got = jax.jit(f)(ops, out)
    else:
        got = run(var_b)(ops)
    want = run(var_t)(tiled)
    return [np.asarray(x) for x in got], [np.asarray(x) for x in want], ops


def _dq_order_bound(ops, causal: bool) -> np.ndarray:
    """(1, N, Tp, H) float64: how far two float32 sums of the same dQ partials (one per batch row and 128-key
    tile, as the kernels add them) can differ: 2 (m - 1) u tau sum_b |dSq_b| |K_b|, m the addends per
    element, u = 2^-24 (each order's error is at most (m - 1) u times the sum of |partials|, and the
    partials' sum of magnitudes is at most tau sum_b |dSq_b| |K_b|; |dSq| <= 1.125 |dS|: E4M3 with scale
    rule "up" rounds by at most 2^-4 and never saturates). dS in float64 from the call's operands."""
    f = lambda x: np.asarray(x, np.float64)
    q, k, v, do, lse, delta = f(ops.q)[0], f(ops.k), f(ops.v), f(ops.do), f(ops.lse), f(ops.delta)
    b, _, sp, _ = k.shape
    tp, tau = q.shape[1], H**-0.5
    kh = np.repeat(k, N // NK, axis=1)  # (B, N, Sp, H): query head n reads KV head n // G
    vh = np.repeat(v, N // NK, axis=1)
    keep = np.arange(sp)[None, None, None, :] < np.asarray(ops.lens[1])[:, None, None, None]
    if causal:
        keep = keep & (np.arange(sp)[None, :] <= np.arange(tp)[:, None])
    with np.errstate(invalid="ignore", over="ignore"):
        logits = tau * np.einsum("nth,bnsh->bnts", q, kh) - lse[..., None]
        p = np.where(keep & np.isfinite(lse)[..., None], np.exp(logits), 0.0)
    ds = p * (np.einsum("bnth,bnsh->bnts", do, vh) - delta[..., None])
    m = b * (sp // 128)
    mag = tau * np.einsum("bnts,bnsh->nth", 1.125 * np.abs(ds), np.abs(kh))[None]
    return 2 * (m - 1) * 2.0**-24 * mag


def _check_bwd_pair(got, want, ops, causal: bool):
    """dq: the per-row dq's sum within the float32 order bound; dk, dv: the production call's bits."""
    (dq, dk, dv), (dq_t, dk_t, dv_t) = got, want
    assert dq.shape == (1,) + dq_t.shape[1:] and np.all(np.isfinite(dq)) and np.all(np.isfinite(dk))
    np.testing.assert_array_equal(dk, dk_t)  # written once per CTA: the same bits
    np.testing.assert_array_equal(dv, dv_t)
    err = np.abs(np.asarray(dq, np.float64) - np.asarray(dq_t, np.float64).sum(0, keepdims=True))
    bound = _dq_order_bound(ops, causal)
    assert np.all(err <= bound), float(np.max(err - bound))
    assert np.all(dq[:, :, 90:] == 0)  # query rows >= q_len: no gradient
    lens = np.asarray(ops.lens[1])
    for i in np.flatnonzero(lens == 0):  # an empty KV sequence: no dk, dv (and nothing added to dq)
        assert np.all(dk[i] == 0) and np.all(dv[i] == 0)
    if lens.sum() == 0:
        assert np.all(dq == 0)


def test_broadcast_q_bwd_call_emulated():
    got, want, ops = _bwd_call_pair("emulated", True)
    _check_bwd_pair(got, want, ops, True)
    # the emulation: the float32 sum over the batch of the tiled call's dq (same per-row values)
    np.testing.assert_allclose(got[0], want[0].sum(0, keepdims=True), rtol=1e-6, atol=1e-6 * np.abs(want[0]).max())


def test_broadcast_q_dq_modes_have_no_variant():
    """The dQ modes keep the per-row path: no broadcast_q backward variant (the op's backward takes the
    XLA reference there), and the config refuses the combination."""
    for mode in (dict(dq_accum="fp16"), dict(deterministic=True)):
        variant, why = abwd.kernel_variant(head_dim=H, causal=False, broadcast_q=True, **mode)
        assert variant is None and "no dq_accum='fp16' or deterministic=True variant" in why
        with pytest.raises(ValueError, match="broadcast_q=True sums dQ"):
            abwd.registry.AttentionBwdConfig(head_dim=H, dq_store="red", broadcast_q=True, **mode)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "causal,kv_lens,poison",
    [(False, None, False), (True, None, False), (False, None, True), (True, (256,), True), (False, (0, 0), True)],
    ids=["lens", "causal-lens", "nan-poisoned", "causal-B1", "all-empty"],
)
def test_broadcast_q_bwd_kernel_reads_batch_zero(causal, kv_lens, poison):
    """The broadcast_q backward kernel on q (1, N, Tp, H): dk, dv = the production kernel's on its tiled copy
    bit for bit; dq (1, N, Tp, H) = that call's per-row dq summed over the batch, within the float32 order
    bound (both sum the same partials); poisoned: every output element written (dq zero-filled)."""
    got, want, ops = _bwd_call_pair("cuda", causal, kv_lens, poison)
    _check_bwd_pair(got, want, ops, causal)


def test_broadcast_q_call_shards_over_batch_and_vmaps():
    """The broadcast_q forward call (emulated) partitioned over batch and KV heads (the one query row whole
    on every device) and under vmap equals the plain call."""
    if len(jax.devices()) < 4:
        pytest.skip("needs the 8 CPU host devices of tests/conftest.py")
    rng = fresh_rng()
    sq = lambda shape: mx.quantize(jnp.asarray(rng.standard_normal(shape), jnp.bfloat16), axis=(-2, -1), block="square")
    b, t, s = 4, 64, 128
    ql, kl = jnp.full((b,), 100), jnp.asarray([128, 100, 37, 0])
    prepare = jax.jit(lambda q, k, v: operands.prepare(q, k, v, scale=H**-0.5, q_len=ql, kv_len=kl))
    ops = prepare(sq((1, 4, t, H)), sq((b, 2, s, H)), sq((b, 2, s, H)))
    call = lambda ops: afwd.attention_fwd(ops, causal=True, t=t, path="emulated", broadcast_q=True)
    want = jax.jit(call)(ops)
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    q4, b4, b3 = P(None, "model", None, None), P("data", "model", None, None), P("data", "model", None)
    specs = operands.AlignedOperands(q4, b4, b4, P(None, "model", None), b3, b3, b3, P(None, "data"))
    placed = jax.tree.map(lambda x, sp: jax.device_put(x, NamedSharding(mesh, sp)), ops, specs)
    got = jax.jit(call)(placed)
    mapped = jax.jit(jax.vmap(call))(jax.tree.map(lambda x: jnp.stack([x, x]), ops))
    for g, m, w in zip(got, mapped, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        np.testing.assert_array_equal(np.asarray(m[1]), np.asarray(w))


def test_broadcast_q_bwd_call_shards_over_batch():
    """The broadcast_q backward call (emulated) with the batch sharded: each device's call sums its own
    rows' dQ and the partition adds the devices' (psum over "data"); dk, dv bit for bit, dq (1, N, Tp, H)
    the plain call's within float32 reassociation; the one query row whole on every device."""
    if len(jax.devices()) < 4:
        pytest.skip("needs the 8 CPU host devices of tests/conftest.py")
    rng = fresh_rng()
    b, n, nk, t, s = 4, 4, 2, 128, 128
    bf = lambda shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    lens = jnp.stack([jnp.full((b,), 100, jnp.int32), jnp.asarray([128, 100, 37, 0], jnp.int32)])
    lse = jnp.asarray(rng.standard_normal((b, n, t)) + 4.0, jnp.float32)
    ops = abwd.BwdOperands(bf((1, n, t, H)), bf((b, nk, s, H)), bf((b, nk, s, H)), bf((b, n, t, H)), lse,
                           jnp.asarray(rng.standard_normal((b, n, t)), jnp.float32), lens)  # fmt: skip
    var, _ = abwd.kernel_variant(head_dim=H, causal=False, broadcast_q=True)
    call = jax.jit(lambda ops: abwd.attention_bwd(ops, variant=var, scale=H**-0.5, path="emulated"))
    want = call(ops)
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    q4, b4, b3 = P(None, "model", None, None), P("data", "model", None, None), P("data", "model", None)
    specs = abwd.BwdOperands(q4, b4, b4, b4, b3, b3, P(None, "data"))
    got = call(jax.tree.map(lambda x, sp: jax.device_put(x, NamedSharding(mesh, sp)), ops, specs))
    assert got[0].shape == (1, n, t, H)
    tol = 1e-6 * float(jnp.abs(want[0]).max())
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=0, atol=tol)
    for g, w in zip(got[1:], want[1:], strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
