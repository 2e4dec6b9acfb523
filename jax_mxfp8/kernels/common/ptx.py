"""Small PTX building blocks for the memory-bound MX kernels (called while a CuTe DSL kernel is traced).

Everything works on raw 32-bit registers (`Uint32`) so that the bit-exact parts of the MX contract
(E8M0 scale byte, NaN/Inf detection, power-of-two scaling, round-to-nearest-even FP8 conversion) are
spelled out instruction by instruction rather than left to fast-math lowering. No instruction here
flushes subnormals (no `.ftz`), and no division is used.
"""

from __future__ import annotations

from cutlass import Boolean, Float32, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

from jax_mxfp8.formats.elements import E4M3, E5M2

F32_NAN_BITS = 0x7FC00000
F32_INF_BITS = 0x7F800000


def _u32(x: int) -> Uint32:
    return Uint32(x & 0xFFFFFFFF)


# ----------------------------------------------------------------------------------------------- memory
def ld_global_v4(addr: Int64) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """16-byte read-only global load, not allocated in L1 (streamed once)."""
    return inline_ptx(
        "ld.global.nc.L1::no_allocate.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
        write_only_types=[Uint32] * 4,
        read_only_args=[addr],
    )


def ld_global_v4_pred(addr: Int64, pred: Boolean) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """ld_global_v4 predicated on `pred` (a run-time Boolean); the words are zero where it is false."""
    return inline_ptx(
        "{\n.reg .pred p;\nsetp.ne.u32 p, {$r1}, 0;\n"
        "mov.b32 {$w0}, 0;\nmov.b32 {$w1}, 0;\nmov.b32 {$w2}, 0;\nmov.b32 {$w3}, 0;\n"
        "@p ld.global.nc.L1::no_allocate.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];\n}",
        write_only_types=[Uint32] * 4,
        read_only_args=[addr, Uint32(pred)],
    )


def ld_global_v4_l1(addr: Int64, pred: Boolean) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """16-byte read-only load that may stay in L1 (data every CTA of an SM reads again, e.g. a norm
    weight), predicated on `pred` (zeros where it is false)."""
    return inline_ptx(
        "{\n.reg .pred p;\nsetp.ne.u32 p, {$r1}, 0;\n"
        "mov.b32 {$w0}, 0;\nmov.b32 {$w1}, 0;\nmov.b32 {$w2}, 0;\nmov.b32 {$w3}, 0;\n"
        "@p ld.global.nc.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];\n}",
        write_only_types=[Uint32] * 4,
        read_only_args=[addr, Uint32(pred)],
    )


def st_shared_b32(addr: Int32, value: Uint32, pred: Boolean | None = None) -> None:
    inline_ptx("st.shared.b32 [{$r0}], {$r1};", read_only_args=[addr, value], predicate=pred)


def st_shared_u8(addr: Int32, value: Uint32, pred: Boolean | None = None) -> None:
    inline_ptx("st.shared.u8 [{$r0}], {$r1};", read_only_args=[addr, value], predicate=pred)


def st_shared_u16(addr: Int32, value: Uint32) -> None:
    inline_ptx("st.shared.u16 [{$r0}], {$r1};", read_only_args=[addr, value])


def st_shared_v4(addr: Int32, words) -> None:
    """16 bytes (four 32-bit words, 16-byte aligned) to shared memory."""
    inline_ptx("st.shared.v4.b32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};", read_only_args=[addr, *words])


def ld_shared_v4_f32(addr: Int32) -> list[Float32]:
    """Four float32 (16-byte aligned) from shared memory."""
    code = "ld.shared.v4.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];"
    return list(inline_ptx(code, write_only_types=[Float32] * 4, read_only_args=[addr]))


def ld_shared_v2(addr: Int32) -> tuple[Uint32, Uint32]:
    """8 bytes (8-byte aligned) from shared memory."""
    return inline_ptx("ld.shared.v2.b32 {{$w0}, {$w1}}, [{$r0}];", write_only_types=[Uint32] * 2, read_only_args=[addr])


