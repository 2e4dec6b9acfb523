"""Both orientations of a GEMM output handed to the next GEMM (ops/mx_dot_quantized.py: orientations,
WgradOperand, mx_dot_general_handoff; flax/functional.py's MLP). CPU, the emulated kernel path.

(1) y_w of orientations ("row", "col") equals the independent oracle of the column orientation of
gelu(the float32 GEMM result + bias) (tests/gemm/test_mx_gemm_epilogue_col.py col_oracle), on the kernel path
and on the two-pass reference; "wgrad" is NaN undifferentiated and the "col" value under jax.vjp.
(2) The up -> GELU -> down gradients: every gradient but dW_down equals the old path's (row-only epilogue,
mx_dot_general re-quantizing h for its wgrad) bit for bit; dW_down equals the old path's with the down
GEMM's lhs replaced by the float32 gelu(p) (the value the epilogue quantizes; the old path quantized
bf16 h = gelu(bf16(p)) in bf16), bit for bit: the only numerical change is that operand.
(3) Dataflow: tracing the gradient records no gemm_operands pass over the (M, hidden) activation on the
new path and exactly one on the old path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.formats import MXArray
from jax_mxfp8.ops.mx_dot_general import mx_dot_general
from jax_mxfp8.ops.mx_dot_quantized import WgradOperand, mx_dot_general_handoff, mx_dot_general_quantized
from tests.ffi_calls_testutil import ffi_calls
from tests.gemm.gemm_align_oracle import align128_col_oracle
from tests.seeding_testutil import test_seed

DN = (((2,), (0,)), ((), ()))
B, T, D, F = 2, 64, 64, 96  # M = 128 rows (one run), hidden F = 96 (N not a tile multiple)


@pytest.fixture(scope="module")
def params():
    k = jax.random.split(jax.random.key(test_seed()), 6)
    x = jax.random.normal(k[0], (B, T, D), jnp.float32).astype(jnp.bfloat16)
    w1 = jax.random.normal(k[1], (D, F), jnp.float32) / 8
    b1 = jax.random.normal(k[2], (F,), jnp.float32)
    w2 = jax.random.normal(k[3], (F, D), jnp.float32) / 8
    b2 = jax.random.normal(k[4], (D,), jnp.float32)
    ct = jax.random.normal(k[5], (B, T, D), jnp.float32).astype(jnp.bfloat16)
    return x, w1, b1, w2, b2, ct


def _z32(x, w1, b1, activation="gelu", implementation="emulated"):
    """act(the float32 GEMM result + bias): the value the epilogue quantizes (on the kernel path)."""
    p = mx_dot_general(x, w1, DN, preferred_element_type=jnp.float32, bias=b1, implementation=implementation)
    return jax.nn.gelu(p) if activation else p


@pytest.mark.parametrize("implementation", [None, "xla"])
def test_col_orientation_of_a_partial_token_block(params, implementation):
    """M = 100 tokens (a packed jagged batch; not a multiple of 32, so the two-pass path): y_w is the column
    orientation of gelu(p) with the last 32-row block partial, i.e. the oracle's over p padded with zero
    rows (gelu(0) = 0; no bias) to Mp = 128. CI's failure of 2026-12-02: this raised ValueError."""
    x, w1, *_ = params
    x = x.reshape(B * T, D)[:100]
    dn = (((1,), (0,)), ((), ()))
    f = jax.jit(lambda a, b: mx_dot_general_quantized(a, b, dn, activation="gelu", orientations=("row", "col"),
                                                       preferred_element_type=jnp.bfloat16,
                                                       implementation=implementation))  # fmt: skip
    _, _, w = f(x, w1)
    p = jax.jit(lambda a, b: mx_dot_general(a, b, dn, preferred_element_type=jnp.float32, implementation="xla"))(x, w1)
    z = np.zeros((1, 128, F), np.float32)
    z[0, :100] = np.asarray(jax.nn.gelu(p))
    codes, scale, finite = align128_col_oracle(z)
    assert finite.all() and w.data.shape == (1, F, 128)
    np.testing.assert_array_equal(np.asarray(w.scale), scale)
    np.testing.assert_array_equal(np.asarray(w.data).view(np.uint8), codes)


