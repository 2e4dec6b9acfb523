"""Online softmax of the Hopper (sm_90a) MXFP8 attention forward, on wgmma accumulator fragments.

For kernels/sm90/attention_fwd.py (consumer warpgroups; the numerics are in its module docstring and
docs/numerics.md "Hopper attention kernel"): per 64 x 128 tile of S, in registers,
  step       the MX logit scales, the mask, the running row max / sum, P~ (float32, in the tile's P units)
             and acc_O's rescale factor per row
  p_offset   p_scale="block": the tile's P offset (the contract's block scale rule on the row-tile's amax)
  rescale_o  acc_O into the next tile's V (and P) units, skipped when nothing changes
Thread layout: wgmma_fragment.acc_coords; each thread holds rows row0 and row0 + 8 (v1), so per-row state
is a (2,) register tensor and row reductions finish across the 4 lanes of a quad.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from jax_mxfp8.kernels.common.fp32_math import MIN_NORMAL, pow2, softmax_exponent, tree_reduce
from jax_mxfp8.kernels.registry import LOG2_E4M3_MAX, P_CONST_OFFSET, P_OFFSET_MAX, AttentionFwdConfig
from jax_mxfp8.kernels.sm90.attention_mask import AttentionMask
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords


class OnlineSoftmax:
    """Trace-time parameters: the variant's config, its mask, KV tile width tile_n (keys per S tile)."""

    def __init__(self, config: AttentionFwdConfig, mask: AttentionMask, tile_n: int):
        self.config = config
        self.mask = mask
        self.tile_n = tile_n
        self.hg = config.head_dim // 32  # 32-column head-dim groups (one V exponent each)
        self.block_p = config.p_scale == "block"

    @cute.jit
    def p_offset(self, m_use: Float32, tile_max: Float32, prev: Float32) -> Float32:
        """p_scale="block": this row-tile's P offset (P~ is stored as E4M3(P~ * 2^offset)), an integer in
        [8, P_OFFSET_MAX]: the contract's block scale rule applied to the row-tile's amax 2^-d.

        "up": scale 2^ceil(-d - log2 448), offset floor(d + log2 448); "floor": scale 2^(floor(-d) - 8),
        offset 8 + ceil(d). Float rounding of d can pick the finer scale at a boundary: the tile's max then
        lands just above 448 and cvt.rn.satfinite gives 448, the same value the contract's scale gives.
        A fully masked row-tile (tile_max = -inf, so d = +inf; m_use is never -inf) keeps the previous
        offset: nothing to scale, no rescale of acc_O, no inf in the offset. A NaN row (d NaN) gets
        P_OFFSET_MAX from the NaN-quiet min and stays NaN through its P and l.
        """
        d = m_use - tile_max  # >= 0: the tile's largest P~ is 2^-d
        if cutlass.const_expr(self.config.p_rounding == "up"):
            off = cute.math.floor(d + LOG2_E4M3_MAX)
        else:
            off = cute.math.ceil(d) + float(P_CONST_OFFSET)
        off = cute.arch.fmin(off, Float32(P_OFFSET_MAX))  # bounds acc_O (registry.P_OFFSET_MAX)
        return cutlass.select_(tile_max == -Float32.inf, prev, off)

    @cute.jit
    def step(self, acc_s, row_max, row_sum, p_off, q_factor, mKs, bkv, kt0, j, m_tile, row0, col_in_tile, kv_len):
        """Online softmax of one 64 x 128 tile in place: acc_s becomes P~ in this tile's P units (float32;
        256 P~ for p_scale="const", P~ * 2^p_off for "block"); returns acc_O's rescale factor per row.

        row_max, row_sum, p_off: (2,) float32 per-row state (log2-domain max, l in 2^-8 units, P offset),
        updated. q_factor: tau * log2(e) * 2^eQ of the rows' 32-row block; mKs (B*K, Sp/32): 2^eK per 32
        keys. j counts KV tiles from the sequence start (masks); kt0 + j indexes the operands (scales)."""
        tile_n = self.tile_n
        # log2-domain factor per 32-key group: tau * log2(e) * 2^(eQ + eK[g])
        # A product below float32's normal range (a zero query row block, say) flushes to 0, and a masked
        # -inf * 0 would be NaN: use the smallest normal instead (the logits are ~0 either way).
        kg = cute.make_rmem_tensor((tile_n // 32,), Float32)
        for g in cutlass.range_constexpr(tile_n // 32):
            f = q_factor * mKs[bkv, (kt0 + j) * (tile_n // 32) + g]
            kg[g] = cutlass.select_(f == 0.0, Float32(MIN_NORMAL), f)

        self.mask.apply(acc_s, j, m_tile, row0, col_in_tile, kv_len)

        alpha = cute.make_rmem_tensor((2,), Float32)
        for v1 in cutlass.range_constexpr(2):
            # Pairwise trees, not serial chains: the softmax is latency-bound between the wgmmas.
            scaled = []
            for g in cutlass.range_constexpr(tile_n // 32):
                vals = [acc_s[v0 + 2 * v1 + 4 * nb] for nb in range(4 * g, 4 * g + 4) for v0 in range(2)]
                scaled.append(tree_reduce(vals, lambda a, b: cute.arch.fmax(a, b, nan=True)) * kg[g])
            tile_max = tree_reduce(scaled, lambda a, b: cute.arch.fmax(a, b, nan=True))
            for s in cutlass.range_constexpr(1, 3):  # the 4 lanes of a quad share the row
                tile_max = cute.arch.fmax(tile_max, cute.arch.shuffle_sync_bfly(tile_max, offset=s), nan=True)
            m_old = row_max[v1]
            m_new = cute.arch.fmax(m_old, tile_max, nan=True)
            row_max[v1] = m_new
            m_use = m_new
            if m_new == -Float32.inf:
                m_use = Float32(0.0)
            alpha[v1] = cute.math.exp2(m_old - m_use, fastmath=True)
            if cutlass.const_expr(self.block_p):
                offset = self.p_offset(m_use, tile_max, p_off[v1])  # P~ * 2^offset = 2^(t - m + offset)
            else:
                offset = Float32(P_CONST_OFFSET)  # 256 P~ = 2^(t - m + 8)
            ps = []
            for nb in cutlass.range_constexpr(tile_n // 8):
                for v0 in cutlass.range_constexpr(2):
                    i = v0 + 2 * v1 + 4 * nb
                    # t = acc * c_g rounded once, as the max saw it: (t - m) + offset <= offset exactly
                    x = softmax_exponent(acc_s[i], kg[nb // 4], m_use, offset)
                    p = cute.math.exp2(x, fastmath=True)
                    acc_s[i] = p
                    ps.append(p)
            tile_sum = tree_reduce(ps, lambda a, b: a + b)
            if cutlass.const_expr(self.block_p):
                # l stays in 2^-8 units (LSE unchanged); acc_O moves into this tile's P units. Both factors
                # are exact powers of two (offsets are integers in [8, P_OFFSET_MAX]).
                row_sum[v1] = row_sum[v1] * alpha[v1] + tile_sum * pow2(float(P_CONST_OFFSET) - offset)
                alpha[v1] = alpha[v1] * pow2(offset - p_off[v1])
                p_off[v1] = offset
            else:
                row_sum[v1] = row_sum[v1] * alpha[v1] + tile_sum
        return alpha

    @cute.jit
    def rescale_o(self, acc_o, alpha, v_prev, mVs, mVi, bkv, j):
        """acc_O into (operand) KV tile j's V (and P) units: times alpha_row * 2^(eV[j-1] - eV[j]) per 32
        head-dim columns. acc_o: 64 x H accumulator fragment; v_prev (H/32,): 2^eV of the previous tile,
        updated; mVs, mVi (B*K, Sp/128*H/32): 2^eV and 2^-eV per (KV tile, 32 head-dim columns).

        alpha (from step) carries, for p_scale="block", the row's P unit change 2^(off_j - off_{j-1}).
        Skipped (exactly: a multiply by 1.0 changes no bit) when every factor of the warp is 1, i.e. no
        row max moved and the V exponents repeat; this happens on most tiles once the max has settled
        ("const"; with "block" the P offsets of a warp's 16 rows must repeat too).
        """
        factor = cute.make_rmem_tensor((2, self.hg), Float32)
        ones = cutlass.Boolean(True)
        for g in cutlass.range_constexpr(self.hg):
            v_cur = mVs[bkv, j * self.hg + g]
            ratio = v_prev[g] * mVi[bkv, j * self.hg + g]
            v_prev[g] = v_cur
            for v1 in cutlass.range_constexpr(2):
                factor[v1, g] = alpha[v1] * ratio
                ones = ones & (factor[v1, g] == 1.0)
        if not cute.arch.vote_all_sync(ones):
            for i in cutlass.range_constexpr(cute.size(acc_o)):
                _, v1, nb = acc_coords(i)
                acc_o[i] = acc_o[i] * factor[v1, nb // 4]
