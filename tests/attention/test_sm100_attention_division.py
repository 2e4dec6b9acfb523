"""The Blackwell attention forward's O / l (kernels/sm100/attention_fwd_correction.div_rn) is the IEEE quotient.

The kernel replaces div.rn.f32 (whose slow path is a subroutine call per element) by its fast path: y =
rcp.approx(l) refined by one Newton step, q = a y, then q + (a - l q) y (two FMAs). This test runs that
sequence in exact rational arithmetic with float32 rounding after every operation, for every reciprocal
approximation rcp.approx may return (the correctly rounded 1 / l and its neighbours one ulp away), and
checks the result against the correctly rounded a / l on random and edge-case operands of the kernel's
range: l >= 1 (a row with a valid key has l >= 1: its max contributes ex2(0) = 1), |a| <= 2^20 l."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest


def _round32(x: Fraction) -> np.float32:
    """x rounded to the nearest float32 (ties to even); normal range only (the test's operands)."""
    if x == 0:
        return np.float32(0.0)
    sign = -1 if x < 0 else 1
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    # x in [2^e, 2^(e+1)): 24 significant bits -> units of 2^(e - 23)
    scaled = x / Fraction(2) ** (e - 23)
    q, r = divmod(scaled.numerator, scaled.denominator)
    rem = Fraction(r, scaled.denominator)
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and q % 2):
        q += 1
    return np.float32(sign * float(Fraction(q) * Fraction(2) ** (e - 23)))


def _f(x) -> Fraction:
    return Fraction(float(x))


def _kernel_div(a: np.float32, b: np.float32, y0: np.float32) -> np.float32:
    """The kernel's sequence (reciprocal(), div_rn()), every operation rounded to float32 once."""
    e = _round32(-_f(b) * _f(y0) + 1)  # fma.rn(-b, y0, 1)
    y = _round32(_f(y0) * _f(e) + _f(y0))  # fma.rn(y0, e, y0)
    q = _round32(_f(a) * _f(y))  # mul.rn
    r = _round32(-_f(b) * _f(q) + _f(a))  # fma.rn(-b, q, a)
    return _round32(_f(r) * _f(y) + _f(q))  # fma.rn(r, y, q)


def _operands(n: int) -> list[tuple[np.float32, np.float32]]:
    rng = np.random.default_rng(20260105)
    b = np.float32(2.0) ** rng.uniform(0, 24, n).astype(np.float32)  # l in [1, 2^24)
    b = np.concatenate([b, np.float32([1.0, 1.5, 3.0, 255.0, 256.0, 1.0000001, 16777215.0])]).astype(np.float32)
    a = (rng.standard_normal(b.shape) * b * np.float32(2.0) ** rng.uniform(-20, 20, b.shape)).astype(np.float32)
    a[-7:] = np.float32([1.0, -448.0, 7.0, 1.0, 3.0, 0.9999999, 1e-5])
    return list(zip(a, b, strict=True))


@pytest.mark.parametrize("ulps", [-1, 0, 1])
def test_fast_path_division_is_the_ieee_quotient(ulps):
    for a, b in _operands(600):
        y0 = _round32(1 / _f(b))
        for _ in range(abs(ulps)):
            y0 = np.nextafter(y0, np.float32(np.inf if ulps > 0 else -np.inf), dtype=np.float32)
        want = _round32(_f(a) / _f(b))
        got = _kernel_div(a, b, y0)
        assert got == want and np.signbit(got) == np.signbit(want), (a, b, ulps, got, want)


def test_zero_numerator_stays_a_signed_zero():
    for b in np.float32([1.0, 3.0, 1e6]):
        assert _kernel_div(np.float32(0.0), b, _round32(1 / _f(b))) == 0.0
