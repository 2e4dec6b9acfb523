"""The Hopper MXFP8 attention forward kernel (sm_90a) against the XLA reference, float64, and its emulation.

Gates: O and LSE SQNR >= 40 dB against the reference with the same config; SQNR against
float64 within 0.5 dB of the reference's; outputs fully written (NaN-poisoned buffers); bit-identical
across 20 runs. Fresh random inputs for every check (tests/attention/attention_testutil.fresh_rng). The same gates
for AttentionConfig(p_scale="block") (one P scale per row and KV tile; CPU proofs in
test_attention_kernel_pblock.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import attention_fwd as afwd
from jax_mxfp8.primitives import attention_operands as operands
from jax_mxfp8.primitives import library
from tests.attention.attention_kernel_testutil import (
    case_id,
    case_inputs,
    emulated,
    kernel_inputs,
    sink_inputs,
    square_mx,
)
from tests.attention.attention_oracle import exact_attention, sqnr_db
from tests.attention.attention_testutil import fresh_rng

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90_attention_fwd")]


def _run(q, k, v, impl, **kw):
    f = jax.jit(lambda q, k, v: mx.dot_product_attention(q, k, v, implementation=impl, return_residual="lse", **kw))
    o, lse = f(q, k, v)
    return np.asarray(o, np.float64), np.asarray(lse, np.float64)


CASES = [
    dict(b=2, t=512, s=512, n=4, n_kv=4, h=128, causal=False),
    dict(b=2, t=512, s=512, n=4, n_kv=4, h=128, causal=True),
    dict(b=1, t=384, s=640, n=4, n_kv=2, h=64, causal=False),
    dict(b=1, t=640, s=640, n=4, n_kv=1, h=64, causal=True),
    dict(b=3, t=256, s=384, n=2, n_kv=1, h=128, causal=False, lengths=True),
    dict(b=3, t=320, s=320, n=2, n_kv=2, h=128, causal=True, lengths=True),
    dict(b=1, t=2048, s=2048, n=2, n_kv=2, h=128, causal=True),
    dict(b=1, t=512, s=512, n=2, n_kv=1, h=128, causal=False, outlier_channels=8.0),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_matches_reference(case):
    rng = fresh_rng()
    q, k, v, case, causal, lengths = case_inputs(case, rng)
    kw = dict(is_causal=causal)
    _check_against_reference(q, k, v, rng, case, causal, lengths, kw, min_db=40.0)


def test_outlier_channels_cost_of_realignment():
    """Channels 30x larger than the rest: Q/K row blocks realigned 5 binades down lose precision (measured,
    recorded in docs/numerics.md; the bound here is that measurement's floor, not the 40 dB gate)."""
    rng = fresh_rng()
    case = dict(b=1, t=512, s=512, n=2, n_kv=1, h=128)
    q, k, v = kernel_inputs(rng, **case, outlier_channels=30.0)
    _check_against_reference(q, k, v, rng, case, False, False, dict(is_causal=False), min_db=35.0)


BLOCK = mx.AttentionConfig(p_scale="block")
BLOCK_CASES = [CASES[i] for i in (0, 1, 2, 3, 5, 6)]


@pytest.mark.parametrize("case", BLOCK_CASES, ids=case_id)
def test_block_p_scale_kernel_matches_reference(case):
    rng = fresh_rng()
    q, k, v, case, causal, lengths = case_inputs(case, rng)
    kw = dict(is_causal=causal, config=BLOCK)
    _check_against_reference(q, k, v, rng, case, causal, lengths, kw, min_db=40.0)


def test_block_p_scale_where_const_loses():
    """The long-context attention sink of test_attention_kernel_pblock: most of P's mass lies near or below
    the constant scale's smallest E4M3 subnormal; the block-scaled kernel keeps it.

    "const" is not held to the 40 dB gate here: on this input its P tail sits at E4M3's subnormal rounding
    edge (P~ ~ 2^-18.8 against a half-step of 2^-18), where the kernel's logits (FP8 wgmma accumulation,
    ex2.approx) and the reference's flip different elements between 0 and 2^-9. First GPU run: const kernel
    26.8 dB from the const reference and 22.8 dB vs float64 against the reference's 26.1 (the CPU emulation
    matches the reference there: docs/numerics.md). The bounds below are that measurement's floor."""
    q, k, v = sink_inputs(fresh_rng(), 32768)
    o_x, _ = exact_attention(*[np.asarray(x, np.float64) for x in (q, k, v)], causal=False)
    d64 = {}
    for config in (mx.AttentionConfig(), BLOCK):
        o_k, lse_k = _run(q, k, v, "cuda", config=config)
        o_r, lse_r = _run(q, k, v, "xla", config=config)
        s_o, s_lse = sqnr_db(o_k, o_r), sqnr_db(lse_k, lse_r)
        d64[config.p_scale] = sqnr_db(o_k, o_x)
        print(f"{config.p_scale}: O {s_o:.1f} dB, LSE {s_lse:.1f} dB vs reference; float64: kernel "
              f"{d64[config.p_scale]:.2f}, reference {sqnr_db(o_r, o_x):.2f} dB")  # fmt: skip
        if config.p_scale == "block":
            assert s_o >= 40.0 and s_lse >= 40.0
            assert abs(d64["block"] - sqnr_db(o_r, o_x)) <= 0.5
        else:
            assert s_o >= 25.0 and s_lse >= 40.0
    assert d64["block"] >= d64["const"] + 4.0


def _check_against_reference(q, k, v, rng, case, causal, lengths, kw, min_db):
    if lengths:
        kw["query_seq_lengths"] = jnp.asarray(rng.integers(0, case["t"] + 1, case["b"]), jnp.int32)
        kw["key_value_seq_lengths"] = jnp.asarray(rng.integers(0, case["s"] + 1, case["b"]), jnp.int32)
    o_k, lse_k = _run(q, k, v, "cuda", **kw)
    o_r, lse_r = _run(q, k, v, "xla", **kw)
    o_e, lse_e = emulated(q, k, v, causal=causal, q_len=kw.get("query_seq_lengths"),
                          kv_len=kw.get("key_value_seq_lengths"), config=kw.get("config"))  # fmt: skip
    o_x, _ = exact_attention(*[np.asarray(x, np.float64) for x in (q, k, v)], causal=causal,
                             q_len=None if not lengths else np.asarray(kw["query_seq_lengths"]),
                             kv_len=None if not lengths else np.asarray(kw["key_value_seq_lengths"]))  # fmt: skip
    assert not np.isnan(o_k).any() and not np.isnan(lse_k).any()
    np.testing.assert_array_equal(np.isneginf(lse_k), np.isneginf(lse_r))
    np.testing.assert_array_equal(o_k[np.isneginf(lse_k).transpose(0, 2, 1)], 0.0)
    fin = np.isfinite(lse_r)
    s_o, s_lse = sqnr_db(o_k, o_r), sqnr_db(lse_k[fin], lse_r[fin])
    s_emu = sqnr_db(o_k, np.asarray(o_e, np.float64))
    d64 = sqnr_db(o_k, o_x) - sqnr_db(o_r, o_x)
    print(
        f"O {s_o:.1f} dB, LSE {s_lse:.1f} dB vs reference; O {s_emu:.1f} dB vs emulation; float64 delta {d64:+.2f} dB"
    )
    assert s_o >= min_db and s_lse >= min_db
    if min_db >= 40.0:
        assert abs(d64) <= 0.5
    assert s_emu >= min_db  # not tighter: FP8 wgmma accumulation and ex2.approx differ from the float32 emulation


@pytest.mark.parametrize("h,causal", [(128, False), (128, True), (64, False), (64, True)])
def test_scheduling_variants_are_bit_identical(h, causal):
    """The serial comparison schedule (tune 1) reorders only when work is issued, not the arithmetic; the other
    P V accumulation (tune 6) changes it by a bounded amount."""
    rng = fresh_rng()
    q, k, v = kernel_inputs(rng, 2, 640, 768, 4, 2, h)
    qh, kh, vh = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    kv_len = jnp.asarray([700, 33], jnp.int32)
    ops = operands.prepare(square_mx(qh), square_mx(kh), square_mx(vh), scale=h**-0.5, q_len=None, kv_len=kv_len)
    variants = [
        v
        for v in registry.ATTENTION_FWD_VARIANTS
        if (v.head_dim, v.causal, v.packed, v.p_scale, v.broadcast_q) == (h, causal, False, "const", False)
    ]
    production = registry.find(registry.AttentionFwdConfig, head_dim=h, causal=causal, p_scale="const", packed=False)
    tunes = sorted(v.tune for v in variants if v.pv_fp32 == production.pv_fp32)
    assert tunes == [0, 1]
    unbuilt = [v.name for v in variants if not library.has_kernel(v.name)]
    if unbuilt:
        pytest.skip(f"{unbuilt} not in the library (the comparison schedules: tools/build_library.py --with-tunes)")
    outs = [jax.jit(lambda o, t=t: afwd.attention_fwd(o, causal=causal, t=640, tune=t))(ops) for t in tunes]
    for other in outs[1:]:
        for a, b in zip(outs[0], other, strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    # P V on the wgmma accumulator (pv_fp32=False) sums with fewer bits than float32 (pv_fp32=True)
    for v in (v for v in variants if v.pv_fp32 != production.pv_fp32):
        o, lse = jax.jit(lambda o, t=v.tune: afwd.attention_fwd(o, causal=causal, t=640, tune=t))(ops)
        o0, lse0 = (np.asarray(x, np.float64) for x in outs[0])
        assert sqnr_db(o0, np.asarray(o, np.float64)) >= 50.0
        fin = np.isfinite(lse0)
        np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), fin)
        assert sqnr_db(lse0[fin], np.asarray(lse, np.float64)[fin]) >= 70.0


