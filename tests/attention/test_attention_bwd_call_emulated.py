"""The ATTENTION_BWD call (primitives/attention_bwd.py) emulated on CPU: partitioning, lowering and operands.

  * sharded over a 2x4 mesh (batch over "data", KV-head groups over "model"; MHA and MQA rules) the call
    needs no gather and equals the unsharded call;
  * the plain call and the `_into` test hook lower to the FFI target with the interface's attributes;
  * sdp_fp8: the FP8 copies of S^T's and dP^T's operands hold the bfloat16 MX operands within the
    re-encoding's bound; the sdp_fp8 call equals the plain call on V = v8 2^eV, partitions and lowers;
  * dv_f16: do_float16 holds dO^ exactly within 22 binades of its group's largest block; the dv_f16 call
    equals its base variant bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops import attention_core as attn_ops
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import attention_bwd_prepass
from jax_mxfp8.primitives.attention_operands import DO_F16_TOP
from tests.attention.attention_bwd_testutil import (
    CASES,
    assert_close,
    attention_static,
    bwd_inputs,
    call_operands,
    f32_bits,
    need_variant,
    plain_variant,
    run_call,
    with_fp8_copies,
)
from tests.attention.attention_testutil import fresh_rng
from tests.parallel.sharding_testutil import mesh, put


def test_sharded_call_equals_unsharded():
    """A 2x4 mesh: batch over "data", KV-head groups over "model". The call partitions without gathers
    and its results equal the unsharded call's."""
    variant = plain_variant(64, True)
    ops = call_operands(fresh_rng())
    f = jax.jit(functools.partial(run_call, variant=variant))
    want = f(ops)
    m = mesh((2, 4), ("data", "model"))
    four, three = ("data", "model", None, None), ("data", "model", None)
    specs = abwd.BwdOperands(four, four, four, four, three, three, (None, "data"))
    placed = jax.tree.map(lambda x, sp: put(x, m, *sp), ops, specs, is_leaf=lambda x: isinstance(x, tuple))
    got = f(placed)
    assert "all-gather" not in f.lower(placed).compile().as_text()
    assert got[0].sharding.spec[:2] == ("data", "model") and got[1].sharding.spec[:2] == ("data", "model")
    for name, a, w in zip("qkv", got, want, strict=True):
        assert_close(a, w, name)
    ql, kl = np.asarray(ops.lens)
    dq, dk = np.asarray(want[0]), np.asarray(want[1])
    assert not dq[np.arange(128)[None, None, :] >= ql[:, None, None].repeat(8, 1)].any()  # rows >= q_len 0
    assert not dk[np.arange(128)[None, None, :] >= kl[:, None, None].repeat(4, 1)].any()


@pytest.mark.parametrize("n,n_kv", [(2, 2), (4, 1)])
def test_mha_and_mqa_rules_partition(n, n_kv):
    """MHA and MQA have their own Shardy rules (no size-1 factor inside a compound one)."""
    variant = plain_variant(64, False)
    ops = call_operands(fresh_rng(), b=2, n=n, n_kv=n_kv)
    f = jax.jit(functools.partial(run_call, variant=variant))
    want = f(ops)
    m = mesh((2, 4), ("data", "model"))
    four, three = ("data", None, None, None), ("data", None, None)
    specs = abwd.BwdOperands(four, four, four, four, three, three, (None, "data"))
    placed = jax.tree.map(lambda x, sp: put(x, m, *sp), ops, specs, is_leaf=lambda x: isinstance(x, tuple))
    for name, a, w in zip("qkv", f(placed), want, strict=True):
        assert_close(a, w, name)


