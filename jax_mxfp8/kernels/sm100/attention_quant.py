"""MX quantization inside the Blackwell attention kernels (sm_100a / sm_100f): P in the softmax warps, dS in
the backward's compute warps. Called while a CuTe DSL kernel is traced (plain functions, inlined).

  abs_max(values)              max |v| over one thread's Float32 values; NaN if any is NaN (IEEE maximum)
  square_block_amax(amax)      the max over the warp's 32 lanes: the amax of a 32 x 32 block whose rows are
                               the lanes (redux.sync.max.abs.NaN.f32, SASS CREDUX.MAXABS with NaN kept)
  quantize32(values, amax)     32 Float32 values of one block row -> (E8M0 byte, 8 words of packed E4M3)
  p_const_words(values)        P~ (in [0, 1]) -> E4M3(2^8 P~) packed, p_scale="const" (scale byte 0x77)
  P_CONST_SCALE_BYTE           0x77 = 127 - 8: the PV / dV GEMMs' scale byte for p_scale="const"

Numerics (docs/numerics.md; docs/perf/blackwell-attention.md "online P quantization", "dS quantized once"):
the scale byte comes from the amax's float32 bits (kernels/common/ptx.scale_and_factor: the contract's "up"
rule, bit-identical to formats.scales.scale_bits, 0xFF for a block holding NaN or Inf), the elements are the
exact product with 2^(127 - b) rounded by cvt.rn.satfinite (ptx.quantize4_f32): no log2, no division. A NaN
anywhere in a block must give the byte 0xFF, but redux.sync and max.f32 ignore NaN by default (they return the
other operand); both reductions here use the .NaN forms, so a NaN reaches the amax, whose bits (>= 0x7F800000)
select 0xFF.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Uint32
from cutlass.cute.arch import inline_ptx

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.common.fp32_math import tree_reduce
from jax_mxfp8.reference.attention_quant import P_CONST_LOG2

E4M3 = "float8_e4m3fn"
P_CONST_SCALE_BYTE = 127 - P_CONST_LOG2
"""p_scale="const": P is stored as E4M3(2^8 P~) and the GEMM's E8M0 scale byte is 2^-8."""
_P_CONST_FACTOR = f"0f{(127 + P_CONST_LOG2) << 23:08X}"  # 2^8 as a PTX float32 immediate


def abs_max(values: list[Float32]) -> Float32:
    """max |v| over a non-empty list of Float32 values (one thread's share of a block), as a Float32 >= 0, or
    NaN when any value is NaN. Inf gives Inf. A balanced tree of FMNMX.XORSIGN.ABS.NAN: each step returns
    max(|a|, |b|) with a sign of its own, which the next step's |.| and the final one discard."""
    m = tree_reduce(list(values), lambda a, b: cute.arch.fmax(a, b, abs=True, nan=True))
    return cute.arch.fmax(m, m, abs=True, nan=True)


def square_block_amax(thread_amax: Float32) -> Float32:
    """The amax of a 32 x 32 square block held by a full warp, one block row per lane (each lane passes its
    row's abs_max): a warp-wide max with NaN propagated, so a NaN in any row gives NaN (then byte 0xFF)."""
    return cute.arch.warp_redux_sync(thread_amax, "fmax", abs=True, nan=True)


def quantize32(values: list[Float32], amax: Float32) -> tuple[Uint32, list[Uint32]]:
    """One 32-element block row: (E8M0 scale byte b, 8 words of 4 packed E4M3 elements, element i of the row
    in byte i % 4 of word i // 4). amax: the block's amax (abs_max of the row, or square_block_amax for a
    square block). Elements = RNE(satfinite(v * 2^(127 - b))), the contract's "up" quantization bit for bit;
    a NaN / Inf amax gives b = 0xFF and NaN elements, a zero amax b = 0 and zero elements."""
    amax_bits = amax.bitcast(Uint32) & Uint32(0x7FFFFFFF)
    b, factor = ptx.scale_and_factor(amax_bits, E4M3, "up")
    bits = [v.bitcast(Uint32) for v in values]
    words = [ptx.quantize4_f32(bits[4 * w : 4 * w + 4], [factor] * 4, E4M3) for w in range(len(bits) // 4)]
    return b, words


def p_const_words(values: list[Float32]) -> list[Uint32]:
    """P~ values (a multiple of 4 of them, each in [0, 1] or NaN) -> E4M3(2^8 P~) packed 4 per word: the
    exact product with 2^8 (an immediate) rounded by cvt.rn.satfinite (2^8 P~ <= 256 < 448: never saturates;
    NaN stays NaN)."""
    bits = [v.bitcast(Uint32) for v in values]
    return [_times_2p8_to_e4m3x4(bits[4 * w : 4 * w + 4]) for w in range(len(bits) // 4)]


def _times_2p8_to_e4m3x4(xs: list[Uint32]) -> Uint32:
    """Four float32 values (as bits) times 2^8, rounded (RNE, saturating) to E4M3, packed little-endian."""
    code = (
        "{\n.reg .f32 y0, y1, y2, y3;\n.reg .b16 lo, hi;\n"
        f"mul.rn.f32 y0, {{$r0}}, {_P_CONST_FACTOR};\nmul.rn.f32 y1, {{$r1}}, {_P_CONST_FACTOR};\n"
        f"mul.rn.f32 y2, {{$r2}}, {_P_CONST_FACTOR};\nmul.rn.f32 y3, {{$r3}}, {_P_CONST_FACTOR};\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, y1, y0;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, y3, y2;\n"
        "mov.b32 {$w0}, {lo, hi};\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=xs)
