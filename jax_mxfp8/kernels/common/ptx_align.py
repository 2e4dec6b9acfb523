"""PTX building blocks of align128 (reference/gemm_align.py), for the GEMM operand producer kernel.

All on raw 32-bit registers, no `.ftz`, no division (like kernels/common/ptx.py, whose MX scale rule the
producer reuses). The exactness argument of the re-rounding is in `requant4`.
"""

from __future__ import annotations

from cutlass import Boolean, Int32, Uint32
from cutlass.cute.arch import inline_ptx

F32_NAN_BITS = 0x7FC00000
F32_TINY_BITS = 0x00400000  # 2^-127 (float32 subnormal)


def st_shared_v2(addr: Int32, words, pred: Boolean | None = None) -> None:
    """8 bytes (8-byte aligned) to shared memory."""
    inline_ptx("st.shared.v2.b32 [{$r0}], {{$r1}, {$r2}};", read_only_args=[addr, *words], predicate=pred)


def run_scale_bits(e: Uint32) -> Uint32:
    """float32 bits of 2^(e - 127) for an E8M0 byte e: e << 23, 0x00400000 (subnormal 2^-127) for e = 0,
    0x7FC00000 (NaN) for e = 255 (reference/gemm_align.py, scale_f32)."""
    code = (
        "{\n.reg .pred p, z;\n.reg .u32 t;\n"
        "shl.b32 t, {$r0}, 23;\n"
        "setp.eq.u32 z, {$r0}, 0;\n"
        f"selp.b32 t, {F32_TINY_BITS:#x}, t, z;\n"
        "setp.eq.u32 p, {$r0}, 255;\n"
        f"selp.b32 {{$w0}}, {F32_NAN_BITS:#x}, t, p;\n}}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[e])


def quant_factor(e: Uint32) -> Uint32:
    """float32 bits of the quantize factor 2^(127 - e) for a block's E8M0 byte e (NaN for e = 255): the
    second result of ptx.scale_and_factor, recomputed from the byte (e <= 247 for finite blocks)."""
    code = (
        "{\n.reg .pred p;\n.reg .u32 t;\n"
        "sub.u32 t, 254, {$r0};\nshl.b32 t, t, 23;\n"
        "setp.eq.u32 p, {$r0}, 255;\n"
        f"selp.b32 {{$w0}}, {F32_NAN_BITS:#x}, t, p;\n}}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[e])


def align_factor(e_run: Uint32, e_block: Uint32, elem_dtype: str) -> Uint32:
    """The factor 2^-(e_run - e_block) (e_run >= e_block) that requant4 multiplies by.

    E4M3: float16 bits in the low half: normal for d <= 14, subnormal 2^-d for 15 <= d <= 24, 0 beyond
    (the product is then below 448 * 2^-25 < 2^-16 and rounds to a signed zero either way).
    E5M2: float32 bits: 2^-d for d <= 126, 0 beyond (|q| < 2^16: the product rounds to a signed zero).
    """
    if elem_dtype == "float8_e4m3fn":
        code = (
            "{\n.reg .pred p;\n.reg .u32 d, t, n, s, one;\n"
            "sub.u32 d, {$r0}, {$r1};\n"
            "sub.u32 t, 15, d;\nshl.b32 n, t, 10;\n"
            "mov.u32 one, 1;\nsub.u32 t, 24, d;\nshl.b32 s, one, t;\n"  # t > 31 (d > 24) shifts everything out
            "setp.le.u32 p, d, 14;\n"
            "selp.b32 {$w0}, n, s, p;\n}"
        )
    elif elem_dtype == "float8_e5m2":
        code = (
            "{\n.reg .pred p;\n.reg .u32 d, t;\n"
            "sub.u32 d, {$r0}, {$r1};\n"
            "sub.u32 t, 127, d;\nshl.b32 t, t, 23;\n"
            "setp.le.u32 p, d, 126;\n"
            "selp.b32 {$w0}, t, 0, p;\n}"
        )
    else:
        raise ValueError(elem_dtype)
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[e_run, e_block])


def pack_halves(lo: Uint32, hi: Uint32) -> Uint32:
    """Low 16 bits of lo and of hi as one word (lo in the low half)."""
    return inline_ptx("prmt.b32 {$w0}, {$r0}, {$r1}, 0x5410;", write_only_types=[Uint32], read_only_args=[lo, hi])


def requant4(word: Uint32, factors, elem_dtype: str) -> Uint32:
    """Four FP8 elements (one word, element 0 in the low byte) times their align factors, re-rounded (RNE,
    satfinite) to the same format: align128's data' = RNE(q * 2^(e_b - E)).

    E4M3 runs in float16 (factors: two f16x2 words, for elements (0, 1) and (2, 3)): q and q * 2^-d are
    exact in float16 whenever the product is >= 2^-21 (4 significant bits, float16 resolution 2^-24), and
    smaller products round to a signed zero in E4M3 (half its smallest subnormal is 2^-10) from either value,
    so the single float16 -> E4M3 rounding is the reference's rounding of the exact product.
    E5M2 runs in float32 (factors: four float32 words; its shifts reach 2^-33 with non-zero results, out of
    float16's range). A zero shift gives back the same bytes (the round trip is exact, NaN stays NaN).
    """
    if elem_dtype == "float8_e4m3fn":
        code = (
            "{\n.reg .b16 lo, hi;\n.reg .b32 h0, h1;\n"
            "mov.b32 {lo, hi}, {$r0};\n"
            "cvt.rn.f16x2.e4m3x2 h0, lo;\ncvt.rn.f16x2.e4m3x2 h1, hi;\n"
            "mul.rn.f16x2 h0, h0, {$r1};\nmul.rn.f16x2 h1, h1, {$r2};\n"
            "cvt.rn.satfinite.e4m3x2.f16x2 lo, h0;\ncvt.rn.satfinite.e4m3x2.f16x2 hi, h1;\n"
            "mov.b32 {$w0}, {lo, hi};\n}"
        )
        assert len(factors) == 2
    elif elem_dtype == "float8_e5m2":
        code = (
            "{\n.reg .b16 lo, hi, h0, h1, h2, h3;\n.reg .b32 p0, p1;\n.reg .f32 y0, y1, y2, y3;\n"
            "mov.b32 {lo, hi}, {$r0};\n"
            "cvt.rn.f16x2.e5m2x2 p0, lo;\ncvt.rn.f16x2.e5m2x2 p1, hi;\n"
            "mov.b32 {h0, h1}, p0;\nmov.b32 {h2, h3}, p1;\n"
            "cvt.f32.f16 y0, h0;\ncvt.f32.f16 y1, h1;\ncvt.f32.f16 y2, h2;\ncvt.f32.f16 y3, h3;\n"
            "mul.rn.f32 y0, y0, {$r1};\nmul.rn.f32 y1, y1, {$r2};\n"
            "mul.rn.f32 y2, y2, {$r3};\nmul.rn.f32 y3, y3, {$r4};\n"
            "cvt.rn.satfinite.e5m2x2.f32 lo, y1, y0;\ncvt.rn.satfinite.e5m2x2.f32 hi, y3, y2;\n"
            "mov.b32 {$w0}, {lo, hi};\n}"
        )
        assert len(factors) == 4
    else:
        raise ValueError(elem_dtype)
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[word, *factors])


def transpose4x4(a):
    """Byte transpose of four words: out[e] byte k = a[k] byte e (8 prmt)."""

    def prmt(x, y, sel):
        return inline_ptx(
            f"prmt.b32 {{$w0}}, {{$r0}}, {{$r1}}, {sel:#x};", write_only_types=[Uint32], read_only_args=[x, y]
        )

    lo01, hi01 = prmt(a[0], a[1], 0x5140), prmt(a[0], a[1], 0x7362)
    lo23, hi23 = prmt(a[2], a[3], 0x5140), prmt(a[2], a[3], 0x7362)
    return [prmt(lo01, lo23, 0x5410), prmt(lo01, lo23, 0x7632), prmt(hi01, hi23, 0x5410), prmt(hi01, hi23, 0x7632)]
