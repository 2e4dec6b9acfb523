"""rms_norm_quantize: output vs float64, MXArray bit-identical to a separate quantize, gradients, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.metrics import sqnr_db
from tests.quantize import mx_oracle


def _inputs(seed, shape, dtype):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = (jax.random.normal(kx, shape) * 3.0 + 0.5).astype(dtype)
    w = (1.0 + 0.1 * jax.random.normal(kw, shape[-1:])).astype(jnp.float32)
    return x, w


def _rms_norm_f64(x, w, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(w, np.float64)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_output_and_quantized_output(dtype):
    x, w = _inputs(0, (4, 16, 256), dtype)
    y, y_mx = jax.jit(jax_mxfp8.rms_norm_quantize)(x, w)
    assert y.dtype == dtype and y_mx.data.shape == x.shape and y_mx.scale.shape == (4, 16, 8)
    # y is float64 RMSNorm rounded once to the output dtype (up to float32 arithmetic)
    assert sqnr_db(_rms_norm_f64(x, w, 1e-6), y) > (60 if dtype == jnp.float32 else 45)
    # the MXArray is exactly what the independent oracle makes of y
    q = mx_oracle.quantize(np.asarray(y.astype(jnp.float32)), axis=-1)
    np.testing.assert_array_equal(np.asarray(y_mx.data).view(np.uint8), q.data)
    np.testing.assert_array_equal(np.asarray(y_mx.scale), q.scale)


def test_gradients_match_autodiff_of_float64_formula():
    x, w = _inputs(1, (8, 64), jnp.float32)
    g = jax.random.normal(jax.random.key(2), x.shape)
    _, vjp = jax.vjp(lambda x, w: jax_mxfp8.rms_norm_quantize(x, w)[0], x, w)
    dx, dw = vjp(g)
    # independent reference: central finite differences are too noisy; use the closed form in float64
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    r = 1.0 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + 1e-6)
    gw = g64 * w64
    expect_dx = r * gw - x64 * r**3 * np.mean(gw * x64, -1, keepdims=True)
    expect_dw = np.sum(g64 * x64 * r, 0)
    assert sqnr_db(expect_dx, dx) > 60 and sqnr_db(expect_dw, dw) > 60
    # and the two agree with jax autodiff of the plain formula
    auto = jax.grad(lambda x: jnp.sum(g * (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w)))(x)
    assert sqnr_db(auto, dx) > 60


def test_feeds_mx_dot_general_without_a_second_quantize():
    x, w = _inputs(3, (64, 128), jnp.float32)
    kernel = jax.random.normal(jax.random.key(4), (128, 32))
    dn = (((1,), (0,)), ((), ()))

    def fused(x):
        y, y_mx = jax_mxfp8.rms_norm_quantize(x, w)
        return jnp.sum(jax_mxfp8.mx_dot_general(y, kernel, dn, lhs_quantized=y_mx) ** 2)

    def separate(x):
        y, _ = jax_mxfp8.rms_norm_quantize(x, w)
        return jnp.sum(jax_mxfp8.mx_dot_general(y, kernel, dn) ** 2)

    # each side one program (eager dispatch compiled ~30 s of small programs on CI's CPU)
    assert jax.jit(fused)(x) == jax.jit(separate)(x)
    np.testing.assert_array_equal(jax.jit(jax.grad(fused))(x), jax.jit(jax.grad(separate))(x))


@pytest.mark.parametrize(
    "x_shape,w_shape,dtype,match",
    [
        ((4, 48), (48,), jnp.float32, "multiple of the MX block"),
        ((4, 64), (32,), jnp.float32, "weight has shape"),
        ((4, 64), (64,), jnp.int32, "dtype"),
    ],
)
def test_bad_inputs(x_shape, w_shape, dtype, match):
    with pytest.raises(ValueError, match=match):
        jax_mxfp8.rms_norm_quantize(jnp.ones(x_shape, dtype), jnp.ones(w_shape))


def _plain_rms_norm(x, w, eps):
    """The float32 formula without the overflow branch: x * rsqrt(mean(x * x) + eps) * w, rounded to x's dtype."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * w).astype(x.dtype)


