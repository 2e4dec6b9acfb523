"""Register-level building blocks of the MX GEMM's quantize epilogue (kernels/sm90/mx_gemm_epilogue.py).

The wgmma accumulator fragment (kernels/sm90/wgmma_fragment.py) gives a thread the columns 2q + v0 + 8 nb
(q = lane % 4) of rows row0 and row0 + 8: one 32-column MX block of one row is 8 values in each of the 4
lanes of a quad (4 groups nb of 2 adjacent columns). Its amax is a max over the thread's 8 values and two
butterfly shuffles within the quad (offsets 1 and 2): no shared memory. The scale byte and the power-of-two
factor are ptx.scale_and_factor, the elements ptx.quantize4_f32: the quantize kernels' exact formula
(bit-identical to jax_mxfp8.quantize). GELU (kernels/common/fp32_math.py gelu_tanh_f32) is jax.nn.gelu's tanh
form, op for op, in float32.
"""

from __future__ import annotations

from cutlass import Uint32
from cutlass.cute.arch import inline_ptx

from jax_mxfp8.kernels.common import ptx

ABS_MASK = 0x7FFFFFFF


def block_scale(values, elem_dtype: str, scale_rounding: str) -> tuple[Uint32, Uint32]:
    """(E8M0 byte, float32 bits of 2**(127 - byte)) of the 32-value block whose 8 values per lane sit in
    `values` (float32 bits) of the 4 lanes of this thread's quad: amax as an unsigned max of |x| bit
    patterns (NaN / Inf patterns are the largest: the block becomes a NaN block, as in the contract)."""
    amax = values[0] & Uint32(ABS_MASK)
    for v in values[1:]:
        amax = ptx.max_u32(amax, v & Uint32(ABS_MASK))
    for offset in (1, 2):
        amax = ptx.max_u32(amax, ptx.shfl_bfly(amax, offset))
    return ptx.scale_and_factor(amax, elem_dtype, scale_rounding)


def pair_exchange(word: Uint32, odd: Uint32) -> Uint32:
    """Quad lanes q, q ^ 1 swap halves of their FP8 words for groups (u, u + 1): word = [P(q, u), P(q, u + 1)]
    (16-bit pairs of columns 8u + 2q, 8(u + 1) + 2q). An even lane returns [P(q, u), P(q + 1, u)] (columns
    8u + 2q .. + 3), an odd lane [P(q - 1, u + 1), P(q, u + 1)] (columns 8(u + 1) + 2q - 2 .. + 3): 4
    contiguous bytes each, one shfl.bfly(1)."""
    code = (
        "{\n.reg .pred p;\n.reg .b32 s, r, e, o;\n"
        "setp.ne.u32 p, {$r1}, 0;\n"
        "shr.b32 s, {$r0}, 16;\n"
        "selp.b32 s, {$r0}, s, p;\n"
        "shfl.sync.bfly.b32 r, s, 1, 31, -1;\n"
        "prmt.b32 e, {$r0}, r, 0x5410;\n"
        "prmt.b32 o, r, {$r0}, 0x7610;\n"
        "selp.b32 {$w0}, o, e, p;\n}"
    )
    return inline_ptx(code, write_only_types=[Uint32], read_only_args=[word, odd])
