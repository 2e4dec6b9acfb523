"""The Blackwell attention forward's correction and epilogue warps (sm_100f, CuTe DSL). CorrectionRole is a
method mixin of kernels/sm100/attention_fwd.AttentionForwardSm100.

Correction warps 8-11 (thread = row r = 32 (warp % 4) + lane of both Q tiles, the TMEM lane quarter of
the warp), per item:
  per KV tile j and Q tile s: wait the softmax's alpha (mbarrier stats_s); for j > 0, when any row of the
    warp has alpha != 1 (vote), O_s *= alpha in TMEM (tcgen05.ld / FMUL / tcgen05.st, 32 columns at a
    time; skipping alpha == 1 is exact); then arrive "P_s ready" (O_s may be accumulated onto). For j = 0
    the arrive says O_s is free: this thread read the previous item's O_s out before (program order).
  epilogue, per s: wait O_s full (the MMA warp's commit after the last PV_s) and the final statistics;
    O = O_acc / l (div.rn.f32, IEEE: the emulation's division), rows >= q_len or l == 0 -> 0 (a NaN l
    propagates), bfloat16 into shared memory (sO_s, the TMA store's 128B-swizzled layout), LSE =
    (m + log2 l) ln 2 (-inf for those rows) stored for rows < the sequence's rows; mbarrier "epi_full_s".
  items with no KV tile (no valid key, or a causal pair past q_len): O = 0 and LSE = -inf on their rows.
Epilogue warp 13: per item and s, wait epi_full_s, TMA store sO_s to O (boxes bounded at the sequence's
end: dense by the batch row's T, packed by the ragged view), then release sO_s once the store has read it.
Never run on hardware.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx
from cutlass.cute.nvgpu import cpasync

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.sm100 import tmem_rows
from jax_mxfp8.kernels.sm100.attention_fwd_config import ITEM_ROWS, Q_STAGES, TILE_M
from jax_mxfp8.kernels.sm100.attention_loads import sequence_tiles

CHUNK = 32
"""O columns per TMEM load of the rescale."""
OUT_CHUNK = 16
"""O columns per TMEM load of the epilogue (the division's temporaries fit the correction warps' budget)."""
LN2 = math.log(2.0)
O_PANEL_COLS = 64
"""bfloat16 columns per 128-byte swizzle panel of sO (the TMA store's SW128 box width)."""


def reciprocal(b: Float32) -> Float32:
    """1 / b to within half an ulp and a hair (MUFU.RCP and one Newton step), for div_rn."""
    return inline_ptx(
        "{\n.reg .f32 y, e;\nrcp.approx.ftz.f32 y, {$r0};\nneg.f32 e, {$r0};\nfma.rn.f32 e, e, y, 0f3F800000;\n"
        "fma.rn.f32 {$w0}, y, e, y;\n}",
        write_only_types=[Float32],
        read_only_args=[b],
    )


def div_rn(a: Float32, b: Float32, rb: Float32) -> Float32:
    """a / b rounded to nearest (the emulation's IEEE division) from rb = reciprocal(b): q = a rb, then one
    residual correction q + (a - b q) rb (both FMAs): the fast path of div.rn.f32, correctly rounded for
    normal operands whose quotient is normal (here b = l >= 1 on every row that has a key). div.rn.f32 itself
    would add a slow-path subroutine call per element (its calling convention costs registers)."""
    return inline_ptx(
        "{\n.reg .f32 q, r, nb;\nmul.rn.f32 q, {$r0}, {$r2};\nneg.f32 nb, {$r1};\nfma.rn.f32 r, nb, q, {$r0};\n"
        "fma.rn.f32 {$w0}, r, {$r2}, q;\n}",
        write_only_types=[Float32],
        read_only_args=[a, b, rb],
    )


def lg2(x: Float32) -> Float32:
    return inline_ptx("lg2.approx.f32 {$w0}, {$r0};", write_only_types=[Float32], read_only_args=[x])


def o_smem_offset(r: Int32, col: int, head_dim: int) -> Int32:
    """Byte offset in one sO tile of the 16 bytes holding columns col .. col + 7 of row r (col % 8 == 0):
    SW128 panels of 64 columns x 128 rows (16 KB each), 16-byte chunk index XOR (r % 8)
    (kernels/sm100/attention_fwd_mma.ForwardMmas.o_smem, byte-level swizzle)."""
    panel, within = divmod(col, O_PANEL_COLS)
    chunk = within // 8
    return Int32(panel * TILE_M * 128) + r * 128 + ((Int32(chunk) ^ (r % 8)) * 16)


class CorrectionRole:
    """Correction warps 8-11 and the epilogue warp 13. Mixin of AttentionForwardSm100."""

    @cute.jit
    def correction_role(self, tmem_base: Uint32, smem: dict, bars: dict, total_items, dims, tables, lse_base: Int64):
        cfg = self.cfg
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        r = (warp % 4) * 32 + cute.arch.lane_idx()
        taddr = tmem_rows.lane_base(tmem_base, warp)
        stats = smem["stats"]
        first, step, total = cute.arch.block_idx()[0], cute.arch.grid_dim()[0], total_items
        tiles = Int32(0)
        mma_items = Int32(0)
        epi_items = Int32(0)
        for idx in cutlass.range(first, total, step, unroll=1):
            it = self.sched.item(idx, dims, tables)
            if it.live:
                if it.n_kv > 0:
                    for j in cutlass.range(it.n_kv, unroll=1):
                        for s in cutlass.range_constexpr(Q_STAGES):
                            tmem_rows.Mbarrier(bars["stats"], s).wait(tiles % 2)
                            tmem_rows.fence_after_sync()  # O_s's last PV is complete (see the module docstring)
                            alpha = stats[r, s, 0]
                            if j > 0:
                                if cute.arch.vote_any_sync(alpha != Float32(1.0)):
                                    self._rescale(taddr + Uint32(cfg.tmem_columns[f"O_{s}"]), alpha)
                            tmem_rows.fence_before_sync()
                            tmem_rows.Mbarrier(bars["p_ready"], s).arrive()
                        tiles += 1
                    for s in cutlass.range_constexpr(Q_STAGES):
                        tmem_rows.Mbarrier(bars["o_full"], s).wait(mma_items % 2)
                        tmem_rows.fence_after_sync()
                        tmem_rows.Mbarrier(bars["final_full"], s).wait(mma_items % 2)
                        lsum, m = stats[r, s, 1], stats[r, s, 2]
                        tmem_rows.Mbarrier(bars["final_empty"], s).arrive()
                        self._epilogue_tile(s, it, r, taddr, lsum, m, True, smem, bars, epi_items, lse_base)
                    mma_items += 1
                else:
                    for s in cutlass.range_constexpr(Q_STAGES):
                        no_acc = (Float32(0.0), Float32(-Float32.inf), False)
                        self._epilogue_tile(s, it, r, taddr, *no_acc, smem, bars, epi_items, lse_base)
                epi_items += 1

    @cute.jit
    def _rescale(self, o_addr: Uint32, alpha: Float32):
        """O_s row *= alpha in TMEM, 32 columns at a time."""
        for c in cutlass.range_constexpr(self.cfg.head_dim // CHUNK):
            vals = tmem_rows.load_cols(o_addr + Uint32(CHUNK * c), CHUNK)
            scaled = [(v.bitcast(Float32) * alpha).bitcast(Uint32) for v in vals]
            tmem_rows.store_cols(o_addr + Uint32(CHUNK * c), scaled)
        tmem_rows.wait_st()

    @cute.jit
    def _epilogue_tile(self, s: int, it, r, taddr, lsum, m, has_acc: bool, smem, bars, epi_items, lse_base):
        """O_s / l -> bfloat16 -> sO_s, LSE -> global, then epi_full_s (module docstring). has_acc (trace
        time): the item ran MMAs (else its rows get O = 0 and LSE = -inf without touching TMEM)."""
        cfg = self.cfg
        tmem_rows.Mbarrier(bars["epi_empty"], s).wait((epi_items % 2) ^ 1)
        row = it.pair * ITEM_ROWS + s * TILE_M + r
        keep = (row < it.q_len) & (lsum != Float32(0.0))
        o_addr = taddr + Uint32(cfg.tmem_columns[f"O_{s}"])
        rl = reciprocal(lsum)
        tile = smem["o_addr"] + s * cfg.o_tile_bytes
        for c in cutlass.range_constexpr(cfg.head_dim // OUT_CHUNK):
            words = [Uint32(0)] * (OUT_CHUNK // 2)  # bfloat16 zeros
            if cutlass.const_expr(has_acc):
                vals = tmem_rows.load_cols(o_addr + Uint32(OUT_CHUNK * c), OUT_CHUNK)
                zero = Float32(0.0)
                outs = [Float32(cutlass.select_(keep, div_rn(v.bitcast(Float32), lsum, rl), zero)) for v in vals]
                bits = [o.bitcast(Uint32) for o in outs]
                words = [ptx.pack_bf16x2_rn(bits[2 * i], bits[2 * i + 1]) for i in range(OUT_CHUNK // 2)]
            for q in cutlass.range_constexpr(OUT_CHUNK // 8):
                ptx.st_shared_v4(tile + o_smem_offset(r, OUT_CHUNK * c + 8 * q, cfg.head_dim), words[4 * q : 4 * q + 4])
        lse = Float32(-Float32.inf)
        if cutlass.const_expr(has_acc):
            lse = Float32(cutlass.select_(keep, (m + lg2(lsum)) * Float32(LN2), -Float32.inf))
        ptx.st_global(lse_base + Int64(it.lse_off + row) * 4, [lse.bitcast(Uint32)], pred=row < it.o.rows)
        tmem_rows.fence_async_shared()
        tmem_rows.Mbarrier(bars["epi_full"], s).arrive()

    @cute.jit
    def epilogue_role(self, tma_o, s_o, bars: dict, total_items, dims, tables):
        """Warp 13: TMA stores of finished O tiles (module docstring)."""
        cfg = self.cfg
        tiler = (TILE_M, cfg.head_dim)
        first, step, total = cute.arch.block_idx()[0], cute.arch.grid_dim()[0], total_items
        epi_items = Int32(0)
        atom, tensor = tma_o
        for idx in cutlass.range(first, total, step, unroll=1):
            it = self.sched.item(idx, dims, tables)
            if it.live:
                g_o = sequence_tiles(tensor, it.o, it.head, tiler, 0, cfg.packed)
                t_s, t_g = cpasync.tma_partition(
                    atom, 0, cute.make_layout(1), cute.group_modes(s_o, 0, 2), cute.group_modes(g_o, 0, 2)
                )
                for s in cutlass.range_constexpr(Q_STAGES):
                    tmem_rows.Mbarrier(bars["epi_full"], s).wait(epi_items % 2)
                    tile = it.pair * Q_STAGES + s
                    if tile * TILE_M < it.o.rows:
                        cute.copy(atom, t_s[None, s], t_g[None, tile])
                    cute.arch.cp_async_bulk_commit_group()
                for s in cutlass.range_constexpr(Q_STAGES):
                    cute.arch.cp_async_bulk_wait_group(Q_STAGES - 1 - s, read=True)
                    tmem_rows.Mbarrier(bars["epi_empty"], s).arrive()
                epi_items += 1
        cute.arch.cp_async_bulk_wait_group(0, read=False)
