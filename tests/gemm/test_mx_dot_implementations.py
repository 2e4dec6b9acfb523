"""One set of MX GEMM cases run over every implementation (the tokamax habit: a shared test base).

`MxDotImplementationCases` holds the cases of mx_dot_general, mx_dot_general_quantized and the hand-off's
column orientation; each subclass names one `implementation`:
  "xla"       the reference (the contract's numerics);
  "emulated"  the kernel path (producer pass -> aligned operands -> MX GEMM, quantize epilogue) with every
              FFI call emulated in XLA (runs on CPU in CI);
  "cuda"      the Hopper kernels (marked gpu: the GPU machine only).
Every check compares against something the implementation under test did not produce: the unquantized
product in float32 at HIGHEST precision, the "xla" reference (kernel paths), the same composition built from
mx_dot_general on the same path, or the independent NumPy oracle of the column orientation.

The kernel path's numerics differ from the contract's only where aligning 4 blocks to one exponent (align128)
pushes an element of a smaller block into E4M3 subnormals: on N(0,1), log-normal rows and outlier channels
its SQNR against the reference must be >= 40 dB for all three GEMMs, and its SQNR against the unquantized
product within 0.5 dB of the reference's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops.mx_dot_general import mx_dot_general
from jax_mxfp8.ops.mx_dot_quantized import ARCHS, WgradOperand, mx_dot_general_quantized
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library
from tests.gemm.gemm_align_oracle import align128_col_oracle, dequant_aligned
from tests.gemm.mx_gemm_testutil import gelu_epilogue_slack, study_operand
from tests.quantize import mx_oracle
from tests.seeding_testutil import test_rng, test_seed

DENSE = (((2,), (0,)), ((), ()))  # (B, T, D) x (D, F)
LAYOUTS = {
    "rhs_k_last": ((96, 128), (160, 128), (((1,), (1,)), ((), ()))),  # rhs (F, D): k last on both sides
    "lhs_k_first": ((128, 96), (128, 64), (((0,), (0,)), ((), ()))),  # lhs (D, M): k first on the lhs
    "batched": ((3, 64, 128), (3, 128, 96), (((2,), (1,)), ((0,), (0,)))),  # batched matmul
    "batch_middle": ((64, 3, 128), (3, 128, 96), (((2,), (1,)), ((1,), (0,)))),  # batch axis in the middle
    "two_contract_axes": ((2, 32, 4, 64), (4, 64, 96), (((2, 3), (0, 1)), ((), ()))),  # K = 256
}
# SQNR of the reference (MX numerics) against the unquantized product, far below what it measures on these
# data (N(0,1): ~30 dB; log-normal rows and outlier channels lower): a floor that a wrong operand, scale or
# orientation misses by tens of dB
UNQUANTIZED_FLOOR_DB = 15.0


@functools.cache
def _vjp_fn(dn, implementation: str):
    def f(x, w, ct):
        y, vjp = jax.vjp(lambda a, b: mx_dot_general(a, b, dn, implementation=implementation), x, w)
        return (y,) + vjp(ct)

    return jax.jit(f)


def _unquantized_grads(x, w, ct, dn):
    """(y, dx, dw) of the unquantized product in float32 at HIGHEST precision (~140 dB: exact next to MX's ~30)."""
    x, w, ct = (jnp.asarray(v, jnp.float32) for v in (x, w, ct))
    f = lambda a, b: jax.lax.dot_general(a, b, dn, precision=jax.lax.Precision.HIGHEST)  # noqa: E731
    y, vjp = jax.vjp(f, x, w)
    return tuple(np.asarray(v, np.float64) for v in (y,) + vjp(ct))


def _same(a, b, what):
    a, b = np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b))
    assert a.dtype == b.dtype, what
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=what)


# mx_dot_general_quantized: the op against the same composition from mx_dot_general on the same path
QDN = (((2,), (0,)), ((), ()))


def _composed(x, w, b, activation, implementation):
    p = mx_dot_general(x, w, QDN, preferred_element_type=jnp.float32, bias=b, implementation=implementation)
    act = (lambda v: jax.nn.gelu(v)) if activation else (lambda v: v)
    q = jax_mxfp8.quantize(act(jax.lax.stop_gradient(p)), axis=-1)
    return act(p.astype(jnp.bfloat16)), q


