"""The backward kernel path of dot_product_attention on CPU, the sm_90a backward kernel replaced by its emulation.

implementation="emulated" runs the forward kernel path and then (ops/attention_bwd_kernel.py) dO's square
quantization, the pre-pass (primitives/attention_bwd.py bwd_operands) and the ATTENTION_BWD call's emulation
through its custom_vmap(custom_partitioning(...)) wrapper. Checked against independent paths:
  * the pre-pass's operands against the reference's own dequantization / quantization / Delta, bit for bit;
  * the kernel-path backward against the reference backward (implementation="xla") on the SAME residuals
    (the emulated forward's): bit for bit, the emulation being the reference's math on exact bf16 operands
    (up to two rows that a last-bit difference in a float32 dot flipped through dS's rounding);
  * vmapped gradients equal the per-slice ones; the whole op's gradients sharded over a 2x4 mesh equal the
    unsharded ones bit for bit with no collective.
Gradients of implementation="emulated" vs "xla" end to end (each with its own forward, a dLSE cotangent):
test_attention_implementations.py; the ATTENTION_BWD call itself: test_attention_bwd_call_emulated.py.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.ops import attention_core as attn_ops
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.reference.attention_quant import fake_quant_square
from tests.attention.attention_bwd_testutil import (
    CASES,
    assert_close,
    assert_equal_but_flipped_rows,
    attention_static,
    bwd_inputs,
    case_id,
    f32_bits,
    fwd_then_bwd,
    input_dtype,
    need_variant,
    same_residual_grads,
)
from tests.attention.attention_testutil import fresh_rng
from tests.parallel.sharding_testutil import collectives, mesh, put


# ------------------------------------------------------------------------------------------- the lookup
def test_kernel_variant_lookup():
    v, why = abwd.kernel_variant(head_dim=128, causal=True)
    if v is not None:  # the interface's key fields
        assert (v.head_dim, v.causal, v.p_scale, v.dq_accum) == (128, True, "const", "fp32") and why is None
    else:
        assert why.startswith("no backward kernel variant")
    v, why = abwd.kernel_variant(head_dim=96, causal=False)
    assert v is None and why.startswith("no backward kernel variant") and "head_dim=96" in why
    with pytest.raises(ValueError, match="dq_accum"):
        abwd.kernel_variant(head_dim=128, causal=False, dq_accum="bf16")
    with pytest.raises(ValueError, match="p_scale"):
        abwd.kernel_variant(head_dim=128, causal=False, p_scale="row")


def test_uncovered_configs_keep_the_reference_backward(monkeypatch):
    """A config without a variant (dq_accum="fp16" before its variants existed) and the reference forward
    take the reference backward; a path "cuda" variant the loaded library lacks does too (recorded under
    kbwd.OP), with one warning per cause."""
    case = CASES[0]
    fp16 = AttentionConfig(dq_accum="fp16")
    if abwd.kernel_variant(head_dim=64, causal=True, dq_accum="fp16")[0] is None:
        with impl.record() as decisions:
            assert kbwd.backward_variant(attention_static(case, "emulated", fp16), 64)[0] is None
        assert [(d.op, d.path) for d in decisions] == [(kbwd.OP, "xla")]
    assert kbwd.backward_variant(attention_static(case, "xla"), 64) == (None, "the forward ran the XLA reference")
    need_variant(case)
    monkeypatch.setattr(kbwd, "_warned", set())
    monkeypatch.setattr(kbwd.library, "kernel_names", lambda: [])  # a library without the backward kernel
    with pytest.warns(impl.KernelFallbackWarning, match="the backward runs the XLA reference"):
        variant, why = kbwd.backward_variant(attention_static(case, "cuda"), 64)
    assert variant is None and "kernel library has no" in why
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kbwd.backward_variant(attention_static(case, "cuda"), 64)[0] is None  # warned once per cause
    # a library built before the sdp_fp8 call: the production kernel's name, but not the target it needs
    prod = need_variant(case)
    if prod.sdp_fp8:
        monkeypatch.setattr(kbwd.library, "kernel_names", lambda: [(prod.name, "sm_90a")])
        monkeypatch.setattr(kbwd.library, "ffi_targets", lambda: [abwd.TARGET, abwd.TARGET + "_into"])
        with pytest.warns(impl.KernelFallbackWarning, match="jax_mxfp8_attention_bwd_fp8"):
            variant, why = kbwd.backward_variant(attention_static(case, "cuda"), 64)
        assert variant is None and "no jax_mxfp8_attention_bwd_fp8 target" in why
    # a library built before dv_f16: the production kernel's name and target, but not the float16 dequantize
    if prod.dv_f16:
        monkeypatch.setattr(kbwd.library, "ffi_targets", lambda: [abwd.TARGET, abwd.TARGET_FP8])
        with pytest.warns(impl.KernelFallbackWarning, match=abwd.DO_F16_DEQUANTIZE):
            variant, why = kbwd.backward_variant(attention_static(case, "cuda"), 64)
        assert variant is None and abwd.DO_F16_DEQUANTIZE in why
        assert registry.find(registry.DequantizeConfig, block="square", out_dtype="float16").name == (
            abwd.DO_F16_DEQUANTIZE
        )


# ------------------------------------------------------------------------------------------ the pre-pass
@functools.cache
def _prepass(st: attn_ops.AttentionStatic):
    """jit: the forward's residuals -> (the pre-pass's operands, the reference backward's own values)."""

    def run(q, k, v, do, dlse, q_len, kv_len):
        (o, lse), (quants, *_) = attn_ops.mx_attention_fwd(st, q, k, v, None, None, q_len, kv_len)
        do_q = attn_ops.square_sequence_major(do, q_len, "up", "emulated")
        mxs = (quants[key] for key in ("q:square", "k:square", "v:square"))
        ops = abwd.bwd_operands(*mxs, do_q, do, o, lse, dlse, q_len=q_len, kv_len=kv_len)
        # the reference backward's operands (mx_attention_bwd / attention_bwd): head-major float32
        deq = {key: attn_ops._operand(st, quants, key, q_len, kv_len) for key in quants}
        do_hm = attn_ops._zero_rows(attn_ops._q_to_hm(do.astype(jnp.float32), st.group), q_len, 3)
        do_prod = do_hm * attn_ops._q_to_hm(o, st.group).astype(jnp.float32)  # exact: bf16 x bf16 in f32
        return ops, lse, deq, fake_quant_square(do_hm, "up"), do_prod

    return jax.jit(run)


