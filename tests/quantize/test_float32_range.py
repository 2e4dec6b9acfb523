"""Finite values near float32's (and bfloat16's) maximum, and float64 beyond float32's range.

The rule (docs/numerics.md "Float32 range" and "Dequantize"):
- dequantize saturates a finite element whose product element * 2**(b - 127) exceeds the output dtype's
  range to +-min(dtype max, float32 max) (float32 3.4028235e38, bfloat16 3.3895314e38, float16 65504).
  Under scale_rounding="up" a block of amax near float32's maximum gets scale 2**120 and an element that
  rounds up to 256 (E4M3) / 32768 (E5M2), i.e. 2**128: saturated, not +-Inf. Inf elements (E5M2)
  and NaN blocks (scale 0xFF) pass through unchanged.
- quantize of concrete input holding finite values beyond float32's range (float64: x64 mode or a NumPy
  array) raises a ValueError naming x; traced input (under jit) keeps the contract's answer, a NaN block.

Every implementation is checked: the XLA reference and the kernel call's XLA emulation on the CPU, the CUDA
kernels on the GPU (`-m gpu`), each against the independent float64 NumPy oracle (tests/quantize/mx_oracle.py) and,
on the GPU, bit for bit against the reference on the same device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.formats import fake_quantize
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import quantize as pq
from tests.quantize import mx_oracle as orc

F32_MAX = float(np.finfo(np.float32).max)
BF16_MAX = float(jnp.finfo(jnp.bfloat16).max)
ELEMS = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
# 32 scale bytes: the ends of the range, the "up" bytes of amax near float32's max (247 E4M3, 240 E5M2), NaN
SCALES = [0, 1, 2, 10, 64, 100, 126, 127, 128, 150, 200, 220, 230, 235, 239, 240]
SCALES += [241, 242, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255, 180, 30, 90]
LAYOUTS = {"row": ((-1,), "row"), "col": ((-2,), "row"), "square": ((-2, -1), "square")}


def _every_code_array(elem: str, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes (1024, 256) uint8, scale bytes) for `layout`: every FP8 code (NaN and, for E5M2, +-Inf too)
    under every byte of SCALES."""
    r = np.arange(1024)[:, None]
    c = np.arange(256)[None, :]
    codes = ((c + 37 * r) % 256).astype(np.uint8)
    sb = np.asarray(SCALES, np.uint8)
    if layout == "row":
        scale = sb[(np.arange(1024)[:, None] + np.arange(8)[None, :]) % 32]
    elif layout == "col":
        scale = sb[(np.arange(32)[:, None] + np.arange(256)[None, :]) % 32]
    else:
        scale = sb[(np.arange(32)[:, None] + np.arange(8)[None, :]) % 32]
    return codes, scale


def _mx(codes, scale, elem, layout) -> mx.MXArray:
    axes, block = LAYOUTS[layout]
    data = jnp.asarray(codes.view(ELEMS[elem]))
    return mx.MXArray(data=data, scale=jnp.asarray(scale), axes=axes, block=block)


def _assert_oracle(got, codes, scale, elem, layout, dtype):
    """got == the float64 oracle's saturating dequantize, bit for bit (NaN for NaN; a float32-subnormal
    product may be flushed to zero, which the contract allows)."""
    fmt = orc.fmt_of(ELEMS[elem])
    axes = tuple(a % 2 for a in LAYOUTS[layout][0])
    want = orc.dequantize(codes, scale, axes, fmt, dtype)
    exact32 = orc.dequantize(codes, scale, axes, fmt, np.float32)
    g, w = np.asarray(got).astype(np.float32), want.astype(np.float32)
    sub = (exact32 != 0) & (np.abs(exact32) < np.float32(2.0**-126))
    ok = (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w)) | (sub & (g == 0))
    assert ok.all(), (np.argwhere(~ok)[:3].tolist(), g[~ok][:3], w[~ok][:3])
    return g


