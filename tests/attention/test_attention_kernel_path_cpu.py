"""The kernel path of jax_mxfp8.dot_product_attention on CPU, with the sm_90a kernel replaced by its emulation.

implementation="cuda" runs: square MX quantization of the caller's BTNH arrays (sequence-major residuals),
the producer pass (prepare_sequence_major; its realign step emulated), the kernel (here
primitives.attention_fwd.emulate_fwd through the same custom_partitioning call, implementation="emulated").
Checked against independent paths:
  * residuals are bit-identical to the head-major quantization of the XLA path, and the producer's output to
    `prepare` on that quantization;
  * O is bit-identical to the emulation run on head-major operands quantized separately, also with
    AttentionConfig(p_scale="block") (the kernel's per-row-tile P scale);
  * float32 inputs are quantized from float32 and O carries the kernel's bfloat16 values.
The forward and gradients against float64 and the reference: test_attention_implementations.py; the GPU
tests (test_attention_kernel_gpu.py) run the same path on the real kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.ops import attention_core as attn_ops
from jax_mxfp8.primitives import attention_operands as operands
from tests.attention.attention_kernel_testutil import emulated
from tests.attention.attention_oracle import sqnr_db
from tests.attention.attention_testutil import assert_bits_equal, fresh_rng

CASES = [
    dict(b=2, t=256, s=256, n=4, n_kv=2, h=64, causal=False, lengths=True),
    dict(b=1, t=160, s=288, n=2, n_kv=1, h=128, causal=True, lengths=False),
    dict(b=2, t=96, s=160, n=2, n_kv=2, h=64, causal=True, lengths=True),  # T, S not multiples of 128
]


def _id(case):
    return "-".join(f"{k}{v}" for k, v in case.items())


def _inputs(case, rng):
    b, t, s, n, n_kv, h = (case[k] for k in ("b", "t", "s", "n", "n_kv", "h"))
    q = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((b, s, n_kv, h)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((b, s, n_kv, h)) * 3.0, jnp.bfloat16)
    q_len = kv_len = None
    if case["lengths"]:
        q_len = jnp.asarray(rng.integers(1, t + 1, size=b), jnp.int32).at[0].set(t)
        kv_len = jnp.asarray(rng.integers(0, s + 1, size=b), jnp.int32).at[0].set(s - 5)
    return q, k, v, q_len, kv_len


def _why_not(case, config):
    return attn_ops.kernel_unsupported(
        config, head_dim=case["h"], is_causal=case["causal"], has_bias=False, has_mask=False,
        out_dtype=jnp.bfloat16, mx_inputs=[],
    )  # fmt: skip


def _static(case, impl):
    return attn_ops.AttentionStatic(
        config=AttentionConfig(),
        scale=case["h"] ** -0.5,
        is_causal=case["causal"],
        is_mx=(False, False, False),
        out_dtype=np.dtype(jnp.bfloat16),
        group=case["n"] // case["n_kv"],
        impl=impl,
    )


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_residuals_and_producer_equal_head_major_path(case):
    """Sequence-major residuals dequantize to the XLA path's operands bit for bit, and the producer pass on
    them (prepare_sequence_major, realign emulated) equals `prepare` on the head-major quantization."""
    q, k, v, q_len, kv_len = _inputs(case, fresh_rng())
    st_c, st_x = _static(case, "cuda"), _static(case, "xla")
    keys = ("q:square", "k:square", "v:square")

    # Each path runs under one jit (eager dispatch compiled ~1800 small programs: ~40 s per case on CI).
    @jax.jit
    def cuda_path(q, k, v, q_len, kv_len):
        qc = attn_ops.quantize_operands(st_c, q, k, v, q_len, kv_len)
        ops = tuple(attn_ops._operand(st_c, qc, key, q_len, kv_len) for key in keys)
        seq = [attn_ops.kernel_operand(qc, key, q_len if key == "q:square" else kv_len) for key in keys]
        got = operands.prepare_sequence_major(*seq, scale=0.125, q_len=q_len, kv_len=kv_len, path="emulated")
        return qc, ops, got

    @jax.jit
    def xla_path(q, k, v, q_len, kv_len):
        qx = attn_ops.quantize_operands(st_x, q, k, v, q_len, kv_len)
        ops = tuple(attn_ops._operand(st_x, qx, key, q_len, kv_len) for key in keys)
        b, n_kv, g, t, h = qx["q:square"].shape
        qh = qx["q:square"]
        qh = MXArray(
            qh.data.reshape(b, n_kv * g, t, h), qh.scale.reshape(b, n_kv * g, t // 32, h // 32), (-2, -1), "square"
        )
        want = operands.prepare(qh, qx["k:square"], qx["v:square"], scale=0.125, q_len=q_len, kv_len=kv_len)
        return qx, ops, want

    (qc, ops_c, got), (qx, ops_x, want) = cuda_path(q, k, v, q_len, kv_len), xla_path(q, k, v, q_len, kv_len)
    assert set(qc) == set(qx) == set(keys)
    for key, a, w in zip(keys, ops_c, ops_x):
        assert qc[key].axes == (-3, -1) and qx[key].axes == (-2, -1)
        assert_bits_equal(a, w)
    for field in ("q", "k", "vt", "qs", "ks", "vs", "vi", "lens"):
        a, w = getattr(got, field), getattr(want, field)
        if a.dtype == jnp.float8_e4m3fn:
            a, w = a.view(jnp.uint8), w.view(jnp.uint8)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(w), err_msg=field)


PATH_CASES = [(case, "const") for case in CASES] + [(CASES[0], "block"), (CASES[2], "block")]


@pytest.mark.parametrize("case,p_scale", PATH_CASES, ids=[f"{_id(c)}-{p}" for c, p in PATH_CASES])
def test_kernel_path_forward_equals_the_kernel_emulation(case, p_scale):
    """dot_product_attention(implementation="emulated") takes the kernel path, and its O is the standalone
    kernel emulation's (attention_kernel_testutil.emulated: producer pass + emulate_fwd on the caller's
    layout) bit for bit on the valid rows: the op's layout, residual quantization and lengths wiring add
    nothing. (Its gradients against the reference: tests/attention/test_attention_implementations.py.)"""
    q, k, v, q_len, kv_len = _inputs(case, fresh_rng())
    config = AttentionConfig(p_scale=p_scale)
    assert _why_not(case, config) is None  # the kernel covers it: implementation="emulated" takes the kernel path
    kw = dict(is_causal=case["causal"], query_seq_lengths=q_len, key_value_seq_lengths=kv_len, config=config)
    o_c = jax.jit(lambda q, k, v: mx.dot_product_attention(q, k, v, implementation="emulated", **kw))(q, k, v)
    o_e, _ = jax.jit(
        lambda q, k, v, ql, kl: emulated(q, k, v, causal=case["causal"], q_len=ql, kv_len=kl, config=config)
    )(q, k, v, q_len, kv_len)
    rows = np.arange(case["t"])[None, :, None, None] < (
        np.asarray(q_len)[:, None, None, None] if q_len is not None else case["t"]
    )
    o_c, o_e = np.asarray(o_c.astype(jnp.float32)), np.asarray(o_e.astype(jnp.bfloat16).astype(jnp.float32))
    assert not np.isnan(o_c).any()
    np.testing.assert_array_equal(np.where(rows, o_c, 0), np.where(rows, o_e, 0))


def test_float32_inputs_take_the_kernel_path_quantized_from_float32():
    """float32 q/k/v run the kernel (not silently the reference): quantized from float32 itself (not
    from a bfloat16 copy), O returned as float32 holding the kernel's bfloat16 values."""
    case = CASES[2]
    rng = fresh_rng()
    q, k, v, q_len, kv_len = (None if a is None else a.astype(jnp.float32) for a in _inputs(case, rng))
    # off the bfloat16 grid, so that a bfloat16 round trip before the quantization would change MX values
    q, k, v = (a + jnp.asarray(rng.standard_normal(a.shape) * 2e-3, jnp.float32) for a in (q, k, v))
    q_len, kv_len = (None if a is None else a.astype(jnp.int32) for a in (q_len, kv_len))
    why = attn_ops.kernel_unsupported(
        AttentionConfig(), head_dim=case["h"], is_causal=case["causal"], has_bias=False, has_mask=False,
        out_dtype=jnp.float32, mx_inputs=[],
    )  # fmt: skip
    assert why is None

    def run(impl, *qkv):  # one program per call (eager dispatch compiles many small ones)
        kw = dict(is_causal=case["causal"], query_seq_lengths=q_len, key_value_seq_lengths=kv_len, implementation=impl)
        return jax.jit(lambda q, k, v: mx.dot_product_attention(q, k, v, **kw))(*qkv)

    o_c = run("emulated", q, k, v)
    assert o_c.dtype == jnp.float32
    o_e, _ = jax.jit(lambda q, k, v: emulated(q, k, v, causal=case["causal"], q_len=q_len, kv_len=kv_len))(q, k, v)
    rows = np.arange(case["t"])[None, :, None, None] < np.asarray(q_len)[:, None, None, None]
    o_c = np.asarray(o_c)
    np.testing.assert_array_equal(o_c, np.asarray(o_c.astype(jnp.bfloat16).astype(jnp.float32)))  # bf16 values
    want = np.asarray(o_e.astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(np.where(rows, o_c, 0), np.where(rows, want, 0))
    via_bf16 = np.asarray(run("emulated", *(a.astype(jnp.bfloat16) for a in (q, k, v))), np.float32)
    assert np.any(np.where(rows, via_bf16 != o_c, False))  # the quantization saw float32 values
    ref = np.asarray(run("xla", q, k, v), np.float64)
    assert sqnr_db(np.where(rows, ref, 0), np.where(rows, o_c, 0)) >= 40.0
