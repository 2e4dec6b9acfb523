"""One set of attention cases run over every implementation (the tokamax habit: a shared test base).

`AttentionImplementationCases` (tests/attention/attention_cases_testutil.py) holds the cases; each subclass
here names one `implementation` of
jax_mxfp8.dot_product_attention / varlen_attention / broadcast_query_attention / dot_product_attention_vjp:
  "xla"       the reference (the contract's numerics);
  "emulated"  the Hopper kernel path with the kernel calls' XLA emulation (runs on CPU in CI);
  "cuda"      the kernels themselves (marked gpu: the GPU machine only).
Every check compares against something the implementation under test did not produce: float64 unquantized
attention (tests/attention/attention_oracle.exact_attention), a float64 one-hot oracle at huge logits, the
reference's own quantize, the op's definition through another op, and, for the kernel paths, the "xla"
reference (each path with its own forward; output and LSE cotangents). The kernel paths' finer properties
(same-residual bits, the pre-pass, the calls' partitioning) are in test_attention_kernel_path_cpu.py,
test_attention_bwd_kernel_path_cpu.py and test_attention_bwd_call_emulated.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library
from tests.attention.attention_cases_testutil import AttentionImplementationCases, _backward_path
from tests.attention.attention_oracle import sqnr_db
from tests.attention.attention_testutil import fresh_rng


class TestXla(AttentionImplementationCases):
    IMPLEMENTATION = "xla"
    BROADCAST_CAUSAL = (False,)


class TestEmulated(AttentionImplementationCases):
    IMPLEMENTATION = "emulated"
    GRADS_VS_REFERENCE_DB = 40.0  # same arithmetic as the reference up to the forward's re-encoding
    BROADCAST_CAUSAL = (True,)
    MX_GRADS_DTYPE = jnp.float32  # the kernel path quantizes float32 inputs from float32

    @pytest.mark.slow  # the forward and backward kernel paths of two ops compiled: ~60 s on the 2-core machine
    def test_broadcast_query_equals_tiled_query(self):
        super().test_broadcast_query_equals_tiled_query()


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90_attention_fwd")
class TestCuda(AttentionImplementationCases):
    IMPLEMENTATION = "cuda"
    # the same kinds of case at sizes of several 128-row tiles (T, S not all multiples of 128)
    CASES = {
        "gqa": (2, 384, 416, 4, 2, 128, False, True, jnp.bfloat16),
        "mqa-causal-f32": (1, 256, 256, 2, 1, 64, True, False, jnp.float32),
        "mha-causal-lengths": (2, 384, 256, 4, 4, 128, True, True, jnp.bfloat16),
    }
    GRADS_VS_REFERENCE_DB = 35.0  # the backward kernel's gate (FP8 S^T, dP^T in production)
    BROADCAST_GRADS_EXACT = False

    def check_backward_path(self, decisions):
        if _backward_path(decisions) != {"cuda"}:
            pytest.skip(f"the backward kernel does not run here: {[d.reason for d in decisions if d.op == kbwd.OP]}")

    def test_broadcast_query_equals_tiled_query(self):
        names = {name for name, _ in library.kernel_names()}
        assert {"attention_fwd_h64_bcastq", "attention_bwd_h64_bcastq"} <= names
        super().test_broadcast_query_equals_tiled_query()

    def test_varlen_gradients_against_reference(self):
        """varlen_attention's kernel route (packed forward kernel, packed backward kernel) against the
        reference: gradients >= 35 dB."""
        rng = fresh_rng()
        lens = np.asarray([200, 77, 300], np.int32)
        cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
        total = int(lens.sum())
        q, k, v, ct = (jnp.asarray(rng.standard_normal((total, 2, 128)), jnp.bfloat16) for _ in range(4))

        def grads(implementation):
            f = lambda q, k, v: mx.varlen_attention(
                q, k, v, cu, cu, max_seqlen_q=300, max_seqlen_k=300, is_causal=True, implementation=implementation
            )
            _, vjp = jax.vjp(f, q, k, v)
            return vjp(ct)

        with impl.record() as decisions:
            g_k = grads("cuda")
        self.check_backward_path(decisions)
        for name, a, w in zip("qkv", g_k, grads("xla"), strict=True):
            assert sqnr_db(np.asarray(w, np.float64), np.asarray(a, np.float64)) >= 35.0, name
