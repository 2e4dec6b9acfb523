"""MXFP8 attention reference on a GPU backend: the quantization survives XLA's GPU compilation.

XLA's GPU pipeline deletes f32 -> f8 -> f32 convert chains (SimplifyFPConversions under the default
--xla_allow_excess_precision), which once made the "quantized" reference equal to BF16 attention on the
H200. These checks run the reference on the GPU and compare it with the float64 emulation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.reference.attention_quant import fake_quant_p, fake_quant_square
from tests.attention.attention_oracle import EmuConfig, exact_attention, mx_attention, sqnr_db
from tests.attention.attention_testutil import fresh_rng, lib_fwd_bwd, normal_inputs

pytestmark = pytest.mark.gpu


def test_fake_quant_rounds_on_gpu():
    x = jnp.asarray(fresh_rng().standard_normal((64, 64)), jnp.float32)
    p = jax.jit(lambda x: fake_quant_p(jnp.abs(x) / 8, -1, "const", "up"))(x)
    s = jax.jit(fake_quant_square)(x)
    # E4M3 keeps 3 mantissa bits: the low 20 mantissa bits of every float32 result are zero.
    for y in (p, s):
        bits = np.asarray(y).view(np.uint32)
        assert np.all(bits & 0xFFFFF == 0)
        assert not np.array_equal(np.asarray(y), np.asarray(x))


@pytest.mark.parametrize("cfg_kw", [{}, dict(qkv_blocks="row", p_scale="block", dq_accum="fp16")])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gpu_reference_matches_emulation(cfg_kw, is_causal):
    q, k, v, do = normal_inputs(fresh_rng(), b=1, t=256, s=256, n=4, n_kv=2, h=128)
    # the reference, pinned: on an sm_90 GPU implementation=None runs the Hopper kernel for float32 inputs too
    # (bfloat16 O: ~46-49 dB against the float64 emulation), which tests/attention/test_attention_kernel_gpu.py checks
    got = lib_fwd_bwd(q, k, v, do, config=mx.AttentionConfig(**cfg_kw), is_causal=is_causal, implementation="xla")
    want = mx_attention(q, k, v, do, cfg=EmuConfig(**cfg_kw), causal=is_causal)
    for label, x, r in zip(("O", "LSE", "dQ", "dK", "dV"), got, want, strict=True):
        assert sqnr_db(x, r) >= 55, label
    exact = exact_attention(q, k, v, do, causal=is_causal)
    assert sqnr_db(got[0], exact[0]) < 35  # quantization really happened (unquantized would be > 40 dB)