def ld_shared_v4(addr: Int32) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """16 bytes (16-byte aligned) from shared memory."""
    return inline_ptx(
        "ld.shared.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];", write_only_types=[Uint32] * 4, read_only_args=[addr]
    )


def ld_shared_b32(addr: Int32) -> Uint32:
    return inline_ptx("ld.shared.b32 {$w0}, [{$r0}];", write_only_types=[Uint32], read_only_args=[addr])


def ld_shared_u8(addr: Int32) -> Uint32:
    return inline_ptx("ld.shared.u8 {$w0}, [{$r0}];", write_only_types=[Uint32], read_only_args=[addr])


def ld_global_u8(addr: Int64) -> Uint32:
    return inline_ptx("ld.global.nc.u8 {$w0}, [{$r0}];", write_only_types=[Uint32], read_only_args=[addr])


def ld_global_u16(addr: Int64) -> Uint32:
    return inline_ptx("ld.global.nc.u16 {$w0}, [{$r0}];", write_only_types=[Uint32], read_only_args=[addr])


def st_global(addr: Int64, words, pred: Boolean | None = None) -> None:
    """Stores 1, 2 or 4 32-bit words (4, 8 or 16 bytes, naturally aligned) at `addr`, optionally predicated."""
    n = len(words)
    if n == 1:
        code = "st.global.b32 [{$r0}], {$r1};"
    elif n == 2:
        code = "st.global.v2.b32 [{$r0}], {{$r1}, {$r2}};"
    elif n == 4:
        code = "st.global.v4.b32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};"
    else:
        raise ValueError(f"st_global stores 1, 2 or 4 words, got {n}")
    inline_ptx(code, read_only_args=[addr, *words], predicate=pred)


def st_global_u8(addr: Int64, value: Uint32, pred: Boolean | None = None) -> None:
    inline_ptx("st.global.u8 [{$r0}], {$r1};", read_only_args=[addr, value], predicate=pred)


def st_global_u16(addr: Int64, value: Uint32, pred: Boolean | None = None) -> None:
    inline_ptx("st.global.u16 [{$r0}], {$r1};", read_only_args=[addr, value], predicate=pred)


# ------------------------------------------------------------------------------------------- integer ops
def max_u32(a: Uint32, b: Uint32) -> Uint32:
    return inline_ptx("max.u32 {$w0}, {$r0}, {$r1};", write_only_types=[Uint32], read_only_args=[a, b])


def max_u16x2(a: Uint32, b: Uint32) -> Uint32:
    """Lane-wise unsigned max of two packed 16-bit pairs (sm_90+)."""
    return inline_ptx("max.u16x2 {$w0}, {$r0}, {$r1};", write_only_types=[Uint32], read_only_args=[a, b])


def prmt(a: Uint32, b: Uint32, selector: int) -> Uint32:
    return inline_ptx(
        f"prmt.b32 {{$w0}}, {{$r0}}, {{$r1}}, {selector:#x};", write_only_types=[Uint32], read_only_args=[a, b]
    )


def shfl_bfly(x: Uint32, offset: int) -> Uint32:
    return inline_ptx(
        f"shfl.sync.bfly.b32 {{$w0}}, {{$r0}}, {offset}, 31, -1;", write_only_types=[Uint32], read_only_args=[x]
    )


def shfl_idx(x: Uint32, src_lane: Int32) -> Uint32:
    return inline_ptx(
        "shfl.sync.idx.b32 {$w0}, {$r0}, {$r1}, 31, -1;", write_only_types=[Uint32], read_only_args=[x, src_lane]
    )


def byte_at(word: Uint32, index: Uint32) -> Uint32:
    """Byte `index` (0..3, run-time) of `word`, zero-extended."""
    return inline_ptx(
        "{\n.reg .b32 s;\nor.b32 s, {$r1}, 0x4440;\nprmt.b32 {$w0}, {$r0}, 0, s;\n}",
        write_only_types=[Uint32],
        read_only_args=[word, index],
    )


