"""The attention producer's re-encode + transpose (CuTe DSL), compiled ahead of time for sm_90a.

Supported features (kernels/registry/, AttentionRealignConfig): head_dim 64 or 128; FP8 E4M3 bytes.
  operand "rows" (Q, K):  data  (B, L, N, H) sequence-major (the caller's BTNH layout, square-block MX
                                elements), viewed (B, L*N*H)
                          shift (B, L/32, N, H/32) int8 per 32x32 block, viewed (B, L/32*N*H/32)
                          out   (B, N, Lp, H) head-major, viewed (B*N, Lp*H); Lp = L rounded up to 128
  operand "v":            the same data and shift; out = V'^T (B, N, H, Lp), viewed (B*N, H*Lp), with the
                          keys of every 32-key chunk in registry.pv_permutation() order.
  out[..] = RNE_E4M3(x * 2^shift) for each element x of a block (shift <= 0; 2^shift is 0 below -126 and the
  shift is taken as 0 when positive), exactly primitives.attention_fwd._realign; rows l >= L are written as
  zeros. L must be a multiple of 32 (block rows never straddle sequences).
The exponent arithmetic (e_row, e_tile, V_SPREAD, NaN blocks) stays in XLA on the scale arrays (1/1024 of the
data): this kernel only moves bytes, so that the FP8 transposes run at copy speed instead of XLA's byte-wise
fusions (0.08 ms for Q, 0.22 ms for V at B4 T4k N16 H128, benchmarks/results/h200_attention_producer_b4t4k.json).

Design (memory-bound): one CTA of 128 threads per (128-row tile, head, batch). Each thread converts H/16
16-byte chunks (consecutive threads along a row, so the loads are coalesced within each row and the
head-major stores are fully contiguous), all loads issued before any conversion: 4 x (cvt e4m3x2 ->
f16x2 -> f32, mul by the block's factor, cvt.rn.satfinite back). "v" stages the realigned 128 x H tile in
shared memory (row pitch H + 4 bytes, which spreads the column reads over the banks) and then writes
V'^T rows of 128 keys, each thread gathering 16 keys of one head-dim column in permuted order.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.registry import AttentionRealignConfig, pv_permutation

TILE = 128  # rows (keys) per CTA: the attention kernel's tile
THREADS = 128
E4M3 = "float8_e4m3fn"


class AttentionRealign:
    """Host call (2-D row-major views, 16-byte aligned): (data, shift, out, stream)."""

    def __init__(self, config: AttentionRealignConfig):
        self.config = config
        self.h = config.head_dim
        self.transpose = config.operand == "v"
        self.pitch = self.h + 4  # shared-memory row pitch of the "v" tile (bytes)

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        def t(rows, cols):
            return make_fake_compact_tensor(cutlass.Uint8, (rows, cols), stride_order=(1, 0), assumed_align=16)

        s = cute.sym_int32
        return (
            t(s(), s(divisibility=32 * self.h)),  # data (B, L*N*H)
            t(s(), s()),  # shift (B, L/32*N*H/32)
            t(s(), s(divisibility=TILE * self.h)),  # out (B*N, Lp*H)
            make_fake_stream(),
        )

    def tensor_names(self) -> tuple[str, ...]:
        return ("data", "shift", "out")

    def entry(self):
        return self.launch

    @cute.jit
    def launch(self, mD: cute.Tensor, mS: cute.Tensor, mO: cute.Tensor, stream: cuda.CUstream):
        b = mD.shape[0]
        heads = mO.shape[0] // b
        lp = mO.shape[1] // self.h
        self.kernel(mD, mS, mO).launch(grid=[lp // TILE, heads, b], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mD: cute.Tensor, mS: cute.Tensor, mO: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        tile, head, batch = cute.arch.block_idx()
        sbase = Int32(0)
        if cutlass.const_expr(self.transpose):
            smem = cute.arch.alloc_smem(cutlass.Uint8, TILE * self.pitch, alignment=16)
            sbase = smem.toint()
        self._tile(mD, mS, mO, Int32(tidx), Int32(tile), Int32(head), Int32(batch), sbase)

    def _tile(self, mD, mS, mO, tidx, tile, head, batch, sbase):
        """The CTA's 128 rows (trace-time Python: loops unroll)."""
        h = self.h
        nb = Int32(mD.shape[0])
        heads = Int32(mO.shape[0]) // nb
        row_bytes = heads * h  # one sequence position of all heads
        length = Int32(mD.shape[1]) // row_bytes
        lp = Int32(mO.shape[1]) // h
        d_base = mD.iterator.toint() + Int64(batch) * Int64(mD.shape[1])
        s_base = mS.iterator.toint() + Int64(batch) * Int64(mS.shape[1])
        o_base = mO.iterator.toint() + Int64(batch * heads + head) * Int64(mO.shape[1])
        cpr = h // 16  # 16-byte chunks per row
        # all loads first: the inline-PTX statements keep program order, so interleaving them with the stores
        # would leave one 16-byte load in flight per thread (measured 1.5 TB/s)
        rows, cols, words, shifts = [], [], [], []
        for i in range(cpr):
            idx = i * THREADS + tidx
            r = idx // cpr
            c = idx % cpr
            pos = tile * TILE + r
            pc = cutlass.min(pos, length - 1)  # a valid address for the (discarded) padding rows
            rows.append(r)
            cols.append(c)
            words.append(
                ptx.ld_global_v4_pred(d_base + Int64(pc) * Int64(row_bytes) + Int64(head * h + c * 16), pos < length)
            )
            shifts.append(
                ptx.ld_global_u8(s_base + Int64(pc // 32) * Int64(row_bytes // 32) + Int64(head * (h // 32) + c // 2))
            )
        for i in range(cpr):
            r, c = rows[i], cols[i]
            f = ptx.shift_factor(shifts[i])
            out = [ptx.quantize4_f32(ptx.fp8x4_to_f32(w, E4M3), [f] * 4, E4M3) for w in words[i]]
            if cutlass.const_expr(self.transpose):
                for j in range(4):
                    ptx.st_shared_b32(sbase + r * self.pitch + c * 16 + 4 * j, out[j])
            else:
                ptx.st_global(o_base + Int64(tile * TILE + r) * h + Int64(c * 16), out)
        if cutlass.const_expr(self.transpose):
            cute.arch.barrier()
            self._store_transposed(o_base, lp, tile, tidx, sbase)

    def _store_transposed(self, o_base, lp, tile, tidx, sbase):
        """V'^T rows: thread -> (head-dim column hh, 16 slots kc*16 .. kc*16+15 of the tile's 128 keys)."""
        perm = pv_permutation()
        kc = tidx % 8  # the same for every iteration (THREADS is a multiple of 8)
        second_half = (kc % 2) == 1
        chunk_key = (kc // 2) * 32
        keys = [chunk_key + cutlass.select_(second_half, Int32(perm[16 + u]), Int32(perm[u])) for u in range(16)]
        for i in range(self.h * 8 // THREADS):
            hh = (i * THREADS + tidx) // 8
            b = [ptx.ld_shared_u8(sbase + keys[u] * self.pitch + hh) for u in range(16)]
            words = [ptx.pack_bytes4(b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]) for j in range(4)]
            ptx.st_global(o_base + Int64(hh) * Int64(lp) + Int64(tile * TILE + kc * 16), words)


def make_kernel(config: AttentionRealignConfig) -> AttentionRealign:
    return AttentionRealign(config)
