"""Helpers of the Hopper attention backward's CPU tests (the kernel path with its FFI calls emulated).

CASES: small (b, t, s, n, n_kv, h, causal, lengths[, dtype]) cases, T and S multiples of 32 but not of 128
(the pre-pass pads to 128), except the last. `same_residual_grads` runs the emulated forward once and both
backwards (the kernel path's and the reference's) on its residuals. `call_operands` builds random pre-pass
operands for the ATTENTION_BWD call itself, `run_call` calls it. Nothing here computes an expected value.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.ops import attention_core as attn_ops
from jax_mxfp8.ops.attention import mx_attention_bwd
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.reference.attention_quant import fake_quant_square
from tests.attention.attention_testutil import fresh_rng

CASES = [
    dict(b=2, t=96, s=160, n=4, n_kv=2, h=64, causal=True, lengths=True),  # GQA
    dict(b=1, t=160, s=96, n=2, n_kv=2, h=128, causal=False, lengths=False),  # MHA
    dict(b=2, t=64, s=224, n=2, n_kv=1, h=64, causal=False, lengths=True, dtype="float32"),  # MQA, float32
    dict(b=1, t=128, s=128, n=2, n_kv=1, h=128, causal=True, lengths=True),  # multiples of 128
]


def case_id(case):
    return "-".join(f"{k}{v}" for k, v in case.items())


def bwd_inputs(case, rng):
    b, t, s, n, n_kv, h = (case[k] for k in ("b", "t", "s", "n", "n_kv", "h"))
    dt = input_dtype(case)
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


def input_dtype(case) -> np.dtype:
    """Inputs (and so the output and gradients): bfloat16, or float32 (quantized from float32; the kernel's
    O upcast)."""
    return np.dtype(jnp.dtype(case.get("dtype", "bfloat16")))


def attention_static(case, impl_path, config=None):
    return attn_ops.AttentionStatic(
        config=config or AttentionConfig(),
        scale=case["h"] ** -0.5,
        is_causal=case["causal"],
        is_mx=(False, False, False),
        out_dtype=input_dtype(case),
        group=case["n"] // case["n_kv"],
        impl=impl_path,
    )


def plain_variant(h: int, causal: bool):
    """A backward variant that takes the plain call (bfloat16 q, k, v, do): tune 17, production's schedule on
    BF16 wgmma only (production itself takes the sdp_fp8 call)."""
    variant = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=causal, tune=17)
    assert variant is not None and not variant.sdp_fp8
    return variant


def need_variant(case, config=None):
    cfg = config or AttentionConfig()
    variant, why = abwd.kernel_variant(
        head_dim=case["h"], causal=case["causal"], p_scale=cfg.p_scale, p_rounding=cfg.scale_rounding,
        dq_accum=cfg.dq_accum,
    )  # fmt: skip
    if variant is None:
        pytest.skip(why)
    return variant


@functools.cache
def fwd_then_bwd(st: attn_ops.AttentionStatic, st_bwd: attn_ops.AttentionStatic):
    """jit: the forward of `st` (residuals), then the bwd of `st_bwd` on those residuals."""

    def run(q, k, v, do, dlse, q_len, kv_len):
        (o, lse), res = attn_ops.mx_attention_fwd(st, q, k, v, None, None, q_len, kv_len)
        grads = mx_attention_bwd(st_bwd, res, (do, dlse))
        return o, lse, grads[:3]

    return jax.jit(run)


def same_residual_grads(case, config=None):
    """(dq, dk, dv) of the kernel-path backward (emulated; asserted taken) and of the reference backward, both on
    the emulated forward's residuals of fresh inputs with a random dO and dLSE."""
    q, k, v, do, dlse, q_len, kv_len = bwd_inputs(case, fresh_rng())
    st = attention_static(case, "emulated", config)
    with impl.record() as decisions:
        got = fwd_then_bwd(st, st)(q, k, v, do, dlse, q_len, kv_len)
    assert (kbwd.OP, "emulated") in [(d.op, d.path) for d in decisions]  # the kernel path was taken
    want = fwd_then_bwd(st, dataclasses.replace(st, impl="xla"))(q, k, v, do, dlse, q_len, kv_len)
    return got[2], want[2]


def f32_bits(x):
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


def call_operands(rng, b=4, n=8, n_kv=4, tp=128, sp=128, h=64):
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


def run_call(ops, variant, path="emulated"):
    return abwd.attention_bwd(ops, variant=variant, scale=0.125, path=path)


def assert_close(a, w, name):
    """XLA:CPU may order float32 sums differently for a merged or per-device batch (the forward's sharding
    test saw 1-ulp LSE differences); a wrong shard or batch mapping changes whole rows, far beyond this."""
    a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
    exact = np.mean(a == w)
    assert exact > 0.99 and sqnr_db(w, a) >= 60.0, (name, exact, sqnr_db(w, a))


def with_fp8_copies(ops, rng):
    """(ops with random sdp_fp8 copies and v None, ops with v = v8 2^eV in bfloat16: what the sdp_fp8 call's
    emulation reads for V; it reads q, k, do in bfloat16 and ignores q8, k8, do8 and their factors)."""
    f8 = lambda x: x.astype(jnp.float8_e4m3fn)  # noqa: E731
    pow2 = lambda x: jnp.asarray(2.0 ** rng.integers(-3, 3, x.shape[:2] + (x.shape[2] // 32,)), jnp.float32)  # noqa: E731
    extra = abwd.SdpFp8Operands(f8(ops.q), f8(ops.k), f8(ops.v), f8(ops.do), pow2(ops.q), pow2(ops.k), pow2(ops.v),
                                pow2(ops.do))  # fmt: skip
    v_equiv = (extra.v8.astype(jnp.float32) * jnp.repeat(extra.vs, 32, axis=2)[..., None]).astype(jnp.bfloat16)
    return dataclasses.replace(ops, v=None, fp8=extra), dataclasses.replace(ops, v=v_equiv)