def _loss_and_grads(f, x, w, b, ct):
    def loss(x, w, b):
        y, q = f(x, w, b)
        return jnp.sum(y.astype(jnp.float32) * ct.astype(jnp.float32)), q

    (v, q), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(x, w, b)
    return v, q, grads


# --------------------------------------------------------------------------------------- the shared base
class MxDotImplementationCases:
    """The cases; subclasses set IMPLEMENTATION and the sizes of the study's operands."""

    IMPLEMENTATION: str = "xla"
    HARDWARE_TANH: bool = False  # the GELU epilogue's tanh is tanh.approx.f32 (kernel paths), not XLA's
    STUDY_SHAPES = ((2, 64, 256), (160, 256))  # x (B, T, D), w^T (F, D): small on the CPU (compile time)

    def _compare(self, x, w, ct, dn, *, min_db=40.0):
        """(y, dx, dw) of this implementation: finite, against the unquantized product and (kernel paths)
        against the reference: >= min_db, and within 0.5 dB of the reference's SQNR against the former."""
        got = _vjp_fn(dn, self.IMPLEMENTATION)(x, w, ct)
        exact = _unquantized_grads(x, w, ct, dn)
        ref = _vjp_fn(dn, "xla")(x, w, ct) if self.IMPLEMENTATION != "xla" else got
        report = {}
        for name, k, r, e in zip(("fwd", "dgrad", "wgrad"), got, ref, exact, strict=True):
            assert k.shape == r.shape == e.shape and k.dtype == r.dtype, name
            assert np.all(np.isfinite(np.asarray(k, np.float32))), name
            vs_ref, k_exact, r_exact = sqnr_db(r, k), sqnr_db(e, k), sqnr_db(e, r)
            report[name] = (vs_ref, k_exact, r_exact)
            assert r_exact >= UNQUANTIZED_FLOOR_DB, (name, report)
            if self.IMPLEMENTATION != "xla":
                assert vs_ref >= min_db, (name, report)
                assert k_exact >= r_exact - 0.5, (name, report)
        return got, report

    @pytest.mark.parametrize("kind", ["normal", "lognormal", "outlier"])
    def test_forward_and_gradients_against_unquantized_and_reference(self, kind):
        rng = test_rng()
        (b, t, d), (f, _) = self.STUDY_SHAPES
        x = study_operand(kind, (b, t, d), rng)
        w = np.ascontiguousarray(study_operand(kind, (f, d), rng).T)  # (D, F); outliers along D (contracted)
        ct = rng.standard_normal((b, t, f)).astype(np.float32)
        _, report = self._compare(x, w, ct, DENSE)
        print(self.IMPLEMENTATION, kind, {k: tuple(round(v, 1) for v in vals) for k, vals in report.items()})

    @pytest.mark.parametrize("layout", sorted(LAYOUTS))
    def test_layouts(self, layout):
        """Every dot_general layout reduces to the kernel's (G, X, K) operands and back."""
        x_shape, w_shape, dn = LAYOUTS[layout]
        rng = test_rng()
        x, w = study_operand("normal", x_shape, rng), study_operand("normal", w_shape, rng)
        y_shape = jax.eval_shape(lambda a, b: jax.lax.dot_general(a, b, dn), x, w).shape
        ct = rng.standard_normal(y_shape).astype(np.float32)
        self._compare(x, w, ct, dn)

    def test_bfloat16_and_weight_grad_bf16(self):
        rng = test_rng()
        x = jnp.asarray(study_operand("normal", (128, 256), rng), jnp.bfloat16)
        w = jnp.asarray(study_operand("normal", (256, 96), rng), jnp.bfloat16)
        ct = jnp.asarray(rng.standard_normal((128, 96)), jnp.bfloat16)
        dn = (((1,), (0,)), ((), ()))
        self._compare(x, w, ct, dn, min_db=35.0)  # bf16 outputs: ~45 dB of rounding on both sides

        def grads(implementation):
            f = lambda a, b: mx_dot_general(a, b, dn, implementation=implementation, weight_grad="bf16")  # noqa: E731
            return jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * ct), argnums=(0, 1)))(x, w)

        (dx_k, dw_k), (dx_r, dw_r) = grads(self.IMPLEMENTATION), grads("xla")
        assert sqnr_db(dx_r, dx_k) >= 35 and sqnr_db(dw_r, dw_k) >= 35

    def test_nan_propagates_to_its_row_and_column(self):
        rng = test_rng()
        x, w = study_operand("normal", (64, 128), rng), study_operand("normal", (128, 64), rng)
        x[3, 17] = np.nan
        w[40, 5] = np.nan
        dot = jax.jit(lambda a, b: mx_dot_general(a, b, (((1,), (0,)), ((), ())), implementation=self.IMPLEMENTATION))
        y = np.asarray(dot(x, w))  # one program (eager dispatch compiles many small ones)
        assert np.all(np.isnan(y[3])) and np.all(np.isnan(y[:, 5]))
        finite = np.ones(y.shape, bool)
        finite[3], finite[:, 5] = False, False
        assert np.all(np.isfinite(y[finite]))

    def test_bias_is_added_before_the_one_rounding_and_gets_its_gradient(self):
        rng = test_rng()
        x = jnp.asarray(study_operand("normal", (2, 32, 128), rng), jnp.bfloat16)
        w = jnp.asarray(study_operand("normal", (128, 64), rng))
        b = jnp.asarray(rng.standard_normal(64), jnp.float32)
        ct = jnp.asarray(rng.standard_normal((2, 32, 64)), jnp.bfloat16)

        def run(bias):
            def f(x, w, b):
                kw = dict(preferred_element_type=jnp.bfloat16, implementation=self.IMPLEMENTATION)
                if bias:
                    return mx_dot_general(x, w, DENSE, bias=b, **kw)
                y = mx_dot_general(x, w, DENSE, **kw | dict(preferred_element_type=jnp.float32))
                return (y + b).astype(jnp.bfloat16)

            y, vjp = jax.vjp(f, x, w, b)
            return (y,) + vjp(ct)

        fused, unfused = jax.jit(lambda: run(True))(), jax.jit(lambda: run(False))()
        for name, a, u in zip(("y", "dx", "dw", "db"), fused, unfused, strict=True):
            assert a.dtype == u.dtype and a.shape == u.shape, name
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(u, np.float32), err_msg=name)
        with pytest.raises(ValueError, match="bias"):
            mx_dot_general(x, w, DENSE, bias=jnp.ones((63,)), implementation=self.IMPLEMENTATION)

    @pytest.mark.parametrize("activation", ["gelu", None])
    def test_quantized_matches_composition(self, quantized_gemm_data, activation):
        """mx_dot_general_quantized: y, y_q and the loss bit for bit those of the composition on the same path
        (the quantize-epilogue GEMM on the kernel path); so are the gradients without an activation. With GELU
        the backward GEMMs see XLA's GELU derivative in bfloat16, which XLA may keep in excess precision
        inside the composition's fusions (not across the custom_vjp boundary): the gradients then differ where
        a cotangent element rounds to the other FP8 neighbour, at most a few FP8 steps of one cotangent
        element per output (2^-3 relative), far below a wrong derivative (order 1)."""
        x, w, b, ct = quantized_gemm_data

        def op(x, w, b):
            kw = dict(preferred_element_type=jnp.bfloat16, implementation=self.IMPLEMENTATION)
            return mx_dot_general_quantized(x, w, QDN, activation=activation, bias=b, **kw)

        with impl.record() as decisions:
            v1, q1, g1 = _loss_and_grads(op, x, w, b, ct)
        if self.IMPLEMENTATION != "xla":
            assert decisions[0].op == "mx_dot_general_quantized" and decisions[0].path == self.IMPLEMENTATION
        composed = lambda x, w, b: _composed(x, w, b, activation, self.IMPLEMENTATION)  # noqa: E731
        v2, q2, g2 = _loss_and_grads(composed, x, w, b, ct)
        assert q1.shape == (2, 48, 96) and q1.scale.shape == (2, 48, 3) and q1.axes == (-1,)
        _same(q1.data, q2.data, "y_q data")
        _same(q1.scale, q2.scale, "y_q scale")
        _same(v1, v2, "loss")
        for name, a, c in zip(("dx", "dw", "db"), g1, g2, strict=True):
            if activation is None:
                _same(a, c, name)
            else:
                a, c = np.asarray(a, np.float64), np.asarray(c, np.float64)
                rel = np.linalg.norm(a - c) / np.linalg.norm(c)
                assert rel < 2e-2, f"{name}: relative difference {rel:.3g}"

    def test_col_orientation_equals_oracle(self):
        """y_w of orientations ("row", "col") equals the independent oracle of the column orientation of
        gelu(the float32 GEMM result + bias) (ops/mx_dot_quantized.py: WgradOperand)."""
        bt, d, f = (2, 64), 64, 96  # M = 128 rows (one run), hidden F = 96 (N not a tile multiple)
        k = jax.random.split(jax.random.key(test_seed()), 3)
        x = jax.random.normal(k[0], (*bt, d), jnp.float32).astype(jnp.bfloat16)
        w1 = jax.random.normal(k[1], (d, f), jnp.float32) / 8
        b1 = jax.random.normal(k[2], (f,), jnp.float32)
        kw = dict(preferred_element_type=jnp.bfloat16, implementation=self.IMPLEMENTATION)
        run = jax.jit(lambda x, w: mx_dot_general_quantized(x, w, DENSE, activation="gelu", bias=b1,
                                                            orientations=("row", "col"), **kw))  # fmt: skip
        _, _, wg = run(x, w1)
        assert isinstance(wg, WgradOperand)
        # the value the epilogue quantizes: gelu(the float32 GEMM result + bias), on this path
        p32 = dict(preferred_element_type=jnp.float32, bias=b1, implementation=self.IMPLEMENTATION)
        z = jax.jit(lambda x, w: jax.nn.gelu(mx_dot_general(x, w, DENSE, **p32)))
        codes, scale, finite = align128_col_oracle(np.asarray(z(x, w1)).reshape(1, bt[0] * bt[1], f))
        assert finite.all()
        got_codes, got_scale = np.asarray(wg.data).view(np.uint8), np.asarray(wg.scale)
        if not self.HARDWARE_TANH:
            np.testing.assert_array_equal(got_scale, scale)
            np.testing.assert_array_equal(got_codes, codes)
            return
        # the kernel's GELU uses tanh.approx.f32 (docs/numerics.md "Quantize epilogues"): its values lie within
        # gelu_epilogue_slack(p) of XLA's, so a code may move by one FP8 step and, rarely, a run scale by a binade
        p = jax.jit(lambda x, w: mx_dot_general(x, w, DENSE, **p32))(x, w1)
        p_col = np.swapaxes(np.asarray(p, np.float64).reshape(1, bt[0] * bt[1], f), -1, -2)  # (1, F, M): runs
        ratio = got_scale / scale
        assert np.all(np.isin(ratio, (0.5, 1.0, 2.0))) and np.mean(ratio == 1.0) >= 0.95
        fmt = mx_oracle.fmt_of(jnp.float8_e4m3fn)
        run = np.swapaxes(scale, -1, -2)  # (1, F, 1): one scale per column run of 128 rows
        got = dequant_aligned(got_codes, got_scale, fmt)
        ref = dequant_aligned(codes, scale, fmt)
        bound = 0.25 * np.maximum(np.abs(got), np.abs(ref)) + run * 2.0**-8 + 1.125 * gelu_epilogue_slack(p_col)
        assert np.all(np.abs(got - ref) <= bound)
        assert np.mean(got_codes == codes) >= 0.99


