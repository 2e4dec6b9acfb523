"""The backward kernel path of dot_product_attention on CPU, the sm_90a backward kernel replaced by its emulation.

implementation="emulated" runs the forward kernel path and then (ops/attention_bwd_kernel.py) dO's square
quantization, the pre-pass (primitives/attention_bwd.py bwd_operands) and the ATTENTION_BWD call's emulation
through its custom_vmap(custom_partitioning(...)) wrapper. Checked against independent paths:
  * the pre-pass's operands against the reference's own dequantization / quantization / Delta, bit for bit;
  * the kernel-path backward against the reference backward (implementation="xla") on the SAME residuals
    (the emulated forward's): bit for bit, the emulation being the reference's math on exact bf16 operands
    (up to two rows that a last-bit difference in a float32 dot flipped through dS's rounding);
  * gradients of implementation="emulated" vs "xla" end to end (each with its own forward), with a dLSE
    cotangent: >= 40 dB (the contract's kernel-vs-reference gate; the forwards differ in the kernel's
    realigned operands and exp2 softmax, so O and LSE may differ in their last bits);
  * sharded over a 2x4 mesh and vmapped calls equal the plain call, with no all-gather in the call;
  * the `_into` test hook and the plain call lower to the FFI target with the interface's attributes.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_testutil import fresh_rng
from sharding_util import collectives, mesh, put

import jax_mxfp8 as mx
from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.ops import attention_core as attn_ops
from jax_mxfp8.ops.attention import mx_attention_bwd
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import attention_bwd_prepass
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives.attention_operands import DO_F16_TOP
from jax_mxfp8.reference.attention_quant import fake_quant_square

# T and S are multiples of 32, not of 128 (the pre-pass pads to 128), except where noted
CASES = [
    dict(b=2, t=96, s=160, n=4, n_kv=2, h=64, causal=True, lengths=True),  # GQA
    dict(b=1, t=160, s=96, n=2, n_kv=2, h=128, causal=False, lengths=False),  # MHA
    dict(b=2, t=64, s=224, n=2, n_kv=1, h=64, causal=False, lengths=True, dtype="float32"),  # MQA, float32
    dict(b=1, t=128, s=128, n=2, n_kv=1, h=128, causal=True, lengths=True),  # multiples of 128
]


def _id(case):
    return "-".join(f"{k}{v}" for k, v in case.items())


def _inputs(case, rng):
    b, t, s, n, n_kv, h = (case[k] for k in ("b", "t", "s", "n", "n_kv", "h"))
    dt = _dtype(case)
    q = jnp.asarray(rng.standard_normal((b, t, n, h)), dt)
    k = jnp.asarray(rng.standard_normal((b, s, n_kv, h)), dt)
    v = jnp.asarray(rng.standard_normal((b, s, n_kv, h)) * 3.0, dt)
    do = jnp.asarray(rng.standard_normal((b, t, n, h)), dt)
    dlse = jnp.asarray(rng.standard_normal((b, n, t)), jnp.float32)
    q_len = kv_len = None
    if case["lengths"]:
        q_len = jnp.asarray(rng.integers(1, t + 1, size=b), jnp.int32).at[0].set(t - 7)
        kv_len = jnp.asarray(rng.integers(0, s + 1, size=b), jnp.int32).at[0].set(s - 5)
    return q, k, v, do, dlse, q_len, kv_len


def _dtype(case) -> np.dtype:
    """Inputs (and so the output and gradients): bfloat16, or float32 (quantized from float32; the kernel's
    O upcast)."""
    return np.dtype(jnp.dtype(case.get("dtype", "bfloat16")))


def _static(case, impl_path, config=None):
    return attn_ops.AttentionStatic(
        config=config or AttentionConfig(),
        scale=case["h"] ** -0.5,
        is_causal=case["causal"],
        is_mx=(False, False, False),
        out_dtype=_dtype(case),
        group=case["n"] // case["n_kv"],
        impl=impl_path,
    )


def _plain_variant(h: int, causal: bool):
    """A backward variant that takes the plain call (bfloat16 q, k, v, do): tune 17, production's schedule on
    BF16 wgmma only (production itself takes the sdp_fp8 call)."""
    variant = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=causal, tune=17)
    assert variant is not None and not variant.sdp_fp8
    return variant


def _need_variant(case, config=None):
    cfg = config or AttentionConfig()
    variant, why = abwd.kernel_variant(
        head_dim=case["h"], causal=case["causal"], p_scale=cfg.p_scale, p_rounding=cfg.scale_rounding,
        dq_accum=cfg.dq_accum,
    )  # fmt: skip
    if variant is None:
        pytest.skip(why)
    return variant


@functools.cache
def _fwd_bwd(st: attn_ops.AttentionStatic, st_bwd: attn_ops.AttentionStatic):
    """jit: the forward of `st` (residuals), then the bwd of `st_bwd` on those residuals."""

    def run(q, k, v, do, dlse, q_len, kv_len):
        (o, lse), res = attn_ops.mx_attention_fwd(st, q, k, v, None, None, q_len, kv_len)
        grads = mx_attention_bwd(st_bwd, res, (do, dlse))
        return o, lse, grads[:3]

    return jax.jit(run)


def same_residual_grads(case, config=None):
    """(dq, dk, dv) of the kernel-path backward (emulated; asserted taken) and of the reference backward, both on
    the emulated forward's residuals of fresh inputs with a random dO and dLSE."""
    q, k, v, do, dlse, q_len, kv_len = _inputs(case, fresh_rng())
    st = _static(case, "emulated", config)
    with impl.record() as decisions:
        got = _fwd_bwd(st, st)(q, k, v, do, dlse, q_len, kv_len)
    assert (kbwd.OP, "emulated") in [(d.op, d.path) for d in decisions]  # the kernel path was taken
    want = _fwd_bwd(st, dataclasses.replace(st, impl="xla"))(q, k, v, do, dlse, q_len, kv_len)
    return got[2], want[2]