@pytest.mark.parametrize("p_scale", ["const", "block"])
def test_every_output_element_written(p_scale):
    rng = fresh_rng()
    for causal in (False, True):
        q, k, v = kernel_inputs(rng, 2, 320, 448, 4, 2, 128)
        ql = jnp.asarray([200, 320], jnp.int32)
        kl = jnp.asarray([0, 300], jnp.int32)  # batch 0 has no key: O = 0, LSE = -inf everywhere
        qh, kh, vh = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
        kh = kh.at[0].set(0)
        vh = vh.at[0].set(0)
        ops = operands.prepare(square_mx(qh), square_mx(kh), square_mx(vh), scale=128**-0.5, q_len=ql, kv_len=kl)
        tp = ops.q.shape[2]
        poison = (jnp.full((2, tp, 4, 128), jnp.nan, jnp.bfloat16), jnp.full((2, 4, tp), jnp.nan, jnp.float32))
        o, lse = jax.jit(
            lambda ops, out, c=causal, t=tp: afwd.attention_fwd(ops, causal=c, t=t, p_scale=p_scale, out=out)
        )(ops, poison)
        o, lse = np.asarray(o, np.float32).transpose(0, 2, 1, 3), np.asarray(lse)  # (B, N, Tp, H)
        assert not np.isnan(o).any() and not np.isnan(lse).any()
        assert np.all(o[0] == 0) and np.all(np.isneginf(lse[0]))
        assert np.all(o[1, :, 320:] == 0) and np.all(np.isneginf(lse[1, :, 320:]))
        assert np.all(np.isfinite(lse[1, :, :320]))