class TestXla(MxDotImplementationCases):
    IMPLEMENTATION = "xla"


class TestEmulated(MxDotImplementationCases):
    IMPLEMENTATION = "emulated"

    @pytest.mark.parametrize("activation", ["gelu", pytest.param(None, marks=pytest.mark.slow)])
    def test_quantized_matches_composition(self, quantized_gemm_data, activation):
        super().test_quantized_matches_composition(quantized_gemm_data, activation)


@pytest.mark.gpu
class TestCuda(MxDotImplementationCases):
    IMPLEMENTATION = "cuda"
    HARDWARE_TANH = True
    STUDY_SHAPES = ((4, 256, 1024), (768, 1024))

    @pytest.fixture(autouse=True)
    def _kernels(self):
        ok, why = library.kernels_runnable(("sm_90a",))
        if not ok:
            pytest.skip(why)

    @pytest.mark.parametrize("kind", ["normal", "lognormal", "outlier"])
    def test_forward_and_gradients_against_unquantized_and_reference(self, kind):
        """Also against the emulation: the kernel and its emulation sum the same products, but Hopper's FP8
        wgmma accumulates each 128-K partial with fewer than float32's bits (tests/gemm/test_mx_gemm_kernel.py
        bounds it): 69-87 dB against the reference on the H200, where a wrong operand, scale or orientation
        costs tens of dB."""
        rng = test_rng()
        (b, t, d), (f, _) = self.STUDY_SHAPES
        x = study_operand(kind, (b, t, d), rng)
        w = np.ascontiguousarray(study_operand(kind, (f, d), rng).T)
        ct = rng.standard_normal((b, t, f)).astype(np.float32)
        kern, report = self._compare(x, w, ct, DENSE)
        print(kind, {k: tuple(round(v, 1) for v in vals) for k, vals in report.items()})
        emul = _vjp_fn(DENSE, "emulated")(x, w, ct)
        for name, k, e in zip(("fwd", "dgrad", "wgrad"), kern, emul, strict=True):
            assert sqnr_db(e, k) >= 60, name

    @pytest.mark.parametrize("activation", [None, "gelu"])
    def test_quantized_matches_composition(self, quantized_gemm_data, activation):
        """The epilogue kernel's y_q is quantize(act(p)) of the plain kernel's float32 p (bits for activation
        None; GELU: hardware tanh, within one FP8 step), y, loss and gradients as the composition."""
        ok, why = library.kernels_runnable(ARCHS)
        if not ok:
            pytest.skip(why)
        x, w, b, ct = (jnp.tile(a, (1, 8, 1)) if a.ndim == 3 else a for a in quantized_gemm_data)  # M = 2 x 384

        def op(x, w, b):
            return mx_dot_general_quantized(
                x, w, QDN, activation=activation, bias=b, preferred_element_type=jnp.bfloat16, implementation="cuda"
            )

        with impl.record() as decisions:
            v1, q1, g1 = _loss_and_grads(op, x, w, b, ct)
        assert [d.path for d in decisions if d.op == "mx_dot_general_quantized"] == ["cuda"]
        v2, q2, g2 = _loss_and_grads(lambda x, w, b: _composed(x, w, b, activation, "cuda"), x, w, b, ct)
        if activation is None:
            _same(q1.data, q2.data, "y_q data")
            _same(q1.scale, q2.scale, "y_q scale")
        else:  # within one FP8 step of the block (a scale may differ by 2x where the tanh crosses a power of two)
            d1, d2 = np.asarray(q1.dequantize()), np.asarray(q2.dequantize())
            amax = np.repeat(np.abs(d2).reshape(*d2.shape[:-1], -1, 32).max(-1), 32, axis=-1)
            assert np.mean(d1 == d2) > 0.99 and np.all(np.abs(d1 - d2) <= 0.13 * np.abs(d2) + 2.0**-7 * amax)
        # XLA on the GPU may drop the composition's f32 -> bf16 -> f32 rounding of y (SimplifyFPConversions):
        # the loss agrees to bf16 rounding of each term, relative to the sum of |terms|
        y2 = _composed(x, w, b, activation, "cuda")[0]
        scale = float(jnp.sum(jnp.abs(y2.astype(jnp.float32) * ct.astype(jnp.float32))))
        assert abs(float(v1) - float(v2)) <= 2.0**-8 * scale
        for name, a, c in zip(("dx", "dw", "db"), g1, g2, strict=True):
            a, c = np.asarray(a, np.float64), np.asarray(c, np.float64)
            rel = np.linalg.norm(a - c) / np.linalg.norm(c)
            assert rel < (1e-4 if activation is None else 2e-2), f"{name}: relative difference {rel:.3g}"