def _bits(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32)).view(np.uint32)


def assert_equal_but_flipped_rows(got, want, label, max_rows=2, rel=1e-3):
    """got == want bit for bit, except at most `max_rows` (batch, token, head) rows, each within `rel` of
    want's largest magnitude.

    Why the exception: the two programs compute S, dP (float32 dots over H) with different shapes (the
    pre-pass pads to 128), and XLA:CPU's summation order inside a dot follows the shape and the host's vector
    width, so a float32 S or dP can differ in its last bit. A dS element sitting on an E4M3 rounding boundary
    then rounds to the neighbouring value in one program: one row of dQ (and one of dK) moves by one E4M3
    step of that element times a K (or Q) row. Seen on an AVX2 host (2026-12-02: one row of dq and one of dk
    at 8e-5 relative), never on the host the test was written on. A wrong tile, mask or scale moves many
    rows or moves them far more."""
    g, w = np.asarray(jnp.asarray(got).astype(jnp.float32)), np.asarray(jnp.asarray(want).astype(jnp.float32))
    assert g.shape == w.shape, label
    diff = g.view(np.uint32) != w.view(np.uint32)
    rows = {tuple(i) for i in np.argwhere(diff)[:, :-1]}
    assert len(rows) <= max_rows, f"{label}: {len(rows)} rows differ (at most {max_rows} allowed): {sorted(rows)[:8]}"
    if rows:
        err = np.abs(g.astype(np.float64) - w)[diff].max()
        assert err <= rel * np.abs(w).max(), f"{label}: a flipped row moved by {err} (max |want| {np.abs(w).max()})"


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
            assert kbwd.backward_variant(_static(case, "emulated", fp16), 64)[0] is None
        assert [(d.op, d.path) for d in decisions] == [(kbwd.OP, "xla")]
    assert kbwd.backward_variant(_static(case, "xla"), 64) == (None, "the forward ran the XLA reference")
    _need_variant(case)
    monkeypatch.setattr(kbwd, "_warned", set())
    monkeypatch.setattr(kbwd.library, "kernel_names", lambda: [])  # a library without the backward kernel
    with pytest.warns(impl.KernelFallbackWarning, match="the backward runs the XLA reference"):
        variant, why = kbwd.backward_variant(_static(case, "cuda"), 64)
    assert variant is None and "kernel library has no" in why
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kbwd.backward_variant(_static(case, "cuda"), 64)[0] is None  # warned once per cause
    # a library built before the sdp_fp8 call: the production kernel's name, but not the target it needs
    prod = _need_variant(case)
    if prod.sdp_fp8:
        monkeypatch.setattr(kbwd.library, "kernel_names", lambda: [(prod.name, "sm_90a")])
        monkeypatch.setattr(kbwd.library, "ffi_targets", lambda: [abwd.TARGET, abwd.TARGET + "_into"])
        with pytest.warns(impl.KernelFallbackWarning, match="jax_mxfp8_attention_bwd_fp8"):
            variant, why = kbwd.backward_variant(_static(case, "cuda"), 64)
        assert variant is None and "no jax_mxfp8_attention_bwd_fp8 target" in why
    # a library built before dv_f16: the production kernel's name and target, but not the float16 dequantize
    if prod.dv_f16:
        monkeypatch.setattr(kbwd.library, "ffi_targets", lambda: [abwd.TARGET, abwd.TARGET_FP8])
        with pytest.warns(impl.KernelFallbackWarning, match=abwd.DO_F16_DEQUANTIZE):
            variant, why = kbwd.backward_variant(_static(case, "cuda"), 64)
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