def test_float32_output_col_runs_the_producer_kernel(params, monkeypatch):
    """A float32 output (the epilogue kernel writes bf16 only) takes the two-pass path; its column
    orientation is the gemm_operands producer kernel's single-orientation pass over (1, M, F), not the XLA
    reference (the LM with float32 activations spent an ALU-bound XLA fusion per MLP there), with the
    oracle's bits. Every kernel decision forced to "emulated" (_ffi_calls)."""
    x, w1, b1, *_ = params

    def fn(a, b):
        return mx_dot_general_quantized(a, b, DN, activation="gelu", bias=b1, orientations=("row", "col"),
                                        preferred_element_type=jnp.float32)  # fmt: skip

    calls = ffi_calls(monkeypatch, fn, x, w1)
    assert ("jax_mxfp8_gemm_operands", (1, B * T, F)) in calls, calls
    assert not any(t.startswith("jax_mxfp8_mx_gemm_mx") for t, _ in calls), calls  # not the epilogue kernel
    _, _, w = jax.jit(fn)(x, w1)
    codes, scale, finite = align128_col_oracle(np.asarray(jax.jit(_z32)(x, w1, b1)).reshape(1, B * T, F))
    assert finite.all()
    np.testing.assert_array_equal(np.asarray(w.scale), scale)
    np.testing.assert_array_equal(np.asarray(w.data).view(np.uint8), codes)


@pytest.mark.slow  # ~30 s on the loaded 2-core machine (two compiles of a vjp)
def test_wgrad_orientation_nan_unless_differentiated(params):
    x, w1, b1, *_ = params

    def f(o):
        return lambda a, b: mx_dot_general_quantized(a, b, DN, activation="gelu", bias=b1, orientations=("row", o),
                                                     preferred_element_type=jnp.bfloat16,
                                                     implementation="emulated")  # fmt: skip

    _, _, w = jax.jit(f("wgrad"))(x, w1)
    assert np.isnan(np.asarray(w.scale)).all()
    (_, _, w_vjp), _ = jax.jit(lambda a, b: jax.vjp(f("wgrad"), a, b))(x, w1)
    _, _, w_col = jax.jit(f("col"))(x, w1)
    np.testing.assert_array_equal(np.asarray(w_vjp.data).view(np.uint8), np.asarray(w_col.data).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(w_vjp.scale), np.asarray(w_col.scale))


def _mlp_loss(new: bool, replace_lhs: bool = False, activation="gelu", implementation="emulated"):
    kw = dict(preferred_element_type=jnp.bfloat16, implementation=implementation)

    def loss(x, w1, b1, w2, b2, ct):
        o = ("row", "wgrad") if new else ("row",)
        h, h_q, *w = mx_dot_general_quantized(x, w1, DN, activation=activation, bias=b1, orientations=o, **kw)
        if new:
            out = mx_dot_general_handoff(h, w2, DN, lhs_quantized=h_q, lhs_wgrad=w[0], bias=b2, **kw)
        else:
            lhs = jax.lax.stop_gradient(_z32(x, w1, b1, activation, implementation)) if replace_lhs else h
            out = mx_dot_general(lhs, w2, DN, lhs_quantized=h_q, bias=b2, **kw)
        return jnp.sum(out.astype(jnp.float32) * ct.astype(jnp.float32))

    return loss


@pytest.mark.slow  # ~80 s on the loaded 2-core machine (three gradient compiles)
def test_mlp_grads_equal_old_path_but_the_wgrad_operand(params):
    grad = lambda new, rep=False: jax.jit(jax.grad(_mlp_loss(new, rep), argnums=(0, 1, 2, 3, 4)))(*params)  # noqa: E731
    new, old, old_z32 = grad(True), grad(False), grad(False, True)
    names = ("dx", "dw1", "db1", "dw2", "db2")
    for name, a, b in zip(names, new, old, strict=True):
        if name != "dw2":
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    np.testing.assert_array_equal(np.asarray(new[3]), np.asarray(old_z32[3]), err_msg="dw2 vs float32 lhs")
    assert not np.array_equal(np.asarray(new[3]), np.asarray(old[3]))  # bf16 gelu(bf16 p) differs somewhere
    np.testing.assert_allclose(np.asarray(new[3]), np.asarray(old[3]), rtol=0.1, atol=0.05 * np.abs(old[3]).max())


@pytest.mark.parametrize("new", [True, False])
def test_mlp_backward_skips_the_activation_quantize_pass(params, monkeypatch, new):
    calls = ffi_calls(monkeypatch, jax.grad(_mlp_loss(new), argnums=(1, 3)), *params)
    # the activation's own pass is a single-orientation ("col") producer call; the up GEMM's incoming
    # gradient (also (1, M, F)) gets a "both" call on either path
    on_h = [c for c in calls if c == ("jax_mxfp8_gemm_operands", (1, B * T, F))]
    assert len(on_h) == (0 if new else 1), (new, calls)
    assert calls.count(("jax_mxfp8_gemm_operands_both", (1, B * T, F))) == 1, calls
    up = [t for t, _ in calls if t.startswith("jax_mxfp8_mx_gemm_mx")]
    assert up == (["jax_mxfp8_mx_gemm_mx_bias_pre_col"] if new else ["jax_mxfp8_mx_gemm_mx_bias_pre"]), calls