def pack_bytes4(b0: Uint32, b1: Uint32, b2: Uint32, b3: Uint32) -> Uint32:
    """Low bytes of b0..b3 packed little-endian into one word."""
    lo = prmt(b0, b1, 0x0040)  # bytes: b0.0, b1.0, -, -
    hi = prmt(b2, b3, 0x0040)
    return prmt(lo, hi, 0x5410)


# --------------------------------------------------------------------------------------- MX scale rules
def _format(elem_dtype: str):
    return {"float8_e4m3fn": E4M3, "float8_e5m2": E5M2}[elem_dtype]


def _f32_bits(x: float) -> int:
    import numpy as np

    return int(np.array(x, dtype=np.float32).view(np.uint32))


def scale_and_factor(amax_bits: Uint32, elem_dtype: str, scale_rounding: str) -> tuple[Uint32, Uint32]:
    """E8M0 byte b and the float32 bit pattern of 2**(127 - b) (NaN when b == 0xFF) for a block amax.

    `amax_bits` is the float32 bit pattern of max|x| with the sign cleared; patterns >= 0x7F800000 mean
    the block held Inf or NaN. Bit-identical to jax_mxfp8.formats.scales.scale_bits:
      "up":    b = E - emax + (mantissa > 0x600000) when amax / max is a normal float32 (the element
               maximum is 1.75 * 2**emax for both E4M3 and E5M2, so the IEEE quotient's exponent and
               exactness follow from amax's bits alone); below that, 1 if amax >= up_threshold else 0.
      "floor": b = max(E - emax, 0).
    b <= 247 for finite amax, so 2**(127 - b) is always a normal float32.
    """
    fmt = _format(elem_dtype)
    assert fmt.max == 1.75 * 2.0**fmt.emax
    if scale_rounding == "up":
        smallest_normal = _f32_bits(fmt.max * 2.0**-126)
        up_threshold = _f32_bits(fmt.up_threshold)
        body = (
            "shr.u32 e, {$r0}, 23;\n"
            "and.b32 m, {$r0}, 0x7FFFFF;\n"
            "setp.gt.u32 p, m, 0x600000;\n"
            "selp.u32 t, 1, 0, p;\n"
            f"add.u32 e, e, t;\n"
            f"sub.u32 e, e, {fmt.emax};\n"
            f"setp.ge.u32 p, {{$r0}}, {up_threshold:#x};\n"
            "selp.u32 t, 1, 0, p;\n"
            f"setp.ge.u32 p, {{$r0}}, {smallest_normal:#x};\n"
            "selp.u32 e, e, t, p;\n"
        )
    elif scale_rounding == "floor":
        body = (
            f"shr.u32 e, {{$r0}}, 23;\nsetp.gt.u32 p, e, {fmt.emax};\nsub.u32 e, e, {fmt.emax};\nselp.u32 e, e, 0, p;\n"
        )
    else:
        raise ValueError(scale_rounding)
    code = (
        "{\n.reg .pred p;\n.reg .u32 e, m, t;\n" + body + f"setp.ge.u32 p, {{$r0}}, {F32_INF_BITS:#x};\n"
        "selp.u32 {$w0}, 255, e, p;\n"
        "sub.u32 t, 254, e;\n"
        "shl.b32 t, t, 23;\n"
        f"selp.b32 {{$w1}}, {F32_NAN_BITS:#x}, t, p;\n"
        "}"
    )
    return inline_ptx(code, write_only_types=[Uint32, Uint32], read_only_args=[amax_bits])


# -------------------------------------------------------------------------------- scaling + FP8 convert
def _cvt_suffix(elem_dtype: str) -> str:
    return {"float8_e4m3fn": "e4m3x2", "float8_e5m2": "e5m2x2"}[elem_dtype]


