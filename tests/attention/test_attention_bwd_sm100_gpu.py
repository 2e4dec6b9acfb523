"""The Blackwell attention backward on a Blackwell GPU (compute capability 10.0 / 10.3): marked gpu and blackwell,
skipped on anything else. NONE OF THESE HAS RUN YET: no machine of this project has such a GPU; they are written
for the first run on a B200 / GB300 (pytest -m blackwell -s prints the self-test report).

  self-test   the family's first-use self-test passes (primitives/attention_bwd_sm100_self_test.py)
  emulation   every registered production variant (float32 dK / dV) against its emulation on the same operands:
              the pre-pass's dO operand bit for bit and Delta within float32 summation order; dq, dk, dv within
              40 dB SQNR (the kernel's exp2 and accumulation order are not XLA's); deterministic variants twice,
              bit for bit
  mx dK / dV  the dkv "mx" variants' MXGradient parts, dequantized, within 30 dB of the emulation's
  written     every element of the NaN-poisoned _into result buffers (dk, dv; the pre-pass's outputs) is written
  dispatch    jax.grad of dot_product_attention takes the sm100 backward and is within 0.5 dB of the reference's
              SQNR against float64 gradients
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.primitives import attention_bwd_sm100 as bwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library, self_test
from jax_mxfp8.primitives.attention_sm100_operands import quantize_square, sm100_operand
from tests.attention.attention_oracle import exact_attention

pytestmark = [pytest.mark.gpu, pytest.mark.blackwell]

B, T, S, N, K = 2, 384, 512, 4, 2
LENS = np.array([[300, 384], [512, 400]], np.int32)


@pytest.fixture(scope="module", autouse=True)
def _blackwell():
    ok, why = library.kernels_runnable(registry.AttentionBwdSm100Config.archs)
    if not ok:
        pytest.skip(why)


def _problem(h: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q, do, o = (rng.standard_normal((B, T, N, h)).astype(np.float32) for _ in range(3))
    k, v = (rng.standard_normal((B, S, K, h)).astype(np.float32) for _ in range(2))
    lse = (np.log(S) + rng.standard_normal((B, N, T))).astype(np.float32)
    return q, k, v, do, o, lse


def _run(variant, ops, path, out=None):
    q, k, v, do, o, lse = (jnp.asarray(x) for x in ops)
    lens = jnp.asarray(LENS)
    qo, ko, vo = sm100_operand(quantize_square(q)), sm100_operand(quantize_square(k)), sm100_operand(quantize_square(v))
    dlse = jnp.zeros(lse.shape, jnp.float32)
    do_op, delta = bwd.bwd_prepass_sm100(do.astype(jnp.bfloat16), o.astype(jnp.bfloat16), dlse, lens, path=path)
    grads = bwd.attention_bwd_sm100(
        qo, ko, vo, do_op, lse, delta, lens, variant=variant, scale=variant.head_dim**-0.5, path=path, out=out
    )
    return do_op, delta, tuple(np.asarray(g) for g in grads)


def _on_cpu(fn, *args):
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        return fn(*args)


def test_self_test_passes():
    assert self_test.verdict(bwd.FAMILY) is None, self_test.report_text(self_test.cached_reports())
    print(self_test.report_text(self_test.cached_reports()))


VARIANTS = [v for v in registry.ATTENTION_BWD_SM100_VARIANTS if v.tune == 0 and not v.packed and v.dkv == "float32"]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_variant_matches_its_emulation(variant):
    ops = _problem(variant.head_dim)
    do_op, delta, got = _run(variant, ops, "cuda")
    want_do, want_delta, want = _on_cpu(_run, variant, ops, "emulated")
    np.testing.assert_array_equal(np.asarray(do_op.data).view(np.uint8), np.asarray(want_do.data).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(do_op.sf_hd), np.asarray(want_do.sf_hd))
    np.testing.assert_array_equal(np.asarray(do_op.sf_seq), np.asarray(want_do.sf_seq))
    np.testing.assert_allclose(np.asarray(delta), np.asarray(want_delta), rtol=1e-5, atol=1e-5)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert sqnr_db(g, w) >= 40.0, (name, sqnr_db(g, w))
    if variant.deterministic:
        _, _, again = _run(variant, ops, "cuda")
        for g, a in zip(got, again, strict=True):
            np.testing.assert_array_equal(g, a)


MX_VARIANTS = [v for v in registry.ATTENTION_BWD_SM100_VARIANTS if v.tune == 0 and v.dkv == "mx"]


@pytest.mark.parametrize("variant", MX_VARIANTS, ids=lambda v: v.name)
def test_mx_dkv_variant_matches_its_emulation(variant):
    """dK, dV written by the epilogue as MXGradient parts: dequantized within 30 dB of the emulation's (an FP8 step
    apart where the two float32 accumulators round a value across it)."""
    from jax_mxfp8.formats.quantize import dequantize

    ops = _problem(variant.head_dim, seed=3)
    _, _, got = _run_mx(variant, ops, "cuda")
    _, _, want = _on_cpu(_run_mx, variant, ops, "emulated")
    for g, w in zip(got, want, strict=True):
        assert sqnr_db(np.asarray(dequantize(g)), np.asarray(dequantize(w))) >= 30.0


def _run_mx(variant, ops, path):
    q, k, v, do, o, lse = (jnp.asarray(x) for x in ops)
    lens = jnp.asarray(LENS)
    qo, ko, vo = sm100_operand(quantize_square(q)), sm100_operand(quantize_square(k)), sm100_operand(quantize_square(v))
    do_op, delta = bwd.bwd_prepass_sm100(
        do.astype(jnp.bfloat16), o.astype(jnp.bfloat16), jnp.zeros_like(lse), lens, path=path
    )
    dq, (dk_row, dk_col), (dv_row, dv_col) = bwd.attention_bwd_sm100(
        qo, ko, vo, do_op, lse, delta, lens, variant=variant, scale=variant.head_dim**-0.5, path=path
    )
    return do_op, delta, (dk_row, dk_col, dv_row, dv_col)


def test_every_result_element_is_written():
    variant = bwd.find_variant(head_dim=128, causal=True)
    ops = _problem(128, seed=1)
    shape = (B, S, K, 128)
    poisoned = (
        jnp.full((B, T, N, 128), jnp.nan, jnp.float32),  # dq: zero-filled by the handler, then accumulated
        jnp.full(shape, jnp.nan, jnp.float32),
        jnp.full(shape, jnp.nan, jnp.float32),
    )
    _, _, got = _run(variant, ops, "cuda", out=poisoned)
    for name, g in zip(("dq", "dk", "dv"), got, strict=True):
        assert np.all(np.isfinite(g)), name


def test_grad_takes_the_sm100_backward_within_the_reference_sqnr():
    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.standard_normal((B, T, N, 128)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, S, K, 128)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, S, K, 128)), jnp.float32)
    do = jnp.asarray(rng.standard_normal((B, T, N, 128)), jnp.float32)

    def grads(**kw):
        _, vjp = jax.vjp(lambda q, k, v: mx.dot_product_attention(q, k, v, is_causal=True, **kw), q, k, v)
        return [np.asarray(g) for g in vjp(do)]

    with impl.record() as decisions:
        got = grads()
    assert any(d.op == "dot_product_attention_bwd" and d.path == "cuda" for d in decisions), decisions
    ref = grads(implementation="xla")
    _, _, *exact = exact_attention(q, k, v, do, causal=True)
    for name, g, r, x in zip(("dq", "dk", "dv"), got, ref, exact, strict=True):
        assert abs(sqnr_db(g, x) - sqnr_db(r, x)) <= 0.5, name