@pytest.mark.parametrize("case", [CASES[0], pytest.param(CASES[1], marks=pytest.mark.slow)], ids=case_id)
def test_bwd_operands_match_the_reference(case):
    """Each operand of the pre-pass equals what the reference backward computes from the same residuals:
    dequantized Q^, K^, V^ (zeros past the lengths), dO^ = the reference's fake_quant_square of the zeroed
    head-major dO, Delta = rowsum(dO O) - dLSE, LSE -inf past the lengths; padding to 128 is 0 / -inf."""
    q, k, v, do, dlse, q_len, kv_len = bwd_inputs(case, fresh_rng())
    ops, lse, deq, want_do, do_prod = _prepass(attention_static(case, "emulated"))(q, k, v, do, dlse, q_len, kv_len)
    b, t, n, h = q.shape
    s = k.shape[1]
    tp, sp = -(-t // 128) * 128, -(-s // 128) * 128
    assert ops.q.shape == ops.do.shape == (b, n, tp, h) and ops.k.shape == ops.v.shape == (b, case["n_kv"], sp, h)
    assert ops.q.dtype == ops.k.dtype == ops.v.dtype == ops.do.dtype == jnp.bfloat16
    assert ops.lse.shape == ops.delta.shape == (b, n, tp) and ops.lse.dtype == ops.delta.dtype == jnp.float32

    def padded(x, length):  # (B, K, [G,] L, H) -> (B, N, Lp, H)
        x = x.reshape(b, -1, *x.shape[-2:])
        return jnp.pad(x, [(0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)])

    np.testing.assert_array_equal(f32_bits(ops.q), f32_bits(padded(deq["q:square"], tp)))
    np.testing.assert_array_equal(f32_bits(ops.k), f32_bits(padded(deq["k:square"], sp)))
    np.testing.assert_array_equal(f32_bits(ops.v), f32_bits(padded(deq["v:square"], sp)))
    np.testing.assert_array_equal(f32_bits(ops.do), f32_bits(padded(want_do, tp)))
    # Delta: a float32 row sum whose order XLA picks per fusion (it differs in the last bits between the
    # two layouts inside one program): against float64, within H float32 roundings of the terms' size
    terms = np.asarray(do_prod, np.float64).reshape(b, n, t, h)
    want = np.pad(terms.sum(-1) - np.asarray(dlse, np.float64), [(0, 0), (0, 0), (0, tp - t)])
    bound = np.pad(
        np.abs(terms).sum(-1) * h * 2.0**-24 + 2.0**-24 * np.abs(np.asarray(dlse)), [(0, 0), (0, 0), (0, tp - t)]
    )
    assert np.all(np.abs(np.asarray(ops.delta, np.float64) - want) <= bound)
    assert not np.asarray(ops.delta[:, :, t:]).any()
    ql = np.full(b, t) if q_len is None else np.asarray(q_len)
    rows = np.broadcast_to(np.arange(tp)[None, None, :] < ql[:, None, None], (b, n, tp))
    lse_want = np.pad(np.asarray(lse), [(0, 0), (0, 0), (0, tp - t)], constant_values=-np.inf)
    np.testing.assert_array_equal(np.asarray(ops.lse), np.where(rows, lse_want, -np.inf))
    np.testing.assert_array_equal(np.asarray(ops.lens), np.stack([ql, np.full(b, s) if kv_len is None else kv_len]))


# ------------------------------------------------------------------- the backward on the same residuals
SAME_RESIDUAL_CASES = CASES[:3] + [pytest.param(CASES[3], marks=pytest.mark.slow)]


@pytest.mark.parametrize("case", SAME_RESIDUAL_CASES, ids=case_id)
def test_kernel_backward_equals_reference_on_same_residuals(case):
    """Gradients of the kernel-path backward (emulated) and of the reference backward on the emulated
    forward's residuals, with a random dO and dLSE: bit for bit (same math on the same exact values; the
    padding the pre-pass adds contributes exact zeros), but for rows that one dS rounding flip moved
    (assert_equal_but_flipped_rows says why). With an sdp_fp8 production variant the call reads V re-encoded
    (v8 2^eV, rounded where an element falls below E4M3's normal range at its row exponent), which can flip
    more dS roundings: then >= 40 dB against the reference (the bits are checked on the BF16 schedule's call
    in test_sdp_fp8_call_partitions_and_lowers)."""
    fp8 = need_variant(case).sdp_fp8
    got, want = same_residual_grads(case)
    for name, a, w in zip("qkv", got, want, strict=True):
        assert a.shape == w.shape and a.dtype == w.dtype == input_dtype(case), name
        assert np.isfinite(np.asarray(a, np.float32)).all(), name
        if fp8:
            assert sqnr_db(np.asarray(w, np.float64), np.asarray(a, np.float64)) >= 40.0, f"d{name}"
        else:
            assert_equal_but_flipped_rows(a, w, f"d{name}")
    assert np.abs(np.asarray(got[0], np.float32)).max() > 0


def test_mxarray_key_value_inputs():
    """Caller-quantized K, V (square MXArrays, constants: no gradient) with garbage past kv_len (large values
    in the partial 32-row block, NaN blocks after it): the kernel path's dq equals the reference backward's
    on the same residuals bit for bit and stays finite (rows past the lengths are zeroed after
    dequantization, as the reference does)."""
    case = dict(b=2, t=64, s=96, n=4, n_kv=2, h=64, causal=True, lengths=True)
    need_variant(case)
    q, k, v, do, dlse, q_len, kv_len = bwd_inputs(case, fresh_rng())
    pos = jnp.arange(96)[None, :, None, None]
    past, blocks_past = pos >= kv_len[:, None, None, None], pos >= (-(-kv_len // 32) * 32)[:, None, None, None]
    garbage = lambda x: jnp.where(blocks_past, jnp.nan, jnp.where(past, 1e3, x))
    k, v = (mx.quantize(garbage(x), axis=(-3, -1), block="square") for x in (k, v))
    st = dataclasses.replace(attention_static(case, "emulated"), is_mx=(False, True, True))
    got = fwd_then_bwd(st, st)(q, k, v, do, dlse, q_len, kv_len)[2]
    want = fwd_then_bwd(st, dataclasses.replace(st, impl="xla"))(q, k, v, do, dlse, q_len, kv_len)[2]
    assert got[1] is None and got[2] is None and want[1] is None
    assert np.isfinite(np.asarray(got[0], np.float32)).all()
    assert_equal_but_flipped_rows(got[0], want[0], "dq")


# ---------------------------------------------------------------------------------------- end to end
def _vjp(q, k, v, do, dlse, q_len, kv_len, *, causal, implementation, config=None, lse=True):
    def f(q, k, v):
        return mx.dot_product_attention(
            q, k, v, is_causal=causal, query_seq_lengths=q_len, key_value_seq_lengths=kv_len,
            implementation=implementation, config=config, return_residual="lse" if lse else False,
        )  # fmt: skip

    _, vjp = jax.vjp(f, q, k, v)
    return vjp((do, dlse) if lse else do)


def test_vmap_of_the_gradients():
    """jax.vmap over a leading axis of the kernel-path gradients equals the per-slice gradients: the
    backward call's mapped axis folds into its batch (custom_vmap)."""
    case = CASES[0]
    need_variant(case)
    rng = fresh_rng()
    xs = [bwd_inputs(case, rng) for _ in range(2)]
    q, k, v, do, dlse = (jnp.stack([x[i] for x in xs]) for i in range(5))
    f = functools.partial(_vjp, causal=True, implementation="emulated", q_len=xs[0][5], kv_len=xs[0][6])
    got = jax.jit(jax.vmap(f))(q, k, v, do, dlse)  # lengths shared (unbatched)
    for i in range(2):
        want = jax.jit(f)(q[i], k[i], v[i], do[i], dlse[i])
        for name, a, w in zip("qkv", got, want, strict=True):
            assert_close(a[i], w, name)


def test_op_gradients_sharded_2x4():
    """jit(vjp) of the whole op (forward kernel path + backward kernel path) with batch over "data" and KV
    heads over "model" of a 2x4 mesh: the gradients equal the unsharded ones bit for bit, come back sharded
    like the inputs, and the program holds no collective at all (every pass partitions over batch and heads)."""
    case = dict(b=2, t=96, s=160, n=8, n_kv=4, h=64, causal=True, lengths=True)
    need_variant(case)
    q, k, v, do, _, q_len, kv_len = bwd_inputs(case, fresh_rng())

    def grads(q, k, v, do, q_len, kv_len):
        return _vjp(q, k, v, do, None, q_len, kv_len, causal=True, implementation="emulated", lse=False)

    want = jax.jit(grads)(q, k, v, do, q_len, kv_len)
    m = mesh((2, 4), ("data", "model"))
    seq = lambda x: put(x, m, "data", None, "model", None)
    args = (seq(q), seq(k), seq(v), seq(do), put(q_len, m, "data"), put(kv_len, m, "data"))
    got = jax.jit(grads)(*args)
    for name, a, w in zip("qkv", got, want, strict=True):
        assert tuple(a.sharding.spec) == ("data", None, "model", None), name
        np.testing.assert_array_equal(f32_bits(a), f32_bits(w), err_msg=f"d{name}")
    assert collectives(grads, *args) == []
