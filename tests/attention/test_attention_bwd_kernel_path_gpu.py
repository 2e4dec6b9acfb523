"""GPU: the backward kernel inside dot_product_attention's and varlen_attention's custom_vjp (the kernel path).

implementation="cuda" runs the forward kernel, the pre-pass and the backward kernel (ops/attention_bwd_kernel.py);
its gradients are compared with implementation="xla" (the reference, its own forward) under a random output
cotangent and a random dLSE: SQNR >= 35 dB (the kernel-vs-reference gate). The kernel itself against the
reference on the same operands is tests/attention/test_attention_bwd_kernel_gpu.py; the CPU twin of this file
(the emulated call) is tests/attention/test_attention_bwd_kernel_path_cpu.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.primitives import implementation as impl
from tests.attention.attention_testutil import fresh_rng

pytestmark = pytest.mark.gpu

CASES = [
    dict(b=2, t=384, s=256, n=4, n_kv=2, h=128, causal=True, lengths=True),
    dict(b=1, t=256, s=416, n=2, n_kv=1, h=64, causal=False, lengths=False),
]


def _inputs(case, rng):
    b, t, s, n, n_kv, h = (case[k] for k in ("b", "t", "s", "n", "n_kv", "h"))
    arr = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    q, k, v, do = arr(b, t, n, h), arr(b, s, n_kv, h), arr(b, s, n_kv, h), arr(b, t, n, h)
    dlse = jnp.asarray(rng.standard_normal((b, n, t)), jnp.float32)
    q_len = kv_len = None
    if case["lengths"]:
        q_len = jnp.asarray([t - 37, t // 2], jnp.int32)
        kv_len = jnp.asarray([s - 5, s // 3], jnp.int32)
    return q, k, v, do, dlse, q_len, kv_len


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_op_gradients_on_the_backward_kernel(case):
    q, k, v, do, dlse, q_len, kv_len = _inputs(case, fresh_rng())

    def grads(implementation):
        def f(q, k, v):
            return mx.dot_product_attention(
                q, k, v, is_causal=case["causal"], query_seq_lengths=q_len, key_value_seq_lengths=kv_len,
                implementation=implementation, return_residual="lse",
            )  # fmt: skip

        _, vjp = jax.vjp(f, q, k, v)
        return jax.jit(vjp)((do, dlse))

    with impl.record() as decisions:
        g_k = grads("cuda")
    paths = {d.path for d in decisions if d.op == kbwd.OP}
    if paths != {"cuda"}:
        pytest.skip(f"the backward kernel does not run here: {[d.reason for d in decisions if d.op == kbwd.OP]}")
    g_r = grads("xla")
    for name, a, w in zip("qkv", g_k, g_r, strict=True):
        a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
        assert np.isfinite(a).all(), name
        assert sqnr_db(w, a) >= 35.0, (name, sqnr_db(w, a))


def test_varlen_gradients_on_the_backward_kernel():
    """varlen_attention's kernel route: packed forward kernel, backward kernel on the padded batch."""
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
    if {d.path for d in decisions if d.op == kbwd.OP} != {"cuda"}:
        pytest.skip("the backward kernel does not run here")
    for name, a, w in zip("qkv", g_k, grads("xla"), strict=True):
        assert sqnr_db(np.asarray(w, np.float64), np.asarray(a, np.float64)) >= 35.0, name