def _huge_rows(dtype) -> jax.Array:
    """Rows whose float32 sum of squares overflows while every value is finite, and their edges."""
    rng = np.random.default_rng(7)
    big = float(jnp.finfo(dtype).max)
    rows = [
        np.full(64, 1e20),  # x * x overflows
        -np.full(64, 1e20),
        rng.standard_normal(64) * 2.0**70,  # mixed signs and magnitudes
        np.where(np.arange(64) == 5, big, 1.0),  # one element at the dtype's max, the rest ordinary
        np.full(64, big),  # every element at the max: the scaled sum must not overflow either
        rng.standard_normal(64) * 3e18,  # each x * x finite, the sum past float32's max
    ]
    return jnp.asarray(np.stack(rows), dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rows_whose_sum_of_squares_overflows_are_normalized(dtype):
    """Values beyond ~1.8e19 (x * x overflows float32) normalized to 0; they now follow float64 RMSNorm, the
    MXArray is still quantize(y) bit for bit, and the kernel path's emulation equals the reference."""
    x = _huge_rows(dtype)
    w = jnp.asarray(np.random.default_rng(8).uniform(0.5, 2.0, 64), jnp.float32)
    plain = np.asarray(_plain_rms_norm(x, w, 1e-6), np.float32)
    assert np.all(plain == 0)  # what the formula without the branch gives: the failure being fixed
    y, q = jax.jit(jax_mxfp8.rms_norm_quantize)(x, w)
    want = _rms_norm_f64(np.asarray(x, np.float64), w, 1e-6)
    got = np.asarray(y, np.float64)
    # within 2^-20 (float32: the row of float32 max values has an RMS above 2^126, where c * r is subnormal and
    # loses up to 3 bits) or half a bf16 ulp of the row's largest output, element by element
    tol = 2.0**-20 if dtype == jnp.float32 else 2.0**-8
    assert np.all(np.abs(got - want) <= tol * np.abs(want).max(axis=-1, keepdims=True)), np.abs(got - want).max(-1)
    qo = mx_oracle.quantize(np.asarray(y.astype(jnp.float32)), axis=-1)
    np.testing.assert_array_equal(np.asarray(q.data).view(np.uint8), qo.data)
    np.testing.assert_array_equal(np.asarray(q.scale), qo.scale)
    if dtype == jnp.bfloat16:  # the kernel path's XLA emulation (the kernels take float32 and bfloat16)
        ye, qe = jax.jit(lambda a, b: jax_mxfp8.rms_norm_quantize(a, b, implementation="emulated"))(x, w)
        np.testing.assert_array_equal(np.asarray(ye).view(np.uint16), np.asarray(y).view(np.uint16))
        np.testing.assert_array_equal(np.asarray(qe.data).view(np.uint8), np.asarray(q.data).view(np.uint8))
    # rows holding Inf or NaN keep the plain formula's result (NaN where the Inf / NaN is, 0 elsewhere)
    special = jnp.asarray(
        np.stack([np.where(np.arange(64) == 3, np.inf, 1e20), np.where(np.arange(64) == 3, np.nan, 1.0)]), dtype
    )
    ys = np.asarray(jax_mxfp8.rms_norm_quantize(special, w)[0], np.float32)
    np.testing.assert_array_equal(ys, np.asarray(_plain_rms_norm(special, w, 1e-6), np.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ordinary_rows_are_bit_identical_to_the_plain_formula(dtype):
    """Rows whose sum of squares is finite (magnitudes 2^-70 .. 2^55 here) give exactly the plain formula's bits;
    only the overflowing rows in the same batch change. Jitted programs on both sides: XLA:CPU's rsqrt bits
    depend on the fusion around it (an eager call of the plain formula can differ from a jitted one by an ulp)."""
    from jax_mxfp8.reference.rms_norm import rms_norm

    rng = np.random.default_rng(9)
    plain = jax.jit(_plain_rms_norm, static_argnums=2)
    for d in (32, 96, 1024):
        x = rng.standard_normal((128, d)) * np.exp2(rng.integers(-70, 56, size=(128, 1)))
        x[::16] *= 2.0**40  # some rows past the overflow point, between ordinary ones
        x = jnp.asarray(x, dtype)
        w = jnp.asarray(rng.standard_normal(d), jnp.float32)
        with np.errstate(over="ignore"):
            x32 = np.asarray(x, np.float32)
            ordinary = np.isfinite(np.sum(x32 * x32, axis=-1, dtype=np.float32))
        assert 0 < ordinary.sum() < len(ordinary)
        want = np.asarray(plain(x, w, 1e-6))
        for f in (lambda a, b: jax_mxfp8.rms_norm_quantize(a, b)[0], lambda a, b: rms_norm(a, b, 1e-6)):
            got = np.asarray(jax.jit(f)(x, w))
            np.testing.assert_array_equal(got[ordinary].view(np.uint8), want[ordinary].view(np.uint8))
            assert np.all(np.abs(got[~ordinary].astype(np.float32)).max(-1) > 0.1)


def test_gradients_of_huge_rows_match_the_float64_closed_form():
    """rms_norm_quantize's backward never forms r^3 (subnormal from |x| ~ 1e13, zero past ~1e15) nor x * dy: rows
    of 1, 1e15, 1e20 and 3e18 get the closed form's gradients. Autodiff of the reference rms_norm (the BF16
    policy's norm) gets them on the ordinary and the overflowing rows; on rows near 1e15 its autodiff still
    forms rsqrt's derivative ms^-1.5, which underflows there (as stock Flax's RMSNorm does): not checked."""
    from jax_mxfp8.reference.rms_norm import rms_norm

    rng = np.random.default_rng(10)
    x = jnp.asarray(rng.standard_normal((4, 64)) * np.array([[1.0], [1e15], [1e20], [-3e18]]), jnp.float32)
    w = jnp.asarray(rng.uniform(0.5, 2.0, 64), jnp.float32)
    g = jnp.asarray(rng.standard_normal((4, 64)), jnp.float32)
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    r = 1.0 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + 1e-6)
    gw = g64 * w64
    expect_dx = r * gw - x64 * r**3 * np.mean(gw * x64, -1, keepdims=True)
    expect_dw = g64 * x64 * r  # per row
    for fn, rows in (
        (lambda a, b: jax_mxfp8.rms_norm_quantize(a, b)[0], (0, 1, 2, 3)),
        (lambda a, b: rms_norm(a, b, 1e-6), (0, 2, 3)),
    ):
        grads = jax.jit(lambda x, w, g, fn=fn: jax.vjp(fn, x, w)[1](g))  # one program (eager: many small ones)
        dx, _ = grads(x, w, g)
        for i in rows:  # per row: the rows' gradients differ by 20 orders of magnitude
            assert sqnr_db(expect_dx[i], dx[i]) > 60, i
            _, dw = grads(x[i : i + 1], w, g[i : i + 1])
            assert sqnr_db(expect_dw[i], dw) > 60, i
