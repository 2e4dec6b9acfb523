"""IEEE float32 operations for the Blackwell attention kernels' softmax, compute and epilogue warps (sm_100f;
traced inside CuTe DSL kernels), each an asm statement with its own explicit rounding (.rn, no .ftz): never
contracted into an FFMA with a neighbour, so the kernels round exactly where the emulations do.

Scalar (the backward; one rounding each):
  mul_rn(a, b), sub_rn(a, b)   a b, a - b
  select_f32(pred, a, b)       pred ? a : b (selp: no branch)
  exp2_min0(x)                 2^min(x, 0), NaN kept (min.NaN), ex2.approx.f32 without flushing subnormals
Pairs (the forward's softmax: two operations per issue slot, SASS FMUL2 / FADD2, PTX mul.rn.f32x2 /
add.rn.f32x2, bit-identical to the scalar mul.rn / sub.rn / add.rn they replace; the softmax is bound by
instruction issue and MUFU.EX2, not by the FMA pipe):
  mul2(a, b, c)            (a c, b c)
  sub2(a, b, m)            (a - m, b - m)
  add2(a, b, c, d)         (a + c, b + d)
  max3(a, b, c)            max with NaN propagated (FMNMX3.NAN)
  max_all(values)          max over a list (chains of max3, then a tree), NaN if any is NaN
  sum_pairs(values)        sum over a list (2 chains of add2, then the pair's sum)
  e4m3x4(x4, f)            four values times f (exact for a power of two f) rounded (RNE, satfinite) to
                           E4M3, packed little-endian (value i in byte i)
"""

from __future__ import annotations

from cutlass import Boolean, Float32, Uint32
from cutlass.cute.arch import inline_ptx


def mul_rn(a: Float32, b: Float32) -> Float32:
    """a * b rounded once (mul.rn: never contracted into a fused multiply-add)."""
    return inline_ptx("mul.rn.f32 {$w0}, {$r0}, {$r1};", write_only_types=[Float32], read_only_args=[a, b])


def sub_rn(a: Float32, b: Float32) -> Float32:
    """a - b rounded once (sub.rn: never contracted)."""
    return inline_ptx("sub.rn.f32 {$w0}, {$r0}, {$r1};", write_only_types=[Float32], read_only_args=[a, b])


def exp2_min0(x: Float32) -> Float32:
    """2^min(x, 0) with NaN kept (min.NaN: a NaN logit stays NaN), ex2.approx.f32 without flushing
    subnormal results."""
    return inline_ptx(
        "{\n.reg .f32 t;\nmin.NaN.f32 t, {$r0}, 0f00000000;\nex2.approx.f32 {$w0}, t;\n}",
        write_only_types=[Float32],
        read_only_args=[x],
    )


def select_f32(pred: Boolean, a: Float32, b: Float32) -> Float32:
    """pred ? a : b."""
    return inline_ptx(
        "{\n.reg .pred p;\nsetp.ne.u32 p, {$r0}, 0;\nselp.f32 {$w0}, {$r1}, {$r2}, p;\n}",
        write_only_types=[Float32],
        read_only_args=[Uint32(pred), a, b],
    )


def _pair(op: str, a: Float32, b: Float32, c: Float32, d: Float32) -> tuple[Float32, Float32]:
    code = (
        "{\n.reg .b64 x, y, z;\nmov.b64 x, {{$r0}, {$r1}};\nmov.b64 y, {{$r2}, {$r3}};\n"
        f"{op}.rn.f32x2 z, x, y;\nmov.b64 {{{{$w0}}, {{$w1}}}}, z;\n}}"
    )
    return inline_ptx(code, write_only_types=[Float32, Float32], read_only_args=[a, b, c, d])


def mul2(a: Float32, b: Float32, c: Float32) -> tuple[Float32, Float32]:
    return _pair("mul", a, b, c, c)


def sub2(a: Float32, b: Float32, m: Float32) -> tuple[Float32, Float32]:
    return _pair("sub", a, b, m, m)


def add2(a: Float32, b: Float32, c: Float32, d: Float32) -> tuple[Float32, Float32]:
    return _pair("add", a, b, c, d)


def max3(a: Float32, b: Float32, c: Float32) -> Float32:
    return inline_ptx("max.NaN.f32 {$w0}, {$r0}, {$r1}, {$r2};", write_only_types=[Float32], read_only_args=[a, b, c])


MAX_CHAINS = 8


def max_all(values: list[Float32]) -> Float32:
    """max of a non-empty list, NaN if any is NaN: MAX_CHAINS chains of max3 (few temporaries next to the
    values: a tree would keep half as many live), then a tree of max3 over the chains."""
    chains = list(values[:MAX_CHAINS])
    rest = list(values[MAX_CHAINS:])
    for i in range(0, len(rest), 2):
        pair = rest[i : i + 2]
        c = (i // 2) % MAX_CHAINS
        chains[c] = max3(chains[c], pair[0], pair[-1])
    while len(chains) > 1:
        groups = [chains[k : k + 3] for k in range(0, len(chains), 3)]
        chains = [g[0] if len(g) == 1 else max3(g[0], g[1], g[-1]) for g in groups]
    return chains[0]


def sum_pairs(values: list[Float32]) -> Float32:
    """sum of an even-length list: two interleaved chains of add2 (value 2i to lane 0, 2i + 1 to lane 1),
    then the two lanes' sum."""
    s0, s1 = values[0], values[1]
    for i in range(2, len(values), 2):
        s0, s1 = add2(s0, s1, values[i], values[i + 1])
    return s0 + s1


def e4m3x4(x: list[Float32], f: Float32) -> Uint32:
    """E4M3(x_i f) for four values, packed (value i in byte i): two mul.rn.f32x2, two cvt.rn.satfinite."""
    code = (
        "{\n.reg .b64 a, b, s;\n.reg .f32 y0, y1, y2, y3;\n.reg .b16 lo, hi;\n"
        "mov.b64 a, {{$r0}, {$r1}};\nmov.b64 b, {{$r2}, {$r3}};\nmov.b64 s, {{$r4}, {$r4}};\n"
        "mul.rn.f32x2 a, a, s;\nmul.rn.f32x2 b, b, s;\n"
        "mov.b64 {y0, y1}, a;\nmov.b64 {y2, y3}, b;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, y1, y0;\ncvt.rn.satfinite.e4m3x2.f32 hi, y3, y2;\n"
        "mov.b32 {$w0}, {lo, hi};\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[*x, f])
