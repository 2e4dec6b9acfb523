"""The dK / dV epilogue of the Blackwell attention backward (kernels/sm100/attention_bwd.py): the compute
warps, after their last step, drain the two accumulators (keys in the TMEM lanes, head_dim columns) once per
CTA.

Thread (warp w, lane l) owns key row r = 32 (w % 4) + l and the head_dim half h = (w - 4) // 4 of both
accumulators, 32 columns per tcgen05.ld. dK = tau acc (mul.rn: the emulation's one multiply after the full
sum over the group's query heads and tiles), dV = acc. A CTA that visited no query tile writes zeros (its
TMEM was never written). Rows past the keys (dense: S; packed: the sequence's kv_len, the next sequence's
rows) are not written.

  dkv "float32"   dk, dv (B, S, K, H) float32: 128 bytes of the row per chunk, 16-byte stores
  dkv "mx"        MXGradient of bfloat16(dk), bfloat16(dv) (ops/attention_grads.py: tokens = b S + s,
                  features = kv H + column; the values rounded to bfloat16 first, as the op's input-dtype
                  gradient): "row" blocks of 32 features = the thread's own 32 values (a local amax:
                  kernels/sm100/epilogue_quantize.row_block_quantize), "col" blocks of 32 tokens = the warp's
                  32 lanes (one integer warp max of |x| bits per column: column_block_scales, NaN / Inf ->
                  0xFF), the data of both in (tokens, features) order; scale rule "up". Needs S % 32 == 0
                  (a column block never spans two batch rows).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64, Uint32

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.sm100 import epilogue_quantize as eq
from jax_mxfp8.kernels.sm100 import float32_ops as f32
from jax_mxfp8.kernels.sm100 import tmem_rows
from jax_mxfp8.kernels.sm100.attention_geometry import BLOCK, TILE


def _bf16_values(vals) -> list[Uint32]:
    """float32 bits of the values rounded (RNE) to bfloat16."""
    out = []
    for k in range(len(vals) // 2):
        word = ptx.pack_bf16x2_rn(vals[2 * k].bitcast(Uint32), vals[2 * k + 1].bitcast(Uint32))
        out += [ptx.bf16_lo(word), ptx.bf16_hi(word)]
    return out


class EpilogueRole:
    """The compute warps' dK / dV epilogue method of AttentionBwdSm100."""

    @cute.jit
    def epilogue(self, ctx, tmem, warp):
        cfg, w, c = self.config, ctx.work, self.cols
        h = cfg.head_dim
        quarter = warp % 4
        half = (warp - 4) // 4
        lane = cute.arch.lane_idx()
        key = w.n * TILE + quarter * 32 + lane
        limit = w.kv_len if cutlass.const_expr(cfg.packed) else ctx.seq_k
        ok = w.valid & (key < limit)
        has = w.steps > 0
        if has:
            cute.arch.mbarrier_wait(ctx.bars.ptr("dkv_full"), 0)
            tmem_rows.fence_after_sync()
        base = Uint32(tmem.toint())
        token = Int64(w.b) * Int64(ctx.seq_k) + Int64(w.k_off + key)
        features = ctx.kv_heads * h
        for name, region, factor in (("dv", "dV", None), ("dk", "dK", ctx.scale)):
            taddr = tmem_rows.lane_addr(base, quarter, c[region]) + Uint32(half * (h // 2))
            row_bytes = []
            for chunk in cutlass.range_constexpr(h // 2 // BLOCK):
                col = half * (h // 2) + BLOCK * chunk
                vals = tmem_rows.load_cols(taddr + Uint32(BLOCK * chunk), BLOCK, Float32)
                if cutlass.const_expr(factor is not None):
                    vals = [f32.mul_rn(v, factor) for v in vals]
                vals = [f32.select_f32(has, v, Float32(0.0)) for v in vals]
                feature = Int64(w.kv * h + col)
                if cutlass.const_expr(cfg.dkv == "float32"):
                    addr = ctx.addrs[name] + (token * Int64(features) + feature) * 4
                    eq.store_words(addr, [v.bitcast(Uint32) for v in vals], ok)
                else:
                    row_bytes.append(self._mx_chunk(ctx, name, _bf16_values(vals), token, feature, features, lane, ok))
            if cutlass.const_expr(cfg.dkv == "mx"):
                # the row's block bytes of this half: features (kv H + half H / 2) / 32 .. (adjacent)
                first = Int64((w.kv * h + half * (h // 2)) // BLOCK)
                addr = ctx.addrs[f"{name}_row_scale"] + token * Int64(features // BLOCK) + first
                if cutlass.const_expr(len(row_bytes) == 2):
                    ptx.st_global_u16(addr, row_bytes[0] | (row_bytes[1] << Uint32(8)), pred=ok)
                else:
                    ptx.st_global_u8(addr, row_bytes[0], pred=ok)

    def _mx_chunk(self, ctx, name, y, token, feature, features, lane, ok):
        """Both MX orientations of one 32 x 32 (token, feature) block of the warp (y: this lane's 32 values,
        float32 bits of bfloat16 numbers): the row data, the column data and the column bytes are stored; the
        row block's byte is returned (stored per row by the caller)."""
        b, words = eq.row_block_quantize(y)
        eq.store_words(ctx.addrs[f"{name}_row"] + token * Int64(features) + feature, words, ok)
        col_bytes, factors = eq.column_block_scales(y)
        col_words = [
            eq.column_block_quantize(y[4 * k : 4 * k + 4], factors[4 * k : 4 * k + 4]) for k in range(BLOCK // 4)
        ]
        eq.store_words(ctx.addrs[f"{name}_col"] + token * Int64(features) + feature, col_words, ok)
        packed = [eq.pack_bytes(col_bytes[4 * k : 4 * k + 4]) for k in range(BLOCK // 4)]
        scale_row = ctx.addrs[f"{name}_col_scale"] + (token // 32) * Int64(features) + feature
        eq.store_words(scale_row, packed, ok & (lane == 0))
        return b