def test_ffi_lowering_and_into_hook():
    """For the GPU (lowered here without one): the plain call and the `_into` hook lower to the interface's
    FFI target with attributes kernel (the variant name), scale (f32) and dq_scale_log2 (s32), the hook
    aliasing its four NaN-filled output buffers to the results (the GPU tests check that the kernel writes
    every element)."""
    variant = plain_variant(64, True)
    ops = call_operands(fresh_rng(), b=1, n=2, n_kv=1)
    outs = tuple(jnp.full(x.shape, jnp.nan, jnp.float32) for x in (ops.q, ops.k, ops.v))
    outs += (jnp.zeros(ops.lse.shape[:2] + (ops.lse.shape[2] // 32,), jnp.int32),)
    hook = jax.jit(lambda ops, outs: abwd.attention_bwd(ops, variant=variant, scale=0.125, out=outs))
    text = hook.trace(ops, outs).lower(lowering_platforms=("cuda",)).as_text()
    assert "@jax_mxfp8_attention_bwd_into(" in text and text.count("output_operand_alias<") == 4
    assert f'kernel = "{variant.name}"' in text and "scale = 1.250000e-01 : f32" in text
    assert "dq_scale_log2 = 0 : i32" in text
    plain = jax.jit(functools.partial(run_call, variant=variant, path="cuda"))
    assert "@jax_mxfp8_attention_bwd(" in plain.trace(ops).lower(lowering_platforms=("cuda",)).as_text()


# ----------------------------------------------------- sdp_fp8: the FP8 copies of S^T's and dP^T's operands
def test_fp8_copies_hold_the_operands():
    """bwd_operands(path="emulated") gives the XLA pre-pass's bfloat16 operands bit for bit (lengths and
    128-padding included). bwd_operands(fp8_path=...): q8, k8, v8, do8 re-encoded to one exponent per 32
    rows, times their row factors (qs without tau log2(e)), equal the bfloat16 MX operands within the
    re-encoding's bound (half an E4M3 subnormal step at the row exponent, 2^-10 2^e, only where an element
    falls below E4M3's normal range), and exactly where the row block's column blocks share one exponent."""
    case = CASES[0]
    st = attention_static(case, "emulated")
    q, k, v, do, dlse, q_len, kv_len = bwd_inputs(case, fresh_rng())

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
        np.testing.assert_array_equal(f32_bits(getattr(calls, name)), f32_bits(getattr(ops, name)), err_msg=name)
    assert with_fp8.v is None  # V reaches the sdp_fp8 kernel only as v8
    # do_f16 (dv_f16 variants): the float16 dequantize call on lowered scale bytes gives do_float16's values
    # (XLA's float32 pass) bit for bit, and those times 2^shift are the bfloat16 dO^ (exact at these scales)
    assert f16_call.do.dtype == jnp.float16 and f16_call.do_shift.shape == (ops.do.shape[0], case["n_kv"])
    np.testing.assert_array_equal(f32_bits(f16_call.do), f32_bits(f16_xla.do))
    np.testing.assert_array_equal(np.asarray(f16_call.do_shift), np.asarray(f16_xla.do_shift))
    sh = np.repeat(np.asarray(f16_call.do_shift), ops.do.shape[1] // case["n_kv"], axis=1)[:, :, None, None]
    np.testing.assert_array_equal(np.asarray(f16_call.do, np.float64) * 2.0**sh, np.asarray(ops.do, np.float64))
    for name in ("q", "k", "do", "lse", "delta", "lens"):
        np.testing.assert_array_equal(f32_bits(getattr(with_fp8, name)), f32_bits(getattr(ops, name)), err_msg=name)
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


def test_sdp_fp8_call_partitions_and_lowers():
    """The sdp_fp8 target (jax_mxfp8_attention_bwd_fp8, 14 operands: v8 in v's place): its emulation is the
    plain call's on V = v8 2^eV, it partitions over a 2x4 mesh without gathers like the plain call, lowers to
    its own target (and its `_into` hook), and refuses operands without the FP8 copies (and the plain
    variants refuse operands without v)."""
    plain = plain_variant(64, True)
    # tune 24: sdp_fp8 with bfloat16 do (the PREVIOUS comparison schedule; production's dv_f16 is tested below)
    fp8 = registry.find(registry.AttentionBwdConfig, head_dim=64, causal=True, tune=24)
    assert fp8.sdp_fp8 and not fp8.dv_f16
    rng = fresh_rng()
    ops, plain_ops = with_fp8_copies(call_operands(rng), rng)
    f = jax.jit(functools.partial(run_call, variant=fp8))
    want = jax.jit(functools.partial(run_call, variant=plain))(plain_ops)
    got = f(ops)
    for name, a, w in zip("qkv", got, want, strict=True):
        np.testing.assert_array_equal(f32_bits(a), f32_bits(w), err_msg=f"d{name}")
    m = mesh((2, 4), ("data", "model"))
    four, three = ("data", "model", None, None), ("data", "model", None)
    extra = abwd.SdpFp8Operands(four, four, four, four, three, three, three, three)
    specs = abwd.BwdOperands(four, four, None, four, three, three, (None, "data"), extra)
    placed = jax.tree.map(lambda x, sp: put(x, m, *sp), ops, specs, is_leaf=lambda x: isinstance(x, tuple))
    assert "all-gather" not in f.lower(placed).compile().as_text()
    for name, a, w in zip("qkv", f(placed), want, strict=True):
        assert_close(a, w, name)
    cuda = jax.jit(functools.partial(run_call, variant=fp8, path="cuda"))
    text = cuda.trace(ops).lower(lowering_platforms=("cuda",)).as_text()
    assert "@jax_mxfp8_attention_bwd_fp8(" in text
    outs = tuple(jnp.full(x.shape, jnp.nan, jnp.float32) for x in (ops.q, ops.k, ops.k))
    outs += (jnp.zeros(ops.lse.shape[:2] + (ops.lse.shape[2] // 32,), jnp.int32),)
    hook = jax.jit(lambda ops, outs: abwd.attention_bwd(ops, variant=fp8, scale=0.125, out=outs))
    text = hook.trace(ops, outs).lower(lowering_platforms=("cuda",)).as_text()
    assert "@jax_mxfp8_attention_bwd_fp8_into(" in text and text.count("output_operand_alias<") == 4
    with pytest.raises(ValueError, match="fp8_path"):
        run_call(dataclasses.replace(ops, fp8=None), fp8)
    with pytest.raises(ValueError, match="bfloat16 v"):
        run_call(ops, plain)


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

    @jax.jit  # the library's side as one program (eager dispatch compiles many small ones)
    def run(x):
        mx_do = attn_ops.square_sequence_major(x, None, "up", "emulated")
        _, dos = aligned_rows(mx_do, t, "emulated")
        do_bf16 = jnp.swapaxes(dequantize(mx_do, jnp.float32), 1, 2).astype(jnp.bfloat16)  # dO^ (B, N, T, H)
        shift = do_shift(dos, n // n_kv)
        # the kernel path's operand: the float16 dequantize call (emulated) on the lowered scale bytes
        call = attention_bwd_prepass._operand(mx_do, None, t, "emulated", (dos, shift))
        return mx_do, do_bf16, shift, do_float16(do_bf16, dos, shift), call

    mx_do, do_bf16, shift, got, call = run(jnp.asarray(x, jnp.float32))
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
    # the kernel path's operand (do_float16_scales: shifted, NaN rows 0xFF, clamped at 0 for the blocks far
    # below) gives the same bits
    assert call.dtype == jnp.float16
    np.testing.assert_array_equal(np.isnan(np.asarray(call)), np.isnan(np.asarray(got)))
    unnan = lambda x: f32_bits(jnp.where(jnp.isnan(x), 0, x))  # noqa: E731
    np.testing.assert_array_equal(unnan(call), unnan(got))


def test_dv_f16_call_equals_its_base_variant():
    """The dv_f16 call's emulation (production) on float16 do (do_float16 of the base's bfloat16 do, the shift
    from the random row factors) gives the same variant without dv_f16 (tune 24, the PREVIOUS comparison) dq,
    dk, dv bit for bit, plain and over a 2x4 mesh without gathers, and lowers to the sdp_fp8 target; a dv_f16
    variant refuses bfloat16 do, the others refuse float16 do, and bwd_operands refuses do_f16 without
    fp8_path."""
    from jax_mxfp8.primitives.attention_operands import do_float16, do_shift

    dv16 = need_variant(dict(h=64, causal=True))  # production: dv_f16
    base = registry.find(registry.AttentionBwdConfig, head_dim=64, causal=True, tune=24)  # the same without it
    assert dv16.dv_f16 and base.sdp_fp8 and base.p_scaled and not base.dv_f16
    rng = fresh_rng()
    ops, _ = with_fp8_copies(call_operands(rng), rng)
    shift = do_shift(ops.fp8.dos, ops.q.shape[1] // ops.k.shape[1])
    ops16 = dataclasses.replace(ops, do=do_float16(ops.do, ops.fp8.dos, shift), do_shift=shift)
    want = jax.jit(functools.partial(run_call, variant=base))(ops)
    f = jax.jit(functools.partial(run_call, variant=dv16))
    for name, a, w in zip("qkv", f(ops16), want, strict=True):
        np.testing.assert_array_equal(f32_bits(a), f32_bits(w), err_msg=f"d{name}")
    m = mesh((2, 4), ("data", "model"))
    four, three = ("data", "model", None, None), ("data", "model", None)
    extra = abwd.SdpFp8Operands(four, four, four, four, three, three, three, three)
    specs = abwd.BwdOperands(four, four, None, four, three, three, (None, "data"), extra, ("data", "model"))
    placed = jax.tree.map(lambda x, sp: put(x, m, *sp), ops16, specs, is_leaf=lambda x: isinstance(x, tuple))
    assert "all-gather" not in f.lower(placed).compile().as_text()
    for name, a, w in zip("qkv", f(placed), want, strict=True):
        assert_close(a, w, name)
    cuda = jax.jit(functools.partial(run_call, variant=dv16, path="cuda"))
    assert "@jax_mxfp8_attention_bwd_fp8(" in cuda.trace(ops16).lower(lowering_platforms=("cuda",)).as_text()
    with pytest.raises(ValueError, match="float16 do"):
        run_call(ops, dv16)
    with pytest.raises(ValueError, match="float16 do"):  # the shift given, do still bfloat16
        run_call(dataclasses.replace(ops, do_shift=shift), dv16)
    with pytest.raises(ValueError, match="bfloat16 do"):
        run_call(ops16, base)
    with pytest.raises(ValueError, match="bfloat16 do"):  # float16 do without its shift
        run_call(dataclasses.replace(ops16, do_shift=None), base)
    with pytest.raises(ValueError, match="do_shift must be"):
        run_call(dataclasses.replace(ops16, do_shift=shift[:, :1]), dv16)
    with pytest.raises(ValueError, match="fp8_path"):
        abwd.bwd_operands(None, None, None, None, None, None, None, None, q_len=None, kv_len=None, do_f16=True)
