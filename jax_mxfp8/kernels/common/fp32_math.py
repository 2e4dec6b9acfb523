"""Float32 arithmetic built from exponent bits and FMAs, for any CuTe DSL kernel (arch-neutral).

Called while a kernel is traced (plain Python functions, inlined into the caller's IR; no control flow of
their own), so they cost exactly the instructions written here. Used by the Hopper attention forward
(kernels/sm90/attention_softmax.py) and meant for every kernel that needs exact powers of two or exp2
off the MUFU pipe (attention backward, GEMM epilogues, Blackwell kernels):
  pow2          2^k for an integer-valued float32 k, from the exponent field (exact, no MUFU.EX2)
  exp2_poly     2^x on the FMA pipe (FA4's trick to offload MUFU), relative error <= 7.8e-5
  tree_reduce   balanced-tree reduction of a Python list of DSL values (short dependency chains)
  softmax_exponent  (acc * c - m) + off with every step rounded (no FMA): the exp2 argument of a softmax
  gelu_tanh_f32  jax.nn.gelu's tanh form on float32 bits, op for op (the MX GEMM epilogues, sm90 and sm100)
  MIN_NORMAL, ROUND_MAGIC, POLY_EXP2: the constants behind them
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import cutlass.cute as cute
import numpy as np
from cutlass import Float32, Int32, Uint32
from cutlass.cute.arch import inline_ptx

T = TypeVar("T")

MIN_NORMAL = 2.0**-126
"""float32's smallest normal value: a stand-in for scale products that flush to 0 (0 * -inf would be NaN)."""

ROUND_MAGIC = 12582912.0
"""1.5 * 2^23: x + ROUND_MAGIC rounds x (|x| < 2^22) to an integer held in the low mantissa bits."""

POLY_EXP2 = (0.9999289512634277, 0.6932762265205383, 0.24260404706001282, 0.05508868396282196)
"""2^f on [-0.5, 0.5], degree 3 (c0 + c1 f + c2 f^2 + c3 f^3), fitted for relative error (max 7.8e-5 in
float32 Horner form)."""


def tree_reduce(values: list[T], op: Callable[[T, T], T]) -> T:
    """op-reduction of a non-empty Python list of DSL values as a balanced pairwise tree (trace time).

    Depth ceil(log2 n) instead of a serial chain of n - 1 dependent ops: what matters in latency-bound
    code such as a softmax between two wgmmas. Pairs are (0, 1), (2, 3), ...; an odd last value passes up.
    """
    while len(values) > 1:
        values = [op(values[i], values[i + 1]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def exp2_poly(x: Float32) -> Float32:
    """2^x on the FMA pipe (FADD/FFMA + two integer ops), for x <= 127: x = j + f with j = rint(x),
    |f| <= 1/2, 2^f by POLY_EXP2, j added to the exponent field. x is first raised to -126 (NaN kept),
    so a masked -inf gives 2^-126 ~ 1e-38, not 0: invisible in a softmax sum and rounded to 0 in E4M3."""
    x = cute.arch.fmax(x, Float32(-126.0), nan=True)
    t = x + Float32(ROUND_MAGIC)
    f = x - (t - Float32(ROUND_MAGIC))
    p = cute.math.fma(f, Float32(POLY_EXP2[3]), Float32(POLY_EXP2[2]))
    p = cute.math.fma(f, p, Float32(POLY_EXP2[1]))
    p = cute.math.fma(f, p, Float32(POLY_EXP2[0]))
    return (p.bitcast(Int32) + (t.bitcast(Int32) << 23)).bitcast(Float32)


def pow2(k: Float32) -> Float32:
    """2^k for an integer-valued Float32 k in [-126, 127], built from its exponent bits (F2I, IADD, SHL;
    exact, no MUFU). Outside that range the bits wrap: callers bound k."""
    return ((Int32(k) + 127) << 23).bitcast(Float32)


def softmax_exponent(acc: Float32, factor: Float32, m: Float32, offset: Float32) -> Float32:
    """(round(acc * factor) - m) + offset, three IEEE float32 operations (mul.rn, sub.rn, add.rn: no FMA).

    m must be the running max of round(acc * factor) over the row (the same rounded products): then the
    difference is exactly 0 at the max and <= 0 elsewhere (rounding is monotone) whatever the logits'
    magnitude, and the result is <= offset. A fused fma(acc, factor, offset - m) sees the unrounded
    product instead: for |m| beyond ~2^23 its argument overshoots offset by up to ulp(m) / 2 (P~ > 1) or
    falls far below it (every P~ of the row 0, the row reads as fully masked); see docs/numerics.md.
    """
    return inline_ptx(
        "{\n.reg .f32 t;\nmul.rn.f32 t, {$r0}, {$r1};\nsub.rn.f32 t, t, {$r2};\nadd.rn.f32 {$w0}, t, {$r3};\n}",
        write_only_types=[Float32],
        read_only_args=[acc, factor, m, offset],
    )


def _f32_hex(x: float) -> str:
    return f"0f{int(np.array(x, dtype=np.float32).view(np.uint32)):08X}"


GELU_C1 = _f32_hex(0.044715)
GELU_C2 = _f32_hex(float(np.sqrt(2 / np.pi).astype(np.float32)))


def gelu_tanh_f32(x: Uint32) -> Uint32:
    """float32 bits of jax.nn.gelu(x) (approximate=True) in jax's operation order, each an IEEE-rounded
    float32 op (no FMA contraction): x * (0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * ((x * x) * x))))).
    tanh is the hardware tanh.approx.f32 (max relative error ~2^-11), XLA's is a rational approximation:
    the only difference from the XLA formula. NaN stays NaN; +-Inf gives NaN / NaN like XLA's (Inf * 0)."""
    code = (
        "{\n.reg .f32 x, t;\nmov.b32 x, {$r0};\n"
        "mul.rn.f32 t, x, x;\nmul.rn.f32 t, t, x;\n"
        f"mul.rn.f32 t, t, {GELU_C1};\nadd.rn.f32 t, x, t;\nmul.rn.f32 t, t, {GELU_C2};\n"
        "tanh.approx.f32 t, t;\nadd.rn.f32 t, t, 0f3F800000;\nmul.rn.f32 t, t, 0f3F000000;\n"
        "mul.rn.f32 t, x, t;\nmov.b32 {$w0}, t;\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[x])