@pytest.mark.parametrize("p_scale", ["const", "block"])
def test_bit_identical_across_runs(p_scale):
    rng = fresh_rng()
    q, k, v = kernel_inputs(rng, 2, 1024, 1024, 4, 2, 128)
    config = mx.AttentionConfig(p_scale=p_scale)
    f = jax.jit(
        lambda q, k, v: mx.dot_product_attention(q, k, v, implementation="cuda", return_residual="lse", config=config)
    )
    first = [np.asarray(x).tobytes() for x in f(q, k, v)]
    for _ in range(19):
        assert [np.asarray(x).tobytes() for x in f(q, k, v)] == first


@pytest.mark.parametrize("p_scale", ["const", "block"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_operand_gives_reference_nan_pattern(where, p_scale):
    rng = fresh_rng()
    q, k, v = kernel_inputs(rng, 1, 256, 256, 2, 2, 64)
    args = dict(q=q, k=k, v=v)
    args[where] = args[where].at[0, 40, 1, 7].set(jnp.nan)
    config = mx.AttentionConfig(p_scale=p_scale)
    o_k, lse_k = _run(args["q"], args["k"], args["v"], "cuda", config=config)
    o_r, lse_r = _run(args["q"], args["k"], args["v"], "xla", config=config)
    np.testing.assert_array_equal(np.isnan(o_k), np.isnan(o_r))
    np.testing.assert_array_equal(np.isnan(lse_k), np.isnan(lse_r))
    assert np.isnan(o_k).any()


def test_mxarray_inputs_and_varlen_use_the_kernel():
    rng = fresh_rng()
    q, k, v = kernel_inputs(rng, 2, 256, 256, 2, 1, 128)
    qm, km, vm = (mx.quantize(x, axis=(-3, -1), block="square") for x in (q, k, v))
    o_k = mx.dot_product_attention(qm, km, vm, implementation="cuda")
    o_r = mx.dot_product_attention(qm, km, vm, implementation="xla")
    assert sqnr_db(np.asarray(o_k, np.float64), np.asarray(o_r, np.float64)) >= 40.0

    lens = np.array([100, 256, 37])
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    tot = int(lens.sum())
    pq = jnp.asarray(rng.standard_normal((tot, 4, 128)), jnp.bfloat16)
    pk = jnp.asarray(rng.standard_normal((tot, 2, 128)), jnp.bfloat16)
    pv = jnp.asarray(rng.standard_normal((tot, 2, 128)), jnp.bfloat16)
    outs = [
        np.asarray(
            mx.varlen_attention(
                pq, pk, pv, cu, cu, max_seqlen_q=256, max_seqlen_k=256, is_causal=True, implementation=i
            ),
            np.float64,
        )
        for i in ("cuda", "xla")
    ]
    assert sqnr_db(outs[0], outs[1]) >= 40.0


@pytest.mark.parametrize("p_scale", ["const", "block"])
def test_gradients_through_kernel_forward(p_scale):
    """implementation="cuda" runs the kernel forward and, on its residuals, the backward kernel (p_scale "const"
    and "block": registry BLOCK_P)."""
    rng = fresh_rng()
    q, k, v = kernel_inputs(rng, 1, 256, 256, 2, 2, 128)
    config = mx.AttentionConfig(p_scale=p_scale)

    def loss(q, k, v, impl):
        o = mx.dot_product_attention(q, k, v, is_causal=True, implementation=impl, config=config)
        return o.astype(jnp.float32).sum()

    g_k = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, "cuda")
    g_r = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, "xla")
    for a, b in zip(g_k, g_r, strict=True):
        assert sqnr_db(np.asarray(a, np.float64), np.asarray(b, np.float64)) >= 30.0
