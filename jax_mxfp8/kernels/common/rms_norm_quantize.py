"""Fused RMSNorm + MX quantize (CuTe DSL), compiled ahead of time for sm_90a and sm_100f.

Supported features (kernels/registry/, RMSNormQuantizeConfig):
  x: 2-D (M, D) row-major bfloat16 or float32 (leading axes flattened into M by the handler), D a
  multiple of 32 and at most max_threads * chunks * V (V = 16 / sizeof(x): 32768 for bf16, 16384 for
  f32 with the defaults); weight: float32 (D,) (viewed as (1, D)); eps: float32 kernel argument.
  Outputs, in one pass over x:
    y      = ((x32 * r) * s) * w32 with r = rsqrt(sum(x32 * x32) / D + eps) and s = 1, rounded to x's
             dtype (RNE; the exact float32 steps below); a row of finite values whose float32 sum of
             squares overflows (+Inf) takes the reference's scaled branch (reference/rms_norm.py inv_rms):
             r = rsqrt(sum((x32 c)^2) / D + (eps c) c), s = c = 2^-80, the sum in the same order (a
             uniform branch: every thread of the CTA holds the same sum; kept only if the scaled sum is
             finite, i.e. the row holds no Inf);
    data   = quantize(y) in row blocks of 32 along D (float8_e4m3fn / float8_e5m2, "up" / "floor"),
    scale  = (M, D / 32) E8M0 bytes, or for the blocked variants (RMSNormQuantizeBlockedConfig, Blackwell) the
             same bytes in the 128x4 blocked layout (formats/blocked_scales.py) of x viewed as (G, R, D):
             a 2-D (G, Rt * Dt * 512) view of (G, ceil(R/128), ceil(D/128), 512), R = M / G (the handler
             zero-fills it first: this kernel writes the real bytes, the padding stays 0),
  where quantize takes the ROUNDED y, so (data, scale) is bit-identical to
  jax_mxfp8.formats.quantize(y_kernel, axis=-1). Zero blocks give scale 0, blocks with NaN/Inf 0xFF.

Numerics against the XLA reference (jax_mxfp8.reference.rms_norm.rms_norm_quantize_fwd): every
float32 operation after the sum of squares follows what XLA's GPU backend makes of the reference (seen
in its optimized HLO on the H200, jax 0.11.2: the division by D becomes a multiply by the constant
float32(1/D); on exact-sum inputs XLA's y matched a host emulation of m = (sum * float32(1/D)) + eps
with two IEEE roundings, not a fused multiply-add): m = sum * float32(1/D) + eps (mul.rn, add.rn), r =
rsqrt.approx.f32(m) (lax.rsqrt), y = (x32 * r) * w32, RNE to x's dtype. The sum of squares is a
float32 sum in this kernel's order (sequential per thread over its 16-byte vectors, then butterflies
over the warp and over the warps), which differs from XLA's reduction order; y can therefore differ
from the reference in the last bit (one bf16 ulp for bf16 outputs) where the two sums differ and y
lies near a rounding boundary. Where the float32 sum is exact (e.g. small integers), y is
bit-identical. tests/rms_norm/test_rms_norm_quantize_gpu.py checks both, and that the MXArray equals
quantize(y_kernel) exactly in every case.

Design (memory-bound): one CTA per row, T = roundup32(ceil(D / (V * chunks))) threads. Thread t holds
the 16-byte vectors at columns (c * T + t) * V for c < chunks (predicated loads: zeros past D) in
registers, so x is read from DRAM once. Sum of squares per thread, butterfly over the warp, one float
per warp through shared memory, a second butterfly (every thread ends with the same bits; the overflow
branch repeats this on the registers with the scaled squares, x is not read again), then per
vector: weight (L1-cached loads), y, its bf16/f32 store, the block amax over the G = 32 / V lanes of a
32-column block (sign-cleared bit patterns, integer max), the E8M0 scale, FP8 conversion and stores
(FP8 8 or 4 bytes per lane, coalesced; one scale byte per block).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.registry import RMSNormQuantizeBlockedConfig, RMSNormQuantizeConfig
from jax_mxfp8.reference.rms_norm import ROW_RESCALE

_IN_TYPES = {"bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}
_FP8_TYPES = {"float8_e4m3fn": cutlass.Float8E4M3FN, "float8_e5m2": cutlass.Float8E5M2}


class RMSNormQuantize:
    """Host call (2-D row-major, 16-byte aligned): (x, weight (1, D) f32, y, data, scale, eps, stream)."""

    def __init__(self, config: RMSNormQuantizeConfig):
        self.config = config
        self.in_bytes = 2 if config.in_dtype == "bfloat16" else 4
        self.vec = 16 // self.in_bytes
        self.group = 32 // self.vec
        self.chunks = config.chunks
        self.blocked = isinstance(config, RMSNormQuantizeBlockedConfig)

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        c = self.config
        m = cute.sym_int32()
        d = cute.sym_int32(divisibility=32)
        d32 = cute.sym_int32()

        def t(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)

        in_t = _IN_TYPES[c.in_dtype]
        return (
            t(in_t, (m, d)),
            t(cutlass.Float32, (cute.sym_int32(), d)),  # weight (1, D); dynamic rows keep the struct 2-D
            t(in_t, (m, d)),
            t(_FP8_TYPES[c.elem_dtype], (m, d)),
            t(cutlass.Uint8, (cute.sym_int32(), cute.sym_int32(divisibility=512)) if self.blocked else (m, d32)),
            Float32(1e-6),
            make_fake_stream(),
        )

    def tensor_names(self) -> tuple[str, ...]:
        return ("x", "weight", "y", "data", "scale")

    def entry(self):
        return self.launch

    @cute.jit
    def launch(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mY: cute.Tensor,
        mQ: cute.Tensor,
        mS: cute.Tensor,
        eps: Float32,
        stream: cuda.CUstream,
    ):
        m = mX.shape[0]
        d = mX.shape[1]
        nvec = d // self.vec
        threads = ((nvec + (self.chunks - 1)) // self.chunks + 31) // 32 * 32
        grid = [m, 1, 1]
        if cutlass.const_expr(self.blocked):  # (R, G): a CTA knows its (g, r) without a division
            grid = [m // mS.shape[0], mS.shape[0], 1]
        self.kernel(mX, mW, mY, mQ, mS, eps).launch(
            grid=grid,
            block=[threads, 1, 1],
            max_number_threads=[self.config.max_threads, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, eps: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        nthr, _, _ = cute.arch.block_dim()
        smem = cute.arch.alloc_smem(cutlass.Float32, 32)
        tidx, row, nthr, sbase = Int32(tidx), Int32(row), Int32(nthr), smem.toint()
        if cutlass.const_expr(self.blocked):
            _, g, _ = cute.arch.block_idx()
            rows, _, _ = cute.arch.grid_dim()
            self.row_in_group = (Int32(g), row, Int32(rows))  # (g, r, R), read by _blocked_scale_row
            row = Int32(g) * Int32(rows) + row
        d = mX.shape[1]
        cols, valid, words = self._load_row(mX, row, tidx, nthr)
        total = self._cta_sum(self._sum_squares(words, None), tidx, nthr, sbase)
        r = ptx.rms_rsqrt(total, d, ptx.f32_from_f32(eps))
        s = ptx._u32(ptx._f32_bits(1.0))  # y = ((x * r) * s) * w: s = 1 unless the sum of squares overflowed
        # a row of finite values whose x * x sum overflowed: the reference's scaled formula (inv_rms). The
        # branch is uniform: every thread of the CTA holds the same total, bit for bit
        if total == ptx._u32(ptx.F32_INF_BITS):
            r, s = self._rescaled_inv_rms(words, r, s, d, eps, tidx, nthr, sbase)
        self._normalize_quantize_store(mW, mY, mQ, mS, d, row, tidx, cols, valid, words, r, s)

    def _values(self, ws):
        """float32 bit patterns of a 16-byte vector's V elements, in column order."""
        if self.config.in_dtype == "bfloat16":
            out = []
            for w in ws:
                out += [ptx.bf16_lo(w), ptx.bf16_hi(w)]
            return out
        return list(ws)

    def _load_row(self, mX, row, tidx, nthr):
        """The CTA's row into registers: C independent 16-byte loads per thread, zeros past D (trace-time
        Python: loops unroll). Returns (columns, in-bounds predicates, 16-byte words) per chunk."""
        V, C = self.vec, self.chunks
        d = mX.shape[1]
        x_addr = mX.iterator.toint() + Int64(row) * Int64(d) * self.in_bytes
        cols, valid, words = [], [], []
        for k in range(C):
            col = (k * nthr + tidx) * V
            ok = col < d
            cols.append(col)
            valid.append(ok)
            words.append(ptx.ld_global_v4_pred(x_addr + Int64(col) * self.in_bytes, ok))
        return cols, valid, words

    def _sum_squares(self, words, scale: float | None):
        """This thread's float32 sum of x * x (scale None) or of (x * scale) * (x * scale), in column order."""
        acc = Uint32(0)
        for k in range(self.chunks):
            xs = self._values(words[k])
            acc = ptx.f32_sum_squares(acc, xs) if scale is None else ptx.f32_sum_scaled_squares(acc, xs, scale)
        return acc

    def _cta_sum(self, acc, tidx, nthr, sbase):
        """The CTA's sum of every thread's acc: butterfly over the warp, one float per warp through shared
        memory, a second butterfly (every thread ends with the same bits: IEEE add commutes)."""
        lane = tidx % 32
        warp = tidx // 32
        for s in (16, 8, 4, 2, 1):
            acc = ptx.f32_add(acc, ptx.shfl_bfly(acc, s))
        ptx.st_shared_b32(sbase + warp * 4, acc, pred=lane == 0)
        cute.arch.barrier()
        part = ptx.ld_shared_b32(sbase + lane * 4)
        total = cutlass.select_(lane < nthr // 32, part, Uint32(0))
        for s in (16, 8, 4, 2, 1):
            total = ptx.f32_add(total, ptx.shfl_bfly(total, s))
        return total

    def _rescaled_inv_rms(self, words, r, s, d, eps, tidx, nthr, sbase):
        """(r, s) = (rsqrt(sum((x c)^2) / D + (eps c) c), c) with c = ROW_RESCALE (reference/rms_norm.py inv_rms),
        or (r, s) unchanged when the scaled sum is not finite either (a row holding Inf)."""
        acc = self._sum_squares(words, ROW_RESCALE)
        cute.arch.barrier()  # every warp has read the first sum's partials before they are overwritten
        total = self._cta_sum(acc, tidx, nthr, sbase)
        eps_c = ptx.f32_mul_const(ptx.f32_mul_const(ptx.f32_from_f32(eps), ROW_RESCALE), ROW_RESCALE)
        r_c = ptx.rms_rsqrt(total, d, eps_c)
        finite = total < ptx._u32(ptx.F32_INF_BITS)
        c = ptx._u32(ptx._f32_bits(ROW_RESCALE))
        return Uint32(cutlass.select_(finite, r_c, r)), Uint32(cutlass.select_(finite, c, s))

    def _normalize_quantize_store(self, mW, mY, mQ, mS, d, row, tidx, cols, valid, words, r, s):
        """y = ((x * r) * s) * w per element, rounded to x's dtype and stored; quantize the rounded y in
        32-column blocks (trace-time Python: loops unroll)."""
        c = self.config
        V, G, C = self.vec, self.group, self.chunks
        bf16 = c.in_dtype == "bfloat16"
        lane = tidx % 32
        d64 = Int64(d)
        base = Int64(row) * d64  # element offset of the row
        w_addr = mW.iterator.toint()
        y_addr = mY.iterator.toint() + base * self.in_bytes
        q_addr = mQ.iterator.toint() + base
        if self.blocked:
            line, s_byte = self._blocked_scale_row(d)
            s_addr = mS.iterator.toint() + line
        else:
            s_addr = mS.iterator.toint() + Int64(row) * (d64 // 32)
        leader = lane % G == 0
        for k in range(C):
            col, ok = cols[k], valid[k]
            wv = []
            for j in range(V // 4):  # float32 weight: V // 4 16-byte loads
                wv += list(ptx.ld_global_v4_l1(w_addr + Int64(col + 4 * j) * 4, ok))
            xs = self._values(words[k])
            ys = [ptx.f32_scale3(xs[j], r, s, wv[j]) for j in range(V)]
            if bf16:
                out = [ptx.pack_bf16x2_rn(ys[2 * p], ys[2 * p + 1]) for p in range(4)]
                a = [w & ptx._u32(0x7FFF7FFF) for w in out]
                m2 = ptx.max_u16x2(ptx.max_u16x2(a[0], a[1]), ptx.max_u16x2(a[2], a[3]))
                sh = 1
                while sh < G:
                    m2 = ptx.max_u16x2(m2, ptx.shfl_bfly(m2, sh))
                    sh *= 2
                amax = ptx.max_u32(m2 & ptx._u32(0xFFFF), m2 >> 16) << 16
            else:
                out = ys
                a = [w & ptx._u32(0x7FFFFFFF) for w in out]
                amax = ptx.max_u32(ptx.max_u32(a[0], a[1]), ptx.max_u32(a[2], a[3]))
                sh = 1
                while sh < G:
                    amax = ptx.max_u32(amax, ptx.shfl_bfly(amax, sh))
                    sh *= 2
            b, f = ptx.scale_and_factor(amax, c.elem_dtype, c.scale_rounding)
            ptx.st_global(y_addr + Int64(col) * self.in_bytes, out, pred=ok)
            if bf16:
                q = [
                    ptx.quantize4_bf16x2(out[0], out[1], [f] * 4, c.elem_dtype),
                    ptx.quantize4_bf16x2(out[2], out[3], [f] * 4, c.elem_dtype),
                ]
            else:
                q = [ptx.quantize4_f32(out, [f] * 4, c.elem_dtype)]
            ptx.st_global(q_addr + Int64(col), q, pred=ok)
            if self.blocked:
                ptx.st_global_u8(s_addr + s_byte(col // 32), b, pred=ok & leader)
            else:
                ptx.st_global_u8(s_addr + Int64(col // 32), b, pred=ok & leader)

    def _blocked_scale_row(self, d):
        """(address of this row's 16-byte line in column 0 of its 128x4 scale tiles, block -> byte offset): the
        CTA's row is (g, r) of x viewed as (G, R, D) (the grid's y and x); tile (g Rt + r / 128, kb / 4),
        byte (r % 32) 16 + ((r / 32) % 4) 4 + kb % 4."""
        g, r, rows = self.row_in_group
        rt, dt = (rows + 127) // 128, (d + 127) // 128
        line = ((Int64(g) * Int64(rt) + Int64(r // 128)) * Int64(dt)) * 512 + Int64((r % 32) * 16 + ((r // 32) % 4) * 4)
        return line, lambda kb: Int64((kb // 4) * 512 + kb % 4)