def _saturated(g, codes, scale, elem, layout, bound):
    """Count of elements the rule saturated (finite element, unsaturated product beyond `bound`)."""
    fmt = orc.fmt_of(ELEMS[elem])
    axes = tuple(a % 2 for a in LAYOUTS[layout][0])
    vals = orc.decode(codes, fmt)
    b = orc.expand(scale, axes).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        big = np.isfinite(vals) & (np.abs(vals * np.exp2(b - 127)) > bound) & (b != 255)
    assert np.all(np.abs(g[big]) == np.float32(bound)) and np.all(np.signbit(g[big]) == np.signbit(vals[big]))
    return int(big.sum())


def test_dequantize_to_float16_and_float64_saturate():
    """The reference's other output dtypes: float16 saturates at 65504, float64 at float32's max (the
    product is formed in float32)."""
    x = np.full((1, 32), 1.0, np.float32)
    x[0, :2] = [65504.0, -65504.0]  # "up": scale 2**8, element 255.875 -> 256: 65536 is beyond float16
    q = mx.quantize(x, implementation="xla")
    np.testing.assert_array_equal(np.asarray(mx.dequantize(q, jnp.float16))[0, :2], [65504.0, -65504.0])
    np.testing.assert_array_equal(np.asarray(mx.dequantize(q))[0, :2], [65536.0, -65536.0])
    x[0, :2] = [F32_MAX, -F32_MAX]
    q = mx.quantize(x, implementation="xla")
    np.testing.assert_array_equal(np.asarray(mx.dequantize(q, jnp.float16))[0, :2], [65504.0, -65504.0])
    with jax.enable_x64(True):
        d = np.asarray(mx.dequantize(q, jnp.float64))
        assert d.dtype == np.float64 and list(d[0, :2]) == [F32_MAX, -F32_MAX]


def _near_max_input(in_dtype) -> np.ndarray:
    """(64, 64): blocks whose amax sits at / just below the input dtype's maximum (both signs), with the
    other elements spread over many binades."""
    top = F32_MAX if in_dtype == jnp.float32 else BF16_MAX
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 64)) * 2.0 ** rng.integers(-40, 1, (64, 64)) * (top / 4)
    for i in range(64):
        x[i, (7 * i) % 64] = top * (1.0, -1.0, 0.9999, 0.75, 0.5 + 2**-10, -0.99)[i % 6]
    return np.asarray(jnp.asarray(np.clip(x, -top, top).astype(np.float32)).astype(in_dtype))