@pytest.mark.slow  # ~40 s on the loaded 2-core machine (two gradient compiles)
def test_mlp_grads_under_remat_equal(params):
    """jax.checkpoint recomputes the forward in the backward: the down GEMM's wgrad must still get the real
    column orientation (the custom VJP's forward rule), not the primal's NaN placeholder."""
    grad = lambda f: jax.jit(jax.grad(f, argnums=(1, 3)))(*params)  # noqa: E731
    plain, remat = grad(_mlp_loss(True)), grad(jax.checkpoint(_mlp_loss(True)))
    for a, b in zip(plain, remat, strict=True):
        assert np.isfinite(np.asarray(b)).all()
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.gpu
def test_kernel_mlp_grads_equal_old_path_but_the_wgrad_operand(params):
    """The kernels (no activation: the epilogue's column bits are then exactly those of gemm_operands over
    the plain kernel's float32 output): as the emulated test above, bit for bit."""
    from jax_mxfp8.primitives import library

    ok, why = library.kernels_runnable(("sm_90a",))
    if not ok:
        pytest.skip(why)
    kw = dict(activation="", implementation="cuda")
    grad = lambda new, rep=False: jax.jit(jax.grad(_mlp_loss(new, rep, **kw), argnums=(0, 1, 2, 3, 4)))(*params)  # noqa: E731
    new, old, old_z32 = grad(True), grad(False), grad(False, True)
    for name, a, b in zip(("dx", "dw1", "db1", "dw2", "db2"), new, old, strict=True):
        if name != "dw2":
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    np.testing.assert_array_equal(np.asarray(new[3]), np.asarray(old_z32[3]), err_msg="dw2 vs float32 lhs")


@pytest.mark.gpu
def test_kernel_float32_output_col_on_the_producer_kernel(params):
    """The float32-output two-pass path on the GPU (the LM's float32 activations): the column orientation
    comes from the gemm_operands producer kernel (recorded decision "cuda"), with the oracle's bits over
    the float32 output y = gelu(the kernel GEMM's float32 result + bias). Not yet run on a GPU."""
    from jax_mxfp8.primitives import implementation as impl
    from jax_mxfp8.primitives import library

    ok, why = library.kernels_runnable(("sm_90a",))
    if not ok:
        pytest.skip(why)
    x, w1, b1, *_ = params

    def fn(a, b):
        return mx_dot_general_quantized(a, b, DN, activation="gelu", bias=b1, orientations=("row", "col"),
                                        preferred_element_type=jnp.float32)  # fmt: skip

    with impl.record() as decisions:
        y, _, w = jax.jit(fn)(x, w1)  # y: float32 gelu(p), the value the column orientation quantizes
    assert ("mx_dot_general_quantized", "cuda") in [(d.op, d.path) for d in decisions], decisions
    codes, scale, finite = align128_col_oracle(np.asarray(y).reshape(1, B * T, F))
    assert finite.all()
    np.testing.assert_array_equal(np.asarray(w.scale), scale)
    np.testing.assert_array_equal(np.asarray(w.data).view(np.uint8), codes)


def test_bad_arguments_raise(params):
    x, w1, _, w2, *_ = params
    with pytest.raises(ValueError, match="orientations"):
        mx_dot_general_quantized(x, w1, DN, orientations=("col",), implementation="emulated")
    h = jnp.zeros((B, T, F), jnp.bfloat16)
    h_q = MXArray(jnp.zeros((B, T, F), jnp.float8_e4m3fn), jnp.zeros((B, T, F // 32), jnp.uint8), (-1,), "row")
    wrong = WgradOperand(jnp.zeros((1, F, 64), jnp.float8_e4m3fn), jnp.zeros((1, 1, F), jnp.float32))
    with pytest.raises(ValueError, match="lhs_wgrad is"):
        mx_dot_general_handoff(h, w2, DN, lhs_quantized=h_q, lhs_wgrad=wrong, implementation="emulated")
    with pytest.raises(ValueError, match="lhs_quantized has shape"):
        mx_dot_general_handoff(h[:1], w2, DN, lhs_quantized=h_q, lhs_wgrad=wrong, implementation="emulated")