@pytest.mark.parametrize("case", [CASES[0], pytest.param(CASES[1], marks=pytest.mark.slow)], ids=_id)
def test_bwd_operands_match_the_reference(case):
    """Each operand of the pre-pass equals what the reference backward computes from the same residuals:
    dequantized Q^, K^, V^ (zeros past the lengths), dO^ = the reference's fake_quant_square of the zeroed
    head-major dO, Delta = rowsum(dO O) - dLSE, LSE -inf past the lengths; padding to 128 is 0 / -inf."""
    q, k, v, do, dlse, q_len, kv_len = _inputs(case, fresh_rng())
    ops, lse, deq, want_do, do_prod = _prepass(_static(case, "emulated"))(q, k, v, do, dlse, q_len, kv_len)
    b, t, n, h = q.shape
    s = k.shape[1]
    tp, sp = -(-t // 128) * 128, -(-s // 128) * 128
    assert ops.q.shape == ops.do.shape == (b, n, tp, h) and ops.k.shape == ops.v.shape == (b, case["n_kv"], sp, h)
    assert ops.q.dtype == ops.k.dtype == ops.v.dtype == ops.do.dtype == jnp.bfloat16
    assert ops.lse.shape == ops.delta.shape == (b, n, tp) and ops.lse.dtype == ops.delta.dtype == jnp.float32

    def padded(x, length):  # (B, K, [G,] L, H) -> (B, N, Lp, H)
        x = x.reshape(b, -1, *x.shape[-2:])
        return jnp.pad(x, [(0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)])

    np.testing.assert_array_equal(_bits(ops.q), _bits(padded(deq["q:square"], tp)))
    np.testing.assert_array_equal(_bits(ops.k), _bits(padded(deq["k:square"], sp)))
    np.testing.assert_array_equal(_bits(ops.v), _bits(padded(deq["v:square"], sp)))
    np.testing.assert_array_equal(_bits(ops.do), _bits(padded(want_do, tp)))
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


@pytest.mark.parametrize("case", SAME_RESIDUAL_CASES, ids=_id)
def test_kernel_backward_equals_reference_on_same_residuals(case):
    """Gradients of the kernel-path backward (emulated) and of the reference backward on the emulated
    forward's residuals, with a random dO and dLSE: bit for bit (same math on the same exact values; the
    padding the pre-pass adds contributes exact zeros), but for rows that one dS rounding flip moved
    (assert_equal_but_flipped_rows says why). With an sdp_fp8 production variant the call reads V re-encoded
    (v8 2^eV, rounded where an element falls below E4M3's normal range at its row exponent), which can flip
    more dS roundings: then >= 40 dB against the reference (the bits are checked on the BF16 schedule's call
    in test_sdp_fp8_call_partitions_and_lowers)."""
    fp8 = _need_variant(case).sdp_fp8
    got, want = same_residual_grads(case)
    for name, a, w in zip("qkv", got, want, strict=True):
        assert a.shape == w.shape and a.dtype == w.dtype == _dtype(case), name
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
    _need_variant(case)
    q, k, v, do, dlse, q_len, kv_len = _inputs(case, fresh_rng())
    pos = jnp.arange(96)[None, :, None, None]
    past, blocks_past = pos >= kv_len[:, None, None, None], pos >= (-(-kv_len // 32) * 32)[:, None, None, None]
    garbage = lambda x: jnp.where(blocks_past, jnp.nan, jnp.where(past, 1e3, x))
    k, v = (mx.quantize(garbage(x), axis=(-3, -1), block="square") for x in (k, v))
    st = dataclasses.replace(_static(case, "emulated"), is_mx=(False, True, True))
    got = _fwd_bwd(st, st)(q, k, v, do, dlse, q_len, kv_len)[2]
    want = _fwd_bwd(st, dataclasses.replace(st, impl="xla"))(q, k, v, do, dlse, q_len, kv_len)[2]
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


@pytest.mark.slow  # CI: test_attention_kernel_path_cpu.py's gradient test covers this path (no dLSE)
@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=_id)
def test_gradients_emulated_vs_xla(case):
    """jax.vjp of dot_product_attention (output and LSE cotangents) under jit: kernel path vs reference,
    each with its own forward; >= 40 dB (module docstring)."""
    _need_variant(case)
    q, k, v, do, dlse, q_len, kv_len = _inputs(case, fresh_rng())
    run = functools.partial(_vjp, causal=case["causal"])
    ge = jax.jit(functools.partial(run, implementation="emulated"))(q, k, v, do, dlse, q_len, kv_len)
    gx = jax.jit(functools.partial(run, implementation="xla"))(q, k, v, do, dlse, q_len, kv_len)
    for name, a, w in zip("qkv", ge, gx, strict=True):
        a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
        assert sqnr_db(w, a) >= 40.0, (name, sqnr_db(w, a))


def test_vmap_of_the_gradients():
    """jax.vmap over a leading axis of the kernel-path gradients equals the per-slice gradients: the
    backward call's mapped axis folds into its batch (custom_vmap)."""
    case = CASES[0]
    _need_variant(case)
    rng = fresh_rng()
    xs = [_inputs(case, rng) for _ in range(2)]
    q, k, v, do, dlse = (jnp.stack([x[i] for x in xs]) for i in range(5))
    f = functools.partial(_vjp, causal=True, implementation="emulated", q_len=xs[0][5], kv_len=xs[0][6])
    got = jax.jit(jax.vmap(f))(q, k, v, do, dlse)  # lengths shared (unbatched)
    for i in range(2):
        want = jax.jit(f)(q[i], k[i], v[i], do[i], dlse[i])
        for name, a, w in zip("qkv", got, want, strict=True):
            _assert_close(a[i], w, name)


def _assert_close(a, w, name):
    """XLA:CPU may order float32 sums differently for a merged or per-device batch (the forward's sharding
    test saw 1-ulp LSE differences); a wrong shard or batch mapping changes whole rows, far beyond this."""
    a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
    exact = np.mean(a == w)
    assert exact > 0.99 and sqnr_db(w, a) >= 60.0, (name, exact, sqnr_db(w, a))


def test_op_gradients_sharded_2x4():
    """jit(vjp) of the whole op (forward kernel path + backward kernel path) with batch over "data" and KV
    heads over "model" of a 2x4 mesh: the gradients equal the unsharded ones bit for bit, come back sharded
    like the inputs, and the program holds no collective at all (every pass partitions over batch and heads)."""
    case = dict(b=2, t=96, s=160, n=8, n_kv=4, h=64, causal=True, lengths=True)
    _need_variant(case)
    q, k, v, do, _, q_len, kv_len = _inputs(case, fresh_rng())

    def grads(q, k, v, do, q_len, kv_len):
        return _vjp(q, k, v, do, None, q_len, kv_len, causal=True, implementation="emulated", lse=False)

    want = jax.jit(grads)(q, k, v, do, q_len, kv_len)
    m = mesh((2, 4), ("data", "model"))
    seq = lambda x: put(x, m, "data", None, "model", None)
    args = (seq(q), seq(k), seq(v), seq(do), put(q_len, m, "data"), put(kv_len, m, "data"))
    got = jax.jit(grads)(*args)
    for name, a, w in zip("qkv", got, want, strict=True):
        assert tuple(a.sharding.spec) == ("data", None, "model", None), name
        np.testing.assert_array_equal(_bits(a), _bits(w), err_msg=f"d{name}")
    assert collectives(grads, *args) == []


# ----------------------------------------------------------------------------------- the call itself
def _call_operands(rng, b=4, n=8, n_kv=4, tp=128, sp=128, h=64):
    """Random pre-pass operands (MX values: fake-quantized), lengths, LSEs from the data."""
    shapes = ((b, n, tp, h), (b, n_kv, sp, h), (b, n_kv, sp, h), (b, n, tp, h))
    mxv = jax.jit(lambda x: fake_quant_square(x).astype(jnp.bfloat16))
    q, k, v, do = (mxv(jnp.asarray(rng.standard_normal(sh), jnp.float32)) for sh in shapes)
    ql = rng.integers(1, tp + 1, size=b).astype(np.int32)
    kl = rng.integers(1, sp + 1, size=b).astype(np.int32)
    lse = rng.standard_normal((b, n, tp)).astype(np.float32) + 4.0
    lse = np.where(np.arange(tp)[None, None] < ql[:, None, None], lse, -np.inf).astype(np.float32)
    delta = rng.standard_normal((b, n, tp)).astype(np.float32)
    return abwd.BwdOperands(q, k, v, do, jnp.asarray(lse), jnp.asarray(delta), jnp.asarray(np.stack([ql, kl])))


def _run(ops, variant, path="emulated"):
    return abwd.attention_bwd(ops, variant=variant, scale=0.125, path=path)


def test_sharded_call_equals_unsharded():
    """A 2x4 mesh: batch over "data", KV-head groups over "model". The call partitions without gathers
    and its results equal the unsharded call's."""
    variant = _plain_variant(64, True)
    ops = _call_operands(fresh_rng())
    f = jax.jit(functools.partial(_run, variant=variant))
    want = f(ops)
    m = mesh((2, 4), ("data", "model"))
    four, three = ("data", "model", None, None), ("data", "model", None)
    specs = abwd.BwdOperands(four, four, four, four, three, three, (None, "data"))
    placed = jax.tree.map(lambda x, sp: put(x, m, *sp), ops, specs, is_leaf=lambda x: isinstance(x, tuple))
    got = f(placed)
    assert "all-gather" not in f.lower(placed).compile().as_text()
    assert got[0].sharding.spec[:2] == ("data", "model") and got[1].sharding.spec[:2] == ("data", "model")
    for name, a, w in zip("qkv", got, want, strict=True):
        _assert_close(a, w, name)
    ql, kl = np.asarray(ops.lens)
    dq, dk = np.asarray(want[0]), np.asarray(want[1])
    assert not dq[np.arange(128)[None, None, :] >= ql[:, None, None].repeat(8, 1)].any()  # rows >= q_len 0
    assert not dk[np.arange(128)[None, None, :] >= kl[:, None, None].repeat(4, 1)].any()


@pytest.mark.parametrize("n,n_kv", [(2, 2), (4, 1)])
def test_mha_and_mqa_rules_partition(n, n_kv):
    """MHA and MQA have their own Shardy rules (no size-1 factor inside a compound one)."""
    variant = _plain_variant(64, False)
    ops = _call_operands(fresh_rng(), b=2, n=n, n_kv=n_kv)
    f = jax.jit(functools.partial(_run, variant=variant))
    want = f(ops)
    m = mesh((2, 4), ("data", "model"))
    four, three = ("data", None, None, None), ("data", None, None)
    specs = abwd.BwdOperands(four, four, four, four, three, three, (None, "data"))
    placed = jax.tree.map(lambda x, sp: put(x, m, *sp), ops, specs, is_leaf=lambda x: isinstance(x, tuple))
    for name, a, w in zip("qkv", f(placed), want, strict=True):
        _assert_close(a, w, name)


def test_ffi_lowering_and_into_hook():
    """For the GPU (lowered here without one): the plain call and the `_into` hook lower to the interface's
    FFI target with attributes kernel (the variant name), scale (f32) and dq_scale_log2 (s32), the hook
    aliasing its four NaN-filled output buffers to the results (the GPU tests check that the kernel writes
    every element)."""
    variant = _plain_variant(64, True)
    ops = _call_operands(fresh_rng(), b=1, n=2, n_kv=1)
    outs = tuple(jnp.full(x.shape, jnp.nan, jnp.float32) for x in (ops.q, ops.k, ops.v))
    outs += (jnp.zeros(ops.lse.shape[:2] + (ops.lse.shape[2] // 32,), jnp.int32),)
    hook = jax.jit(lambda ops, outs: abwd.attention_bwd(ops, variant=variant, scale=0.125, out=outs))
    text = hook.trace(ops, outs).lower(lowering_platforms=("cuda",)).as_text()
    assert "@jax_mxfp8_attention_bwd_into(" in text and text.count("output_operand_alias<") == 4
    assert f'kernel = "{variant.name}"' in text and "scale = 1.250000e-01 : f32" in text
    assert "dq_scale_log2 = 0 : i32" in text
    plain = jax.jit(functools.partial(_run, variant=variant, path="cuda"))
    assert "@jax_mxfp8_attention_bwd(" in plain.trace(ops).lower(lowering_platforms=("cuda",)).as_text()


# ----------------------------------------------------- sdp_fp8: the FP8 copies of S^T's and dP^T's operands
def test_fp8_copies_hold_the_operands():
    """bwd_operands(path="emulated") gives the XLA pre-pass's bfloat16 operands bit for bit (lengths and
    128-padding included). bwd_operands(fp8_path=...): q8, k8, v8, do8 re-encoded to one exponent per 32
    rows, times their row factors (qs without tau log2(e)), equal the bfloat16 MX operands within the
    re-encoding's bound (half an E4M3 subnormal step at the row exponent, 2^-10 2^e, only where an element
    falls below E4M3's normal range), and exactly where the row block's column blocks share one exponent."""
    case = CASES[0]
    st = _static(case, "emulated")
    q, k, v, do, dlse, q_len, kv_len = _inputs(case, fresh_rng())

    def run(q, k, v, do, dlse, q_len, kv_len):
        (o, lse), (quants, *_) = attn_ops.mx_attention_fwd(st, q, k, v, None, None, q_len, kv_len)
        do_q = attn_ops.square_sequence_major(do, q_len, "up", "emulated")
        mxs = [attn_ops.kernel_operand(quants, key, ln) for key, ln in (("q:square", q_len), ("k:square", kv_len),
                                                                        ("v:square", kv_len))]  # fmt: skip
        plain = abwd.bwd_operands(*mxs, do_q, do, o, lse, dlse, q_len=q_len, kv_len=kv_len)
        calls = abwd.bwd_operands(*mxs, do_q, do, o, lse, dlse, q_len=q_len, kv_len=kv_len, path="emulated")
        kw = dict(q_len=q_len, kv_len=kv_len, fp8_path="emulated", scale=st.scale, path="emulated")
        f16 = [abwd.bwd_operands(*mxs, do_q, do, o, lse, dlse, **kw, do_f16=True)]  # the float16 dequantize call
        f16 += [abwd.bwd_operands(*mxs, do_q, do, o, lse, dlse, **{**kw, "path": None}, do_f16=True)]  # in XLA
        return plain, calls, abwd.bwd_operands(*mxs, do_q, do, o, lse, dlse, **kw), f16

    ops, calls, with_fp8, (f16_call, f16_xla) = jax.jit(run)(q, k, v, do, dlse, q_len, kv_len)
    # path="emulated": the bfloat16 operands through the realign (zero shift) and dequantize calls, bit for bit
    for name in ("q", "k", "v", "do", "lse", "delta", "lens"):
        np.testing.assert_array_equal(_bits(getattr(calls, name)), _bits(getattr(ops, name)), err_msg=name)
    assert with_fp8.v is None  # V reaches the sdp_fp8 kernel only as v8
    # do_f16 (dv_f16 variants): the float16 dequantize call on lowered scale bytes gives do_float16's values
    # (XLA's float32 pass) bit for bit, and those times 2^shift are the bfloat16 dO^ (exact at these scales)
    assert f16_call.do.dtype == jnp.float16 and f16_call.do_shift.shape == (ops.do.shape[0], case["n_kv"])
    np.testing.assert_array_equal(_bits(f16_call.do), _bits(f16_xla.do))
    np.testing.assert_array_equal(np.asarray(f16_call.do_shift), np.asarray(f16_xla.do_shift))
    sh = np.repeat(np.asarray(f16_call.do_shift), ops.do.shape[1] // case["n_kv"], axis=1)[:, :, None, None]
    np.testing.assert_array_equal(np.asarray(f16_call.do, np.float64) * 2.0**sh, np.asarray(ops.do, np.float64))
    for name in ("q", "k", "do", "lse", "delta", "lens"):
        np.testing.assert_array_equal(_bits(getattr(with_fp8, name)), _bits(getattr(ops, name)), err_msg=name)
    f8 = with_fp8.fp8
    tau_log2e = np.float32(st.scale * np.log2(np.e))
    pairs = (("q", ops.q, f8.q8, f8.qs, tau_log2e), ("k", ops.k, f8.k8, f8.ks, 1.0),
             ("v", ops.v, f8.v8, f8.vs, 1.0), ("do", ops.do, f8.do8, f8.dos, 1.0))  # fmt: skip
    for name, want, data, factor, mult in pairs:
        assert data.shape == want.shape and data.dtype == jnp.float8_e4m3fn, name
        assert factor.shape == want.shape[:3][:2] + (want.shape[2] // 32,) and factor.dtype == jnp.float32, name
        f = np.repeat(np.asarray(factor, np.float64) / mult, 32, axis=2)[..., None]  # 2^e per row
        got = np.asarray(data, np.float64) * f
        w = np.asarray(want, np.float64)
        assert np.all(np.abs(got - w) <= 2.0**-10 * f), f"{name}: beyond the re-encoding's bound"
        assert sqnr_db(w, got) >= 40.0, name
        assert np.mean(got == w) > 0.9, f"{name}: fewer than 90% of the elements kept exactly"


def _with_fp8(ops, rng):
    """(ops with random sdp_fp8 copies and v None, ops with v = v8 2^eV in bfloat16: what the sdp_fp8 call's
    emulation reads for V; it reads q, k, do in bfloat16 and ignores q8, k8, do8 and their factors)."""
    f8 = lambda x: x.astype(jnp.float8_e4m3fn)  # noqa: E731
    pow2 = lambda x: jnp.asarray(2.0 ** rng.integers(-3, 3, x.shape[:2] + (x.shape[2] // 32,)), jnp.float32)  # noqa: E731
    extra = abwd.SdpFp8Operands(f8(ops.q), f8(ops.k), f8(ops.v), f8(ops.do), pow2(ops.q), pow2(ops.k), pow2(ops.v),
                                pow2(ops.do))  # fmt: skip
    v_equiv = (extra.v8.astype(jnp.float32) * jnp.repeat(extra.vs, 32, axis=2)[..., None]).astype(jnp.bfloat16)
    return dataclasses.replace(ops, v=None, fp8=extra), dataclasses.replace(ops, v=v_equiv)


def test_sdp_fp8_call_partitions_and_lowers():
    """The sdp_fp8 target (jax_mxfp8_attention_bwd_fp8, 14 operands: v8 in v's place): its emulation is the
    plain call's on V = v8 2^eV, it partitions over a 2x4 mesh without gathers like the plain call, lowers to
    its own target (and its `_into` hook), and refuses operands without the FP8 copies (and the plain
    variants refuse operands without v)."""
    plain = _plain_variant(64, True)
    # tune 24: sdp_fp8 with bfloat16 do (the PREVIOUS comparison schedule; production's dv_f16 is tested below)
    fp8 = registry.find(registry.AttentionBwdConfig, head_dim=64, causal=True, tune=24)
    assert fp8.sdp_fp8 and not fp8.dv_f16
    rng = fresh_rng()
    ops, plain_ops = _with_fp8(_call_operands(rng), rng)
    f = jax.jit(functools.partial(_run, variant=fp8))
    want = jax.jit(functools.partial(_run, variant=plain))(plain_ops)
    got = f(ops)
    for name, a, w in zip("qkv", got, want, strict=True):
        np.testing.assert_array_equal(_bits(a), _bits(w), err_msg=f"d{name}")
    m = mesh((2, 4), ("data", "model"))
    four, three = ("data", "model", None, None), ("data", "model", None)
    extra = abwd.SdpFp8Operands(four, four, four, four, three, three, three, three)
    specs = abwd.BwdOperands(four, four, None, four, three, three, (None, "data"), extra)
    placed = jax.tree.map(lambda x, sp: put(x, m, *sp), ops, specs, is_leaf=lambda x: isinstance(x, tuple))
    assert "all-gather" not in f.lower(placed).compile().as_text()
    for name, a, w in zip("qkv", f(placed), want, strict=True):
        _assert_close(a, w, name)
    cuda = jax.jit(functools.partial(_run, variant=fp8, path="cuda"))
    text = cuda.trace(ops).lower(lowering_platforms=("cuda",)).as_text()
    assert "@jax_mxfp8_attention_bwd_fp8(" in text
    outs = tuple(jnp.full(x.shape, jnp.nan, jnp.float32) for x in (ops.q, ops.k, ops.k))
    outs += (jnp.zeros(ops.lse.shape[:2] + (ops.lse.shape[2] // 32,), jnp.int32),)
    hook = jax.jit(lambda ops, outs: abwd.attention_bwd(ops, variant=fp8, scale=0.125, out=outs))
    text = hook.trace(ops, outs).lower(lowering_platforms=("cuda",)).as_text()
    assert "@jax_mxfp8_attention_bwd_fp8_into(" in text and text.count("output_operand_alias<") == 4
    with pytest.raises(ValueError, match="fp8_path"):
        _run(dataclasses.replace(ops, fp8=None), fp8)
    with pytest.raises(ValueError, match="bfloat16 v"):
        _run(ops, plain)


def test_do_float16_holds_do_exactly():
    """The dv_f16 operand (attention_operands.do_shift / do_float16) on the library's own square blocks and
    FP8 row factors, row blocks up to 40 binades apart: do_f16 2^shift equals dO^ bit for bit in every block
    within 22 binades of its KV head group's largest, and within half float16's smallest subnormal step
    (2^(shift - 25)) below that; the group's largest element lands in (2^14, 57344] (the tightest power of two
    below float16's max); a NaN block makes its 32 rows NaN (as in the FP8 copies), and no element overflows."""
    from jax_mxfp8.formats.quantize import dequantize
    from jax_mxfp8.primitives.attention_operands import aligned_rows, do_float16, do_shift

    rng = fresh_rng()
    b, t, n, n_kv, h = 2, 128, 4, 2, 64
    mag = 2.0 ** rng.integers(-30, 10, size=(b, t // 32, n, 1))  # per 32-row block
    x = rng.standard_normal((b, t, n, h)) * np.repeat(mag, 32, axis=1)
    x[1, 64:96, 3, :32] = np.nan  # one NaN block (batch 1, KV head 1, row block 2)
    mx_do = attn_ops.square_sequence_major(jnp.asarray(x, jnp.float32), None, "up", "emulated")
    _, dos = aligned_rows(mx_do, t, "emulated")
    do_bf16 = jnp.swapaxes(dequantize(mx_do, jnp.float32), 1, 2).astype(jnp.bfloat16)  # dO^ (B, N, T, H)
    shift = do_shift(dos, n // n_kv)
    got = do_float16(do_bf16, dos, shift)
    assert got.dtype == jnp.float16 and shift.shape == (b, n_kv)
    sh = np.repeat(np.asarray(shift), n // n_kv, axis=1)[:, :, None, None]  # (B, N, 1, 1)
    back = np.asarray(got, np.float64) * 2.0**sh
    want = np.asarray(do_bf16, np.float64)
    assert np.isnan(want).sum() == 32 * 32
    nan_rows = np.broadcast_to(np.isnan(want).any(axis=-1, keepdims=True), want.shape)  # its 32 rows, all H
    np.testing.assert_array_equal(np.isnan(back), nan_rows)
    want = np.where(nan_rows, np.nan, want)
    # each element's square-block exponent (scale byte - 127), head-major like want
    e_blk = np.asarray(mx_do.scale, np.int32).transpose(0, 2, 1, 3) - 127  # (B, N, T/32, H/32)
    e_blk = np.repeat(np.repeat(e_blk, 32, axis=2), 32, axis=3)
    near = (e_blk >= sh + DO_F16_TOP - 22) & ~np.isnan(want)
    assert near.any() and (~near & ~np.isnan(want)).any(), "the case must hold blocks on both sides"
    np.testing.assert_array_equal(back[near], want[near])
    far = ~near & ~np.isnan(want)
    assert np.all(np.abs(back[far] - want[far]) <= 2.0 ** (np.broadcast_to(sh, want.shape)[far] - 25))
    top = np.nanmax(np.abs(np.asarray(got, np.float64)).reshape(b, n_kv, -1), axis=-1)
    assert np.all(top <= 57344.0) and np.all(top > 2.0**14), top
    # the kernel path's operand: the float16 dequantize call (emulated) on the lowered scale bytes
    # (do_float16_scales: shifted, NaN rows 0xFF, clamped at 0 for the blocks far below) gives the same bits
    call = attention_bwd_prepass._operand(mx_do, None, t, "emulated", (dos, shift))
    assert call.dtype == jnp.float16
    np.testing.assert_array_equal(np.isnan(np.asarray(call)), np.isnan(np.asarray(got)))
    np.testing.assert_array_equal(_bits(jnp.where(jnp.isnan(call), 0, call)), _bits(jnp.where(jnp.isnan(got), 0, got)))


def test_dv_f16_call_equals_its_base_variant():
    """The dv_f16 call's emulation (production) on float16 do (do_float16 of the base's bfloat16 do, the shift
    from the random row factors) gives the same variant without dv_f16 (tune 24, the PREVIOUS comparison) dq,
    dk, dv bit for bit, plain and over a 2x4 mesh without gathers, and lowers to the sdp_fp8 target; a dv_f16
    variant refuses bfloat16 do, the others refuse float16 do, and bwd_operands refuses do_f16 without
    fp8_path."""
    from jax_mxfp8.primitives.attention_operands import do_float16, do_shift

    dv16 = _need_variant(dict(h=64, causal=True))  # production: dv_f16
    base = registry.find(registry.AttentionBwdConfig, head_dim=64, causal=True, tune=24)  # the same without it
    assert dv16.dv_f16 and base.sdp_fp8 and base.p_scaled and not base.dv_f16
    rng = fresh_rng()
    ops, _ = _with_fp8(_call_operands(rng), rng)
    shift = do_shift(ops.fp8.dos, ops.q.shape[1] // ops.k.shape[1])
    ops16 = dataclasses.replace(ops, do=do_float16(ops.do, ops.fp8.dos, shift), do_shift=shift)
    want = jax.jit(functools.partial(_run, variant=base))(ops)
    f = jax.jit(functools.partial(_run, variant=dv16))
    for name, a, w in zip("qkv", f(ops16), want, strict=True):
        np.testing.assert_array_equal(_bits(a), _bits(w), err_msg=f"d{name}")
    m = mesh((2, 4), ("data", "model"))
    four, three = ("data", "model", None, None), ("data", "model", None)
    extra = abwd.SdpFp8Operands(four, four, four, four, three, three, three, three)
    specs = abwd.BwdOperands(four, four, None, four, three, three, (None, "data"), extra, ("data", "model"))
    placed = jax.tree.map(lambda x, sp: put(x, m, *sp), ops16, specs, is_leaf=lambda x: isinstance(x, tuple))
    assert "all-gather" not in f.lower(placed).compile().as_text()
    for name, a, w in zip("qkv", f(placed), want, strict=True):
        _assert_close(a, w, name)
    text = jax.jit(functools.partial(_run, variant=dv16, path="cuda")).trace(ops16).lower(lowering_platforms=("cuda",))
    assert "@jax_mxfp8_attention_bwd_fp8(" in text.as_text()
    with pytest.raises(ValueError, match="float16 do"):
        _run(ops, dv16)
    with pytest.raises(ValueError, match="float16 do"):  # the shift given, do still bfloat16
        _run(dataclasses.replace(ops, do_shift=shift), dv16)
    with pytest.raises(ValueError, match="bfloat16 do"):
        _run(ops16, base)
    with pytest.raises(ValueError, match="bfloat16 do"):  # float16 do without its shift
        _run(dataclasses.replace(ops16, do_shift=None), base)
    with pytest.raises(ValueError, match="do_shift must be"):
        _run(dataclasses.replace(ops16, do_shift=shift[:, :1]), dv16)
    with pytest.raises(ValueError, match="fp8_path"):
        abwd.bwd_operands(None, None, None, None, None, None, None, None, q_len=None, kv_len=None, do_f16=True)