class Float32RangeCases:
    """Saturation and round trips near the maximum, per implementation (subclasses set IMPLEMENTATION)."""

    IMPLEMENTATION = "xla"

    @pytest.mark.parametrize("layout", list(LAYOUTS))
    @pytest.mark.parametrize("elem", list(ELEMS))
    # float16: the attention backward's dO for dV
    @pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
    def test_dequantize_saturates_finite_values(self, layout, elem, out_dtype):
        """Every FP8 code under every scale byte in SCALES: finite elements whose product overflows the output
        dtype come back as +-its max (they were +-Inf), Inf elements stay Inf, scale 0xFF stays NaN."""
        codes, scale = _every_code_array(elem, layout)
        a = _mx(codes, scale, elem, layout)
        dt = jnp.dtype(out_dtype)
        got = np.asarray(jax.jit(lambda v: mx.dequantize(v, dt, implementation=self.IMPLEMENTATION))(a))
        assert got.dtype == dt
        g = _assert_oracle(got, codes, scale, elem, layout, dt)
        n = _saturated(g, codes, scale, elem, layout, float(min(jnp.finfo(dt).max, F32_MAX)))
        assert n > 500, n  # the case is really exercised (scale bytes 241..254 x the large codes)
        finite_elem = np.isfinite(orc.decode(codes, orc.fmt_of(ELEMS[elem])))
        not_nan_block = orc.expand(scale, tuple(x % 2 for x in LAYOUTS[layout][0])) != 255
        assert np.isfinite(g[finite_elem & not_nan_block]).all()
        if elem == "e5m2":  # Inf elements of E5M2 are not finite values: they stay Inf
            inf_elem = np.isinf(orc.decode(codes, orc.fmt_of(ELEMS[elem]))) & not_nan_block
            assert inf_elem.any() and np.isinf(g[inf_elem]).all()
        if self.IMPLEMENTATION == "cuda":  # the kernel is bit-identical to the reference on the same device
            want = np.asarray(jax.jit(lambda v: mx.dequantize(v, dt, implementation="xla"))(a))
            nan_g, nan_w = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
            assert (nan_g == nan_w).all()
            unnan = lambda x, nan: np.where(nan, 0, x).view(np.uint8)  # noqa: E731
            np.testing.assert_array_equal(unnan(got, nan_g), unnan(want, nan_w))

    @pytest.mark.parametrize("in_dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("elem", list(ELEMS))
    @pytest.mark.parametrize("scale_rounding", ["up", "floor"])
    def test_round_trip_near_the_maximum_stays_finite(self, in_dtype, elem, scale_rounding):
        """dequantize(quantize(x)) of finite x near float32's / bfloat16's maximum is finite and equals the
        oracle's round trip, to float32 and back to the input dtype (row, column and square blocks)."""
        dt = jnp.dtype(in_dtype)
        x = _near_max_input(dt)
        for axis, block in ((-1, "row"), (-2, "row"), ((-2, -1), "square")):
            kw = dict(axis=axis, block=block, dtype=ELEMS[elem], scale_rounding=scale_rounding)
            q = jax.jit(lambda v, kw=kw: mx.quantize(v, implementation=self.IMPLEMENTATION, **kw))(x)
            ref = orc.quantize(x, axis=axis, block=block, dtype=ELEMS[elem], scale_rounding=scale_rounding)
            np.testing.assert_array_equal(np.asarray(q.scale), ref.scale)
            np.testing.assert_array_equal(np.asarray(q.data).view(np.uint8), ref.data)
            for out in (jnp.dtype(jnp.float32), dt):
                d = np.asarray(jax.jit(lambda a, out=out: mx.dequantize(a, out, implementation=self.IMPLEMENTATION))(q))
                assert np.isfinite(d.astype(np.float32)).all(), (axis, out)
                want = orc.dequantize(ref.data, ref.scale, ref.axes, ref.fmt, out)
                np.testing.assert_array_equal(d.astype(np.float32), want.astype(np.float32), err_msg=f"{axis} {out}")
            # the block maxima keep their sign and come back within the element format's rounding
            d32 = np.asarray(mx.dequantize(q, jnp.float32, implementation=self.IMPLEMENTATION))
            big = np.abs(x.astype(np.float32)) >= np.float32(0.5 * F32_MAX if in_dtype == "float32" else 0.5 * BF16_MAX)
            rel = np.abs(d32[big] / x.astype(np.float32)[big] - 1)
            assert np.all(np.sign(d32[big]) == np.sign(x.astype(np.float32)[big])) and rel.max() <= 2.0**-2


class TestXla(Float32RangeCases):
    IMPLEMENTATION = "xla"


class TestEmulated(Float32RangeCases):
    IMPLEMENTATION = "emulated"


@pytest.mark.gpu
class TestCuda(Float32RangeCases):
    IMPLEMENTATION = "cuda"

    @pytest.fixture(autouse=True)
    def _kernels(self):
        ok, why = library.kernels_runnable()
        if not ok:
            pytest.skip(why)


def test_fake_quantize_at_the_dtype_maximum_is_finite():
    """fake_quantize returns x's dtype: bfloat16's and float16's maxima saturate there (they gave Inf)."""
    for dt in (jnp.bfloat16, jnp.float16, jnp.float32):
        top = jnp.finfo(dt).max
        x = jnp.full((2, 32), 1.0, dt).at[:, 0].set(jnp.asarray([top, -top], dt))
        y = np.asarray(fake_quantize(x)).astype(np.float32)
        np.testing.assert_array_equal(y[:, 0], np.asarray([top, -top], dt).astype(np.float32))


# ------------------------------------------------------------------------------------ float64 input
def _f64_block(big: float) -> np.ndarray:
    x = np.ones((32, 64), np.float64)
    x[3, 40] = big
    return x


BEYOND = [1e39, -1e300, 2.0**128 - 2.0**103]  # the last is the first float64 that rounds to float32 Inf
WITHIN = [F32_MAX, 2.0**128 - 2.0**103 - 2.0**75]  # round to float32's max: no error, saturated result


@pytest.mark.parametrize("implementation", [None, "xla", "emulated"])
@pytest.mark.parametrize("big", BEYOND)
def test_concrete_float64_beyond_float32_raises(implementation, big):
    """NumPy float64 (x64 off: jnp.asarray would turn it into Inf silently) and jnp float64 under x64."""
    with pytest.raises(ValueError, match=r"x holds 1 finite float64 value\(s\) beyond float32's range"):
        mx.quantize(_f64_block(big), implementation=implementation)
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match="beyond float32's range"):
            mx.quantize(jnp.asarray(_f64_block(big)), implementation=implementation)
    with pytest.raises(ValueError, match="beyond float32's range"):
        fake_quantize(_f64_block(big))
    with pytest.raises(ValueError, match="beyond float32's range"):
        pq.quantize_rowcol(_f64_block(big), implementation=implementation)


