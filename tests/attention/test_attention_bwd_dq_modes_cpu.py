"""The backward kernel's dQ modes on CPU (emulated): dq_accum "fp16" with AttentionConfig.dq_fp16_scale_log2,
and deterministic=True (kernels/sm90/attention_bwd_dq.py; the kernel's bits:
tests/attention/test_attention_bwd_dq_modes_gpu.py).

  * config validation: ValueErrors naming dq_fp16_scale_log2 / deterministic / dq_scale_log2; the registry's
    dQ-mode variants and their constraints;
  * the call: its dq is float16 dQ * 2^e (dtype, exponent plumbed: e = 0 loses small gradients that e = 12
    keeps, both against the float32 call), dq_sem the deterministic counters, the lowering's attributes;
  * overflow: |dQ| 2^e beyond float16 comes out Inf / NaN, never a finite wrong value;
  * the op: dot_product_attention with dq_accum "fp16" (e = 10) and deterministic=True takes the kernel path
    and its gradients equal the reference backward's on the same residuals bit for bit.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.ops import attention_core as attn_ops
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import implementation as impl
from tests.attention.attention_bwd_testutil import (
    CASES,
    attention_static,
    call_operands,
    f32_bits,
    run_call,
    same_residual_grads,
)
from tests.attention.attention_testutil import fresh_rng


def _variant(h=64, causal=True, **mode):
    v = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=causal, **mode)
    assert v is not None, mode
    return v


@pytest.fixture(scope="module")
def ops():
    return call_operands(fresh_rng(), b=1, n=2, n_kv=1, tp=128, sp=256, h=64)  # 2 KV tiles into each dQ


def test_config_validation():
    for bad in (16, -1, True, 12.0, "12"):
        with pytest.raises(ValueError, match="dq_fp16_scale_log2"):
            AttentionConfig(dq_accum="fp16", dq_fp16_scale_log2=bad)
    with pytest.raises(ValueError, match="deterministic"):
        AttentionConfig(deterministic=1)
    assert AttentionConfig().dq_fp16_scale_log2 == 12 and not AttentionConfig().deterministic
    with pytest.raises(ValueError, match="dq_store='red'"):
        registry.AttentionBwdConfig(dq_accum="fp16", dq_store="tma_warp")  # the TMA reductions are float32 only
    with pytest.raises(ValueError, match="dq_store"):
        registry.AttentionBwdConfig(deterministic=True, dq_store="bulk")
    for mode, suffix in ((dict(dq_accum="fp16"), "_fp16"), (dict(deterministic=True), "_det")):
        v, why = abwd.kernel_variant(head_dim=128, causal=True, **mode)
        assert why is None and v.name == f"attention_bwd_h128_causal{suffix}" and v.dq_mode
    v, _ = abwd.kernel_variant(head_dim=64, causal=False, dq_accum="fp16", deterministic=True)
    assert v.name == "attention_bwd_h64_fp16_det" and (v.dq_accum, v.deterministic, v.dq_store) == ("fp16", True, "red")
    # the kernel forward covers the dQ options (they only change the backward)
    cfg = AttentionConfig(dq_accum="fp16", dq_fp16_scale_log2=9, deterministic=True)
    why = attn_ops.kernel_unsupported(
        cfg, head_dim=64, is_causal=True, has_bias=False, has_mask=False, out_dtype=jnp.bfloat16, mx_inputs=()
    )
    assert why is None, why


def test_bad_exponent_raises(ops):
    with pytest.raises(ValueError, match="dq_scale_log2"):
        _run_e(ops, _variant(dq_accum="fp16"), 16)
    with pytest.raises(ValueError, match="dq_scale_log2"):
        _run_e(ops, _variant(dq_accum="fp16"), True)


def _run_e(ops, variant, e):
    return abwd.attention_bwd(ops, variant=variant, scale=0.125, dq_scale_log2=e, path="emulated")


def test_fp16_call_and_exponent(ops):
    """The call's dq is float16 (dQ * 2^e; the op's dq is it times 2^-e). Small gradients (median |dQ| < 2^-25):
    e = 12 keeps them to float16 accuracy against the float32 call, e = 0 flushes most of them to 0
    (float16's smallest subnormal is 2^-24): the exponent reaches the accumulator."""
    do = (ops.do.astype(jnp.float32) * 2.0**-24).astype(ops.do.dtype)  # exact: a power of 2
    small = dataclasses.replace(ops, delta=ops.delta * 2.0**-24, do=do)  # dQ x 2^-24
    fp16 = _variant(dq_accum="fp16")
    call = abwd.AttentionBwdCall(fp16, 0.125, 1, 1, 12)
    raw = jax.eval_shape(lambda *a: abwd.ATTENTION_BWD.call(call, "emulated", *a), *small.args())
    assert raw[0].dtype == jnp.float16 and raw[0].shape == ops.q.shape
    assert raw[3].shape == (1, 2, 128 // 32) and raw[3].dtype == jnp.int32
    dq32 = np.asarray(jax.jit(lambda o: run_call(o, _variant(tune=17)))(small)[0], np.float64)  # fp32, BF16 GEMMs
    dq12, dq0 = (np.asarray(jax.jit(lambda o, e=e: _run_e(o, fp16, e))(small)[0], np.float64) for e in (12, 0))
    live = dq32 != 0
    assert np.median(np.abs(dq32[live])) < 2.0**-25
    assert sqnr_db(dq32, dq12) >= 50.0 and np.mean(dq12[live] == 0) < 0.02
    assert np.mean(dq0[live] == 0) > 0.3


def test_fp16_overflow_is_inf(ops):
    """e = 15: wherever the float32 call's |dQ| 2^15 > 2 * 65504 the float16 call's dq is Inf or NaN, and
    its finite elements are dQ to float16 accuracy."""
    dq32 = np.asarray(jax.jit(lambda o: run_call(o, _variant(tune=17)))(ops)[0], np.float64)  # fp32, BF16 GEMMs
    dq16 = np.asarray(jax.jit(lambda o: _run_e(o, _variant(dq_accum="fp16"), 15))(ops)[0], np.float64)
    big = np.abs(dq32) * 2.0**15 > 2 * 65504
    assert big.any() and not np.isfinite(dq16[big]).any()
    fin = np.isfinite(dq16)  # no finite wrong value: the finite ones are dQ to float16 accuracy
    assert fin.mean() > 0.1 and sqnr_db(dq32[fin], dq16[fin]) >= 35.0


def test_lowering_attributes(ops):
    variant = _variant(dq_accum="fp16", deterministic=True)
    f = jax.jit(lambda o: abwd.attention_bwd(o, variant=variant, scale=0.125, dq_scale_log2=11))
    text = f.trace(ops).lower(lowering_platforms=("cuda",)).as_text()
    assert "@jax_mxfp8_attention_bwd(" in text and f'kernel = "{variant.name}"' in text
    assert "dq_scale_log2 = 11 : i32" in text and "x64xf16>" in text


def test_op_picks_the_dq_mode_variant():
    cfg = AttentionConfig(dq_accum="fp16", dq_fp16_scale_log2=10, deterministic=True)
    with impl.record() as decisions:
        variant, why = kbwd.backward_variant(attention_static(CASES[0], "emulated", cfg), 64)
    assert why is None and variant.name == "attention_bwd_h64_causal_fp16_det"
    assert [(d.op, d.path) for d in decisions] == [(kbwd.OP, "emulated")]


@pytest.mark.slow  # ~35 s on a loaded 2-core machine (a forward + backward compile)
def test_kernel_path_equals_reference_bit_for_bit():
    """dot_product_attention's backward with dq_accum "fp16" (e = 10) and deterministic=True: the emulated
    kernel path (the fp16 det variant) equals the reference backward on the same residuals bit for bit."""
    case = CASES[0]
    cfg = AttentionConfig(dq_accum="fp16", dq_fp16_scale_log2=10, deterministic=True)
    got, want = same_residual_grads(case, cfg)
    for name, a, w in zip("qkv", got, want, strict=True):
        np.testing.assert_array_equal(f32_bits(a), f32_bits(w), err_msg=f"d{name}")
    assert np.abs(np.asarray(got[0], np.float32)).max() > 0