def quantize4_f32(xs, factors, elem_dtype: str) -> Uint32:
    """Four float32 values (as bits) times their power-of-two factors, rounded (RNE, saturating) to FP8,
    packed little-endian into one word. Exact scaling: factors are normal powers of two."""
    cvt = _cvt_suffix(elem_dtype)
    code = (
        "{\n.reg .f32 y0, y1, y2, y3;\n.reg .b16 lo, hi;\n"
        "mul.rn.f32 y0, {$r0}, {$r4};\nmul.rn.f32 y1, {$r1}, {$r5};\n"
        "mul.rn.f32 y2, {$r2}, {$r6};\nmul.rn.f32 y3, {$r3}, {$r7};\n"
        f"cvt.rn.satfinite.{cvt}.f32 lo, y1, y0;\n"
        f"cvt.rn.satfinite.{cvt}.f32 hi, y3, y2;\n"
        "mov.b32 {$w0}, {lo, hi};\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[*xs, *factors])


def quantize4_bf16x2(w0: Uint32, w1: Uint32, factors, elem_dtype: str) -> Uint32:
    """Four bfloat16 values (two packed words, element 0 in w0's low half) scaled and rounded to FP8."""
    cvt = _cvt_suffix(elem_dtype)
    code = (
        "{\n.reg .b32 x0, x1, x2, x3;\n.reg .f32 y0, y1, y2, y3;\n.reg .b16 lo, hi;\n"
        "shl.b32 x0, {$r0}, 16;\nand.b32 x1, {$r0}, 0xFFFF0000;\n"
        "shl.b32 x2, {$r1}, 16;\nand.b32 x3, {$r1}, 0xFFFF0000;\n"
        "mul.rn.f32 y0, x0, {$r2};\nmul.rn.f32 y1, x1, {$r3};\n"
        "mul.rn.f32 y2, x2, {$r4};\nmul.rn.f32 y3, x3, {$r5};\n"
        f"cvt.rn.satfinite.{cvt}.f32 lo, y1, y0;\n"
        f"cvt.rn.satfinite.{cvt}.f32 hi, y3, y2;\n"
        "mov.b32 {$w0}, {lo, hi};\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[w0, w1, *factors])


# ------------------------------------------------------------------------------------------ dequantize
def fp8x4_to_f32(word: Uint32, elem_dtype: str) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """Four FP8 values (little-endian in one word) to float32 bit patterns (exact)."""
    cvt = _cvt_suffix(elem_dtype)
    code = (
        "{\n.reg .b16 lo, hi, h0, h1, h2, h3;\n.reg .b32 p0, p1;\n"
        "mov.b32 {lo, hi}, {$r0};\n"
        f"cvt.rn.f16x2.{cvt} p0, lo;\n"
        f"cvt.rn.f16x2.{cvt} p1, hi;\n"
        "mov.b32 {h0, h1}, p0;\nmov.b32 {h2, h3}, p1;\n"
        "cvt.f32.f16 {$w0}, h0;\ncvt.f32.f16 {$w1}, h1;\n"
        "cvt.f32.f16 {$w2}, h2;\ncvt.f32.f16 {$w3}, h3;\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32] * 4, read_only_args=[word])


def decode_factors(scale_byte: Uint32) -> tuple[Uint32, Uint32, Uint32]:
    """For E8M0 byte b: float32 bits of 2**e1 and 2**(e - e1) with e = b - 127, e1 = floor(e / 2) (both
    normal, like formats.scales.mul_pow2), and an all-ones mask when b == 0xFF (NaN block), else 0."""
    code = (
        "{\n.reg .s32 e, e1, e2;\n.reg .pred p;\n"
        "sub.s32 e, {$r0}, 127;\n"
        "shr.s32 e1, e, 1;\n"
        "sub.s32 e2, e, e1;\n"
        "add.s32 e1, e1, 127;\nadd.s32 e2, e2, 127;\n"
        "shl.b32 {$w0}, e1, 23;\nshl.b32 {$w1}, e2, 23;\n"
        "setp.eq.u32 p, {$r0}, 255;\n"
        "selp.b32 {$w2}, -1, 0, p;\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32] * 3, read_only_args=[scale_byte])


def shift_factor(shift_byte: Uint32) -> Uint32:
    """float32 bits of the realignment factor for a signed exponent shift s (two's complement in the low
    byte): 2**s for -126 <= s <= 0, 0 for s < -126 (the element drops below E4M3's range), 1 for s > 0
    (never produced by the producer pass; it leaves the element as it is)."""
    code = (
        "{\n.reg .s32 s, f;\n.reg .pred lo, hi;\n"
        "shl.b32 s, {$r0}, 24;\nshr.s32 s, s, 24;\n"
        "setp.lt.s32 lo, s, -126;\nsetp.gt.s32 hi, s, 0;\n"
        "add.s32 f, s, 127;\nshl.b32 f, f, 23;\n"
        "selp.b32 f, 0x3f800000, f, hi;\n"
        "selp.b32 {$w0}, 0, f, lo;\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[shift_byte])


def dequant1(x: Uint32, f1: Uint32, f2: Uint32, nan_mask: Uint32, sat_bits: int) -> Uint32:
    """float32 bits of x * 2**e1 * 2**e2 (two roundings-free multiplies while the result is normal,
    the same sequence as formats.scales.mul_pow2), saturated to +-sat where x is finite and the product's
    magnitude exceeds sat (`sat_bits`: the float32 pattern of the output dtype's largest finite value,
    formats.scales.saturation_bound; the product may reach 2**128 = inf), NaN where nan_mask is set.

    The comparisons are on magnitude bit patterns (integer order = float order for non-NaN values); a NaN
    element (its product NaN) or an Inf element (E5M2) fails `x finite` and passes through unchanged,
    exactly as formats.scales.saturate does."""
    code = (
        "{\n.reg .f32 y;\n.reg .b32 ay, ax, s;\n.reg .pred p, q;\n"
        "mul.rn.f32 y, {$r0}, {$r1};\nmul.rn.f32 y, y, {$r2};\n"
        "and.b32 ay, y, 0x7FFFFFFF;\n"
        f"setp.gt.u32 p, ay, {sat_bits:#x};\n"
        "and.b32 ax, {$r0}, 0x7FFFFFFF;\n"
        f"setp.lt.u32 q, ax, {F32_INF_BITS:#x};\n"
        "and.pred p, p, q;\n"
        "and.b32 s, y, 0x80000000;\n"
        f"or.b32 s, s, {sat_bits:#x};\n"
        "selp.b32 y, s, y, p;\n"
        "setp.ne.u32 p, {$r3}, 0;\n"
        f"selp.b32 {{$w0}}, {F32_NAN_BITS:#x}, y, p;\n}}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[x, f1, f2, nan_mask])


def pack_bf16x2_rn(y0: Uint32, y1: Uint32) -> Uint32:
    """Two float32 bit patterns rounded (RNE) to bfloat16, y0 in the low half."""
    return inline_ptx("cvt.rn.bf16x2.f32 {$w0}, {$r1}, {$r0};", write_only_types=[Uint32], read_only_args=[y0, y1])


def pack_f16x2_rn(y0: Uint32, y1: Uint32) -> Uint32:
    """Two float32 bit patterns rounded (RNE) to float16, y0 in the low half (beyond float16's range: +-inf, so
    the caller saturates first)."""
    return inline_ptx("cvt.rn.f16x2.f32 {$w0}, {$r1}, {$r0};", write_only_types=[Uint32], read_only_args=[y0, y1])


# ------------------------------------------------------------------------------------- float32 arithmetic
# IEEE round-to-nearest float32 operations on bit patterns (no .ftz, no contraction into FMA: each call
# is one rounding, in the order the caller writes them).
def f32_from_f32(x) -> Uint32:
    """Bit pattern of a Float32 value (kernel argument)."""
    return inline_ptx("mov.b32 {$w0}, {$r0};", write_only_types=[Uint32], read_only_args=[x])


def bf16_lo(w: Uint32) -> Uint32:
    """float32 bits of the bfloat16 in the low half of `w` (exact)."""
    return w << 16


def bf16_hi(w: Uint32) -> Uint32:
    """float32 bits of the bfloat16 in the high half of `w` (exact)."""
    return w & _u32(0xFFFF0000)


def f32_sum_squares(acc: Uint32, xs) -> Uint32:
    """acc + x0*x0 + x1*x1 + ... evaluated left to right, each product and sum rounded separately."""
    n = len(xs)
    body = "".join(f"mul.rn.f32 t, {{$r{i + 1}}}, {{$r{i + 1}}};\nadd.rn.f32 a, a, t;\n" for i in range(n))
    code = "{\n.reg .f32 a, t;\nmov.b32 a, {$r0};\n" + body + "mov.b32 {$w0}, a;\n}"
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[acc, *xs])


def f32_sum_scaled_squares(acc: Uint32, xs, scale: float) -> Uint32:
    """acc + (x0*c)*(x0*c) + (x1*c)*(x1*c) + ... left to right with c = float32(scale) (a PTX immediate),
    each product and sum rounded separately."""
    c = f"0f{_f32_bits(scale):08X}"
    step = "mul.rn.f32 t, {{$r{}}}, " + c + ";\nmul.rn.f32 t, t, t;\nadd.rn.f32 a, a, t;\n"
    body = "".join(step.format(i + 1) for i in range(len(xs)))
    code = "{\n.reg .f32 a, t;\nmov.b32 a, {$r0};\n" + body + "mov.b32 {$w0}, a;\n}"
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[acc, *xs])


def f32_add(a: Uint32, b: Uint32) -> Uint32:
    return inline_ptx("add.rn.f32 {$w0}, {$r0}, {$r1};", write_only_types=[Uint32], read_only_args=[a, b])


def f32_mul_const(a: Uint32, scale: float) -> Uint32:
    """a * float32(scale) (a PTX immediate), one IEEE float32 multiply."""
    return inline_ptx(
        f"mul.rn.f32 {{$w0}}, {{$r0}}, 0f{_f32_bits(scale):08X};", write_only_types=[Uint32], read_only_args=[a]
    )


def rms_rsqrt(sum_sq: Uint32, d: Int32, eps: Uint32) -> Uint32:
    """rsqrt(sum_sq * float32(1 / d) + eps) the way XLA's GPU backend computes the reference's
    rsqrt(mean(x * x) + eps) (seen on the H200, jax 0.11.2): the algebraic simplifier turns the
    division by the constant D into a multiply by float32(1 / D) (rcp.rn here: the same correctly
    rounded constant), the eps add is a separate IEEE add (no FMA contraction: an FMA here was
    measured to differ from XLA's y in 7-17% of elements on exact-sum inputs), and lax.rsqrt on
    float32 is the hardware reciprocal square root (rsqrt.approx.f32)."""
    code = (
        "{\n.reg .f32 n, q, m;\n"
        "cvt.rn.f32.s32 n, {$r1};\n"
        "rcp.rn.f32 q, n;\n"
        "mul.rn.f32 m, {$r0}, q;\n"
        "add.rn.f32 m, m, {$r2};\n"
        "rsqrt.approx.f32 {$w0}, m;\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[sum_sq, d, eps])


def f32_scale3(x: Uint32, r: Uint32, s: Uint32, w: Uint32) -> Uint32:
    """((x * r) * s) * w, three IEEE float32 multiplies (s = 1.0 makes it exactly (x * r) * w)."""
    return inline_ptx(
        "{\n.reg .f32 t;\nmul.rn.f32 t, {$r0}, {$r1};\nmul.rn.f32 t, t, {$r2};\nmul.rn.f32 {$w0}, t, {$r3};\n}",
        write_only_types=[Uint32],
        read_only_args=[x, r, s, w],
    )