@pytest.mark.parametrize("big", WITHIN)
def test_float64_within_float32_range_quantizes(big):
    with jax.enable_x64(True):
        q = mx.quantize(jnp.asarray(_f64_block(big)), implementation="xla")
        d = np.asarray(mx.dequantize(q))
    assert np.asarray(q.scale)[3, 1] == 247 and d[3, 40] == np.float32(F32_MAX) and np.isfinite(d).all()


def test_traced_float64_beyond_float32_gives_the_nan_block():
    """Under jit the values cannot be inspected: the float32 conversion overflows to Inf, and the contract
    makes that block NaN (scale 0xFF), the other blocks unchanged (documented in docs/numerics.md)."""
    with jax.enable_x64(True):
        x = jnp.asarray(_f64_block(1e39))
        q = jax.jit(lambda v: mx.quantize(v, implementation="xla"))(x)
        d = np.asarray(mx.dequantize(q))
    s = np.asarray(q.scale)
    assert s[3, 1] == 255 and np.all(np.isnan(d[3, 32:])) and (s == s[0, 0]).sum() == s.size - 1
    assert np.all(d[:3] == 1) and np.all(d[3, :32] == 1) and np.all(d[4:] == 1)


def test_other_entry_points_reject_concrete_float64_beyond_float32():
    """The same class for every public op that takes float arrays (they all compute in float32): a ValueError
    naming the argument (they returned NaN silently)."""
    big = _f64_block(1e39)  # (32, 64)
    q = np.ones((1, 32, 2, 32))
    q_big = q.copy()
    q_big[0, 5, 1, 7] = -1e39
    dn = (((1,), (0,)), ((), ()))
    cases = {
        "lhs": lambda: mx.mx_dot_general(big, np.ones((64, 8)), dn),
        "rhs": lambda: mx.mx_dot_general(np.ones((8, 32)), big, dn),
        "x": lambda: mx.rms_norm_quantize(big, np.ones(64)),
        "weight": lambda: mx.rms_norm_quantize(np.ones((32, 64)), big[3]),
        "query": lambda: mx.dot_product_attention(q_big, q[:, :, :1], q[:, :, :1], implementation="xla"),
        "value": lambda: mx.dot_product_attention(q, q[:, :, :1], q_big[:, :, 1:], implementation="xla"),
        "bias": lambda: mx.dot_product_attention(q, q[:, :, :1], q[:, :, :1], bias=big[:, 32:], implementation="xla"),
        "k": lambda: mx.varlen_attention(
            q[0],
            q_big[0, :, 1:],
            q[0, :, :1],
            np.asarray([0, 32]),
            np.asarray([0, 32]),
            max_seqlen_q=32,
            max_seqlen_k=32,
            implementation="xla",
        ),
    }
    for name, call in cases.items():
        with pytest.raises(ValueError, match=f"{name} holds 1 finite float64 value"):
            call()
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match="lhs holds 1 finite float64 value"):
            mx.mx_dot_general(jnp.asarray(big), jnp.ones((64, 8)), dn)


def test_kernel_variants_cover_every_output_dtype():
    """The saturation bound is compiled per out_dtype: every dequantize variant has one of the three (float16:
    the attention backward's dO for dV)."""
    outs = {v.out_dtype for v in registry.DEQUANTIZE_VARIANTS}
    assert outs == {"float32", "bfloat16", "float16"}
