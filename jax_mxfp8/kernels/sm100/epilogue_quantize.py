"""Register-level MX quantize building blocks of Blackwell epilogues (sm_100f; traced in CuTe DSL kernels).

An epilogue thread owns one accumulator row (TMEM lane) and reads it 32 columns at a time with
tcgen05.ld.32x32b.x32 (SASS LDTM): 32 float32 values of its row. That makes the two MX orientations cheap:

  row blocks (32 along N): the thread's own 32 values ARE the block: amax is a local max of |x| bit
    patterns, no shuffles (row_block_quantize);
  column blocks (32 along M): the 32 rows of a block are the 32 lanes of one warp (warp w holds rows
    32 w .. 32 w + 31 of the tile). Either the warp transposes the 32 x 32 block through shared memory and
    each lane quantizes one column with row_block_quantize (the GEMM's production schedule), or every
    lane keeps its row and each column's amax is one warp-wide `redux.sync.max.u32` (SASS REDUX / CREDUX.MAX
    on the integer path) of the |x| bit patterns (column_block_scales, warp_max_u32: the comparison
    schedule, and the warp-level amax for 32 x 32 square blocks).

NaN handling: amax is the UNSIGNED max of the float32 magnitude bit patterns. NaN patterns (0x7F800001 ..)
order above +Inf (0x7F800000) above every finite value, so a block holding NaN or Inf gets scale 0xFF and NaN
elements (docs/numerics.md). The float reduction redux.sync.max.abs.f32 (SASS CREDUX.MAXABS.F32) would
ignore NaN unless given .NaN; the integer form needs no special case and no vote. The scale byte and factor
are ptx.scale_and_factor, the elements ptx.quantize4_f32: the quantize kernels' formula, bit-identical to
jax_mxfp8.quantize (the emulation, primitives/mx_gemm_sm100_emulation.py, models exactly this).

Never run on a Blackwell GPU: compiled and checked statically (tools/check_sm100.py).
"""

from __future__ import annotations

from cutlass import Boolean, Int64, Uint32
from cutlass.cute.arch import inline_ptx

from jax_mxfp8.kernels.common import ptx

ABS_MASK = 0x7FFFFFFF
ELEM = "float8_e4m3fn"
CHUNK = 32
"""Columns per TMEM load and per MX block."""


def tmem_load_row32(taddr: Uint32) -> list[Uint32]:
    """The 32 float32 bit patterns at TMEM columns taddr .. taddr + 31 of this thread's lane (the warp
    reads its 32 lanes: taddr's lane field must be the warp's lane quarter), waited for (tcgen05.wait::ld)."""
    outs = ", ".join(f"{{$w{i}}}" for i in range(CHUNK))
    code = f"tcgen05.ld.sync.aligned.32x32b.x{CHUNK}.b32 {{{outs}}}, [{{$r0}}];\ntcgen05.wait::ld.sync.aligned;"
    return list(inline_ptx(code, write_only_types=[Uint32] * CHUNK, read_only_args=[taddr]))


def abs_bits(x: Uint32) -> Uint32:
    return x & Uint32(ABS_MASK)


def row_block_quantize(vals: list[Uint32]) -> tuple[Uint32, list[Uint32]]:
    """(E8M0 byte, 8 words of 4 E4M3 bytes in column order) of the 32-value block in `vals` (float32
    bits): amax over the thread's own values, scale_rounding "up", RNE saturating elements."""
    amax = abs_bits(vals[0])
    for v in vals[1:]:
        amax = ptx.max_u32(amax, abs_bits(v))
    b, f = ptx.scale_and_factor(amax, ELEM, "up")
    return b, [ptx.quantize4_f32(vals[4 * i : 4 * i + 4], [f] * 4, ELEM) for i in range(CHUNK // 4)]


def warp_max_u32(x: Uint32) -> Uint32:
    """The unsigned max of x over the 32 lanes of the warp (redux.sync.max.u32), in every lane."""
    return inline_ptx("redux.sync.max.u32 {$w0}, {$r0}, 0xffffffff;", write_only_types=[Uint32], read_only_args=[x])


def column_block_scales(vals: list[Uint32]) -> tuple[list[Uint32], list[Uint32]]:
    """Per column j of (part of) the warp's 32-row block (lane = row, vals[j] = this lane's value of
    column j): (E8M0 bytes, float32 factors 2^(127 - b)), the same in every lane."""
    bytes_, factors = [], []
    for v in vals:
        b, f = ptx.scale_and_factor(warp_max_u32(abs_bits(v)), ELEM, "up")
        bytes_.append(b)
        factors.append(f)
    return bytes_, factors


def column_block_quantize(vals: list[Uint32], factors: list[Uint32]) -> Uint32:
    """One word: this lane's E4M3 elements of 4 columns (byte i for vals[i]), each with its column's factor.
    The bytes go to 4 different rows of the transposed output."""
    return ptx.quantize4_f32(vals, factors, ELEM)


def select_u32(pred: Boolean, a: Uint32, b: Uint32) -> Uint32:
    """pred ? a : b."""
    code = "{\n.reg .pred p;\nsetp.ne.u32 p, {$r0}, 0;\nselp.b32 {$w0}, {$r1}, {$r2}, p;\n}"
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[Uint32(pred), a, b])


def byte_of(word: Uint32, i: int) -> Uint32:
    return (word >> Uint32(8 * i)) & Uint32(0xFF)


def pack_bytes(bs: list[Uint32]) -> Uint32:
    """4 low bytes, little-endian, into one word."""
    return ptx.pack_bytes4(*bs)


def add_bias(vals: list[Uint32], bias_addr: Int64, ok: Boolean) -> list[Uint32]:
    """vals[i] + bias[i] (IEEE float32 adds) for the 32 float32 biases at bias_addr (16-byte aligned; read
    only when ok, else 0 is added: a chunk past N)."""
    out = []
    for q in range(CHUNK // 4):
        words = ptx.ld_global_v4_l1(bias_addr + 16 * q, ok)
        out += [ptx.f32_add(vals[4 * q + i], words[i]) for i in range(4)]
    return out


def pack_out(vals: list[Uint32], out_dtype: str) -> list[Uint32]:
    """The 32 values in out_dtype, packed into words (bfloat16: 16 words, RNE; float32: the 32 words)."""
    if out_dtype == "float32":
        return list(vals)
    return [ptx.pack_bf16x2_rn(vals[2 * i], vals[2 * i + 1]) for i in range(CHUNK // 2)]


def store_words(addr: Int64, words: list[Uint32], ok: Boolean) -> None:
    """len(words) * 4 contiguous bytes at addr (16-byte aligned), 16 bytes per store, when ok."""
    for i in range(len(words) // 4):
        ptx.st_global(addr + 16 * i, words[4 * i : 4 * i + 4], pred=ok)
