"""The Blackwell attention kernels' operand producer (CuTe DSL, sm_100f): square-block MX quantize of one operand
with the scales written straight into the layouts the sm100 attention kernels read. NOT RUN ON HARDWARE
(compiled and checked statically).

What it computes (kernels/registry/attention_operands_sm100.py; the XLA formulation is
primitives/attention_sm100_operands.py, quantize_square + sm100_operand): x (B, L, heads, H) viewed as (B L,
heads H), 32x32 blocks per head, exactly formats.quantize(x, axis=(-3, -1), block="square"):
  data   (B L, heads H) E4M3, x's layout
  sq     (B L/32, heads H/32) u8: the square scales (the MXArray's)
  hd     (B heads, ceil(L/128) 512) u8: per (batch, head) 128-row chunks, row t's byte for K block j at
         (t % 32) 16 + (t % 128 / 32) 4 + j -- the square byte repeated over its 32 rows; j >= H/32 zero
  seq    (B heads, ceil(L/128) 512) u8: rows = the H channels (padded to 128), K blocks = positions / 32:
         channel c's byte for block i at (c % 32) 16 + (c / 32) 4 + i % 4 in chunk i / 4; channels >= H zero
Host call (2-D row-major views, 16-byte aligned): (x, data, sq, hd, seq, stream).

Design: the blocked GEMM producer's CTA (kernels/sm100/blocked_operands.py: one CTA of 4 warps per 128 x 128
tile of the view, warp w the tile's rows 32 w .. 32 w + 31, lane l rows 16 (l / 16) .. of columns 8 (l % 16)
(bf16) or two 4-column chunks (f32)): a square block is one warp's 32 rows of one 32-column block, so its amax
is the thread's 16 rows, the other band (shuffle 16) and the block's lanes (butterfly). The tile is one
(head, chunk) pair for H = 128 and two heads of one chunk for H = 64; its threads write every byte of those
chunks, padding included (rows past L load as zeros: byte 0). Rows and columns past (L, heads H) write no data.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.common.gemm_operands import _FP8_TYPES, _IN_TYPES, ROWS, TILE, WARPS
from jax_mxfp8.kernels.registry.attention_operands_sm100 import AttentionOperandsSm100Config
from jax_mxfp8.kernels.sm100.blocked_operands import SCALE_TILE_BYTES, BlockedOperands


class AttentionOperands(BlockedOperands):
    """One pass over x (B L, heads H): square-block MX quantize, data + square + "hd" + "seq" scales."""

    def __init__(self, config: AttentionOperandsSm100Config):
        super().__init__(config)
        self.head_dim = config.head_dim
        self.kblocks = config.head_dim // 32  # K blocks of one head ("hd"), 32-channel groups ("seq")

    # ------------------------------------------------------------------------------------------ host
    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        def t(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)

        s = cute.sym_int32
        rows, cols = s(divisibility=32), s(divisibility=self.head_dim)
        return (
            t(_IN_TYPES[self.config.in_dtype], (rows, cols)),
            t(_FP8_TYPES[self.elem], (s(), s(divisibility=self.head_dim))),
            t(cutlass.Uint8, (s(), s())),
            t(cutlass.Uint8, (s(), s(divisibility=SCALE_TILE_BYTES))),
            t(cutlass.Uint8, (s(), s(divisibility=SCALE_TILE_BYTES))),
            make_fake_stream(),
        )

    def tensor_names(self) -> tuple[str, ...]:
        return ("x", "data", "sq", "hd", "seq")

    def entry(self):
        return self.launch_attention

    @cute.jit
    def launch_attention(self, mX: cute.Tensor, mD: cute.Tensor, mS: cute.Tensor, mHD: cute.Tensor,
                         mSEQ: cute.Tensor, stream: cuda.CUstream):  # fmt: skip
        g, r, c = self._view_dims(mX, mHD)
        grid = [(c + (TILE - 1)) // TILE, (r + (TILE - 1)) // TILE, g]
        self.attention_kernel(mX, mD, mS, mHD, mSEQ).launch(grid=grid, block=[32 * WARPS, 1, 1], stream=stream)

    def _view_dims(self, mX, mHD):
        """(B, L, heads H) from the views: heads = C / H, B = hd's rows / heads, L = x's rows / B."""
        c = Int32(mX.shape[1])
        g = Int32(mHD.shape[0]) // (c // self.head_dim)
        return g, Int32(mX.shape[0]) // g, c

    # ---------------------------------------------------------------------------------------- device
    @cute.kernel
    def attention_kernel(self, mX: cute.Tensor, mD: cute.Tensor, mS: cute.Tensor, mHD: cute.Tensor,
                         mSEQ: cute.Tensor):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, bz = cute.arch.block_idx()
        _, r, c = self._view_dims(mX, mHD)
        co = self._coords(tidx, bx, by, bz, r, c, mD, Int32(0))
        co["heads"] = Int64(c // self.head_dim)
        co["chunks"] = Int64(mHD.shape[1] // SCALE_TILE_BYTES)
        self._square_tile(self._load(mX, co), co, mD, mS, mHD, mSEQ)

    def _square_tile(self, regs, co, mD, mS, mHD, mSEQ) -> None:
        """One 128 x 128 tile: the square blocks' bytes and factors, the E4M3 rows, the scale bytes
        (trace-time Python: loops unroll)."""
        blocks = self._square_blocks(regs)
        for i in range(ROWS):
            self._row_data(regs[i], blocks, i, mD, co)
        for h in range(self.nch):
            self._scale_bytes(blocks[h][0], h, mS, mHD, mSEQ, co)

    def _square_blocks(self, regs) -> list:
        """Per chunk h: (E8M0 byte, factor) of the thread's square block: the amax over its 16 rows, the other
        band's (shuffle 16) and the block's lanes (butterfly), the contract's scale rule."""
        vmax = ptx.max_u16x2 if self.bf16 else ptx.max_u32
        out = []
        for h in range(self.nch):
            a = self._abs_max(regs[0][h])
            for i in range(1, ROWS):
                a = vmax(a, self._abs_max(regs[i][h]))
            out.append(self._block_scale(vmax(a, ptx.shfl_bfly(a, 16))))
        return out

    def _scale_bytes(self, byte, h: int, mS, mHD, mSEQ, co) -> None:
        """The block's byte: once in the square scales, over its 32 rows in "hd" (each of the block's lanes 16 /
        group rows of its band) and its 32 channels in "seq" (each lane its own columns, band 0); for H = 64 the
        bytes of K blocks / channel groups 2 and 3 are zero padding, written by the same threads."""
        col = co["kt"] * TILE + co["tcol"][h]
        head = Int64(col // self.head_dim)
        j = (col % self.head_dim) // 32
        ok = co["col_ok"][h]
        leader = co["li"] % self.group == 0
        sq_row = co["g"] * Int64(co["r"] // 32) + Int64(co["rt"] * 4 + co["warp"])
        sq = mS.iterator.toint() + sq_row * Int64(co["c"] // 32) + Int64(col // 32)
        ptx.st_global_u8(sq, byte, pred=ok & leader & (co["band"] == 0) & co["row_ok"])
        chunk = ((co["g"] * co["heads"] + head) * co["chunks"] + Int64(co["rt"])) * SCALE_TILE_BYTES
        zero = ptx._u32(0)
        pads = range(self.kblocks, 4, self.kblocks) if self.kblocks < 4 else ()
        per = ROWS // self.group  # "hd" rows per lane of the block
        for q in range(per):
            t = co["band"] * ROWS + (co["li"] % self.group) * per + q  # row within the warp's 32
            line = mHD.iterator.toint() + chunk + Int64(t * 16 + co["warp"] * 4)
            ptx.st_global_u8(line + Int64(j), byte, pred=ok)
            for p in pads:
                ptx.st_global_u8(line + Int64(j + p), zero, pred=ok)
        for e in range(self.vec):
            ch = co["tcol"][h] % 32 + e  # channel within the block's 32
            line = mSEQ.iterator.toint() + chunk + Int64(ch * 16 + co["warp"])
            ptx.st_global_u8(line + Int64(j * 4), byte, pred=ok & (co["band"] == 0))
            for p in pads:
                ptx.st_global_u8(line + Int64((j + p) * 4), zero, pred=ok & (co["band"] == 0))


def make_kernel(config: AttentionOperandsSm100Config) -> AttentionOperands:
    return AttentionOperands(config)


__all__ = ["AttentionOperands", "make_kernel"]
