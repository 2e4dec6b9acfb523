"""Hopper MX GEMM with a quantize epilogue (sm_90a, CuTe DSL): the output leaves as MX row blocks along N.

Supported features (kernels/registry/gemm_epilogue.py, MXGemmEpilogueConfig):
  everything of kernels/sm90/mx_gemm.py's mainloop (its code, unchanged: this class only replaces the
  epilogue and the output arguments); a, b E4M3 (the registered variants); optional float32 bias (N,);
  optional GELU (tanh form, float32) after the bias; optional bf16 pre-activation output (store_pre).
  Quantized output: E4M3 data (G, M, N) and uint8 E8M0 scales (G, M, N/32), scale_rounding "up".
  store_col (with store_pre): also the column orientation, gemm_operands' "col" form of z (blocks of 32
  along M aligned to one exponent per 128 M, transposed: kernels/sm90/mx_epilogue_col.py).
  Not here: N not a multiple of 32 (the handler and primitives/mx_gemm_epilogue.py refuse it), store_col
  with M not a multiple of 32 (refused likewise), E5M2 output, "floor" scales.

Outputs (2-D row-major views from csrc/mx_gemm_epilogue.cc):
  q    (G*M, N)     float8_e4m3fn    q, s = jax_mxfp8.quantize(z, axis=-1), z the float32 reference output
  s    (G*M, N/32)  uint8
  pre  (G*M, N)     bfloat16         store_pre only: bf16(acc + bias)
  qc   (G*N, Mp)    float8_e4m3fn    store_col only: align128(quantize(z, axis=-2)) transposed, Mp = pad128(M)
  sc   (G*Mp/128, N) float32         store_col only: its run scales
Numerics: z = acc (+ bias) (then gelu) in float32, acc the mainloop's promoted accumulator (the plain
kernel's float32 output bit for bit). Blocks are 32-aligned within the tile (tile_n = 192 = 6 blocks) and N
is a multiple of 32, so every block is wholly inside or wholly outside (M, N): stores are predicated per
row and block.

Per thread (consumer tid; rows row, row + 8; columns col + v0 + 8 nb, col = 2 (lane % 4)): for each row
half and 32-column block, 8 values -> amax over the quad (mx_epilogue.block_scale, 2 shuffles) -> two
quantize4_f32 words (columns 8u + col, u = 0..3, 2 bytes each: four 16-bit stores; with paired_stores
two 32-bit stores after a half-word swap within lane pairs, mx_epilogue.pair_exchange) and one scale byte
(lane % 4 == 0).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int64, Uint8, Uint32

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.common.fp32_math import gelu_tanh_f32
from jax_mxfp8.kernels.common.gemm_schedule import GemmTile
from jax_mxfp8.kernels.registry import MX_EPILOGUE_ELEM, MXGemmEpilogueConfig
from jax_mxfp8.kernels.sm90 import mx_epilogue_col
from jax_mxfp8.kernels.sm90.mx_epilogue import block_scale, pair_exchange
from jax_mxfp8.kernels.sm90.mx_gemm import DTYPES, MXGemmSm90, fake_2d
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords

BLOCK = 32


class MXGemmEpilogueSm90(MXGemmSm90):
    """Host entry: (a, b, sa, sb, [bias], q, s, [pre], stream); see the module docstring for shapes."""

    def __init__(self, config: MXGemmEpilogueConfig):
        super().__init__(config)
        self.q_dtype = DTYPES[MX_EPILOGUE_ELEM]

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_stream

        s = cute.sym_int32
        args = self.fake_inputs()
        args.append(fake_2d(self.q_dtype, s(divisibility=16), s(divisibility=BLOCK)))  # q (G*M, N)
        args.append(fake_2d(Uint8, s(divisibility=16), s()))  # s (G*M, N/32)
        if self.config.store_pre:
            args.append(fake_2d(self.c_dtype, s(divisibility=16), s(divisibility=BLOCK)))  # pre (G*M, N)
        if self.config.store_col:
            args.append(fake_2d(self.q_dtype, s(divisibility=BLOCK), s(divisibility=128)))  # qc (G*N, Mp)
            args.append(fake_2d(Float32, s(), s(divisibility=BLOCK)))  # sc (G*Mp/128, N)
        return (*args, make_fake_stream())

    def tensor_names(self) -> tuple[str, ...]:
        cfg = self.config
        bias = ("bias",) if cfg.has_bias else ()
        col = ("qc", "sc") if cfg.store_col else ()
        return ("a", "b", "sa", "sb", *bias, "q", "s", *(("pre",) if cfg.store_pre else ()), *col)

    def entry(self):
        cfg = self.config
        return {
            (False, False, False): self.launch_mx,
            (True, False, False): self.launch_mx_bias,
            (False, True, False): self.launch_mx_pre,
            (True, True, False): self.launch_mx_bias_pre,
            (False, True, True): self.launch_mx_pre_col,
            (True, True, True): self.launch_mx_bias_pre_col,
        }[(cfg.has_bias, cfg.store_pre, cfg.store_col)]

    @cute.jit
    def launch_mx(self, a2: cute.Tensor, b2: cute.Tensor, sa2: cute.Tensor, sb2: cute.Tensor, q2: cute.Tensor,
                  s2: cute.Tensor, stream: cuda.CUstream):  # fmt: skip
        self._launch(a2, b2, sa2, sb2, sb2, (q2, s2), stream)

    @cute.jit
    def launch_mx_bias(self, a2: cute.Tensor, b2: cute.Tensor, sa2: cute.Tensor, sb2: cute.Tensor,
                       bias2: cute.Tensor, q2: cute.Tensor, s2: cute.Tensor, stream: cuda.CUstream):  # fmt: skip
        self._launch(a2, b2, sa2, sb2, bias2, (q2, s2), stream)

    @cute.jit
    def launch_mx_pre(self, a2: cute.Tensor, b2: cute.Tensor, sa2: cute.Tensor, sb2: cute.Tensor, q2: cute.Tensor,
                      s2: cute.Tensor, pre2: cute.Tensor, stream: cuda.CUstream):  # fmt: skip
        self._launch(a2, b2, sa2, sb2, sb2, (q2, s2, pre2), stream)

    @cute.jit
    def launch_mx_bias_pre(self, a2: cute.Tensor, b2: cute.Tensor, sa2: cute.Tensor, sb2: cute.Tensor,
                           bias2: cute.Tensor, q2: cute.Tensor, s2: cute.Tensor, pre2: cute.Tensor,
                           stream: cuda.CUstream):  # fmt: skip
        self._launch(a2, b2, sa2, sb2, bias2, (q2, s2, pre2), stream)

    @cute.jit
    def launch_mx_pre_col(self, a2: cute.Tensor, b2: cute.Tensor, sa2: cute.Tensor, sb2: cute.Tensor,
                          q2: cute.Tensor, s2: cute.Tensor, pre2: cute.Tensor, qc2: cute.Tensor, sc2: cute.Tensor,
                          stream: cuda.CUstream):  # fmt: skip
        self._launch(a2, b2, sa2, sb2, sb2, (q2, s2, pre2, qc2, sc2), stream)

    @cute.jit
    def launch_mx_bias_pre_col(self, a2: cute.Tensor, b2: cute.Tensor, sa2: cute.Tensor, sb2: cute.Tensor,
                               bias2: cute.Tensor, q2: cute.Tensor, s2: cute.Tensor, pre2: cute.Tensor,
                               qc2: cute.Tensor, sc2: cute.Tensor, stream: cuda.CUstream):  # fmt: skip
        self._launch(a2, b2, sa2, sb2, bias2, (q2, s2, pre2, qc2, sc2), stream)

    def _out_views(self, c2, m, n, g):
        """(q (M, N, G), s (M, N/32, G)[, pre (M, N, G)]) over the 2-D output buffers."""
        q = cute.make_tensor(c2[0].iterator, cute.make_layout((m, n, g), stride=(n, 1, m * n)))
        nb = n // BLOCK
        s = cute.make_tensor(c2[1].iterator, cute.make_layout((m, nb, g), stride=(nb, 1, m * nb)))
        if cutlass.const_expr(self.config.store_pre):
            pre = cute.make_tensor(c2[2].iterator, cute.make_layout((m, n, g), stride=(n, 1, m * n)))
            if cutlass.const_expr(self.config.store_col):  # the 2-D buffers (qc (G*N, Mp): Mp = its columns)
                return (q, s, pre, c2[3], c2[4])
            return (q, s, pre)
        return (q, s)

    def _with_epilogue_smem(self, mC):
        """store_col: mC plus the base address of the column epilogue's shared memory (mx_epilogue_col)."""
        if cutlass.const_expr(self.config.store_col):
            nbytes = mx_epilogue_col.smem_bytes(self.tn)
            return (*mC, cute.arch.alloc_smem(Uint8, nbytes, alignment=128).toint())
        return mC

    def _out_tiles(self, mC):
        return super()._out_tiles(mC[2]) if self.config.store_pre else None

    @cute.jit
    def _epilogue(self, main, thr, gC_all, mBias, outs, w: GemmTile, row, col):
        """z = main (+ bias) (-> gelu), quantized in row blocks of 32 along N (module docstring); with
        store_pre the plain epilogue first writes bf16(main + bias) (and leaves main + bias in main)."""
        cfg = self.config
        mQ, mS = outs[0], outs[1]
        m, n = mQ.shape[0], mQ.shape[1]
        if cutlass.const_expr(cfg.store_pre):
            MXGemmSm90._epilogue(self, main, thr, gC_all, mBias, outs[2], w, row, col)  # adds the bias
        elif cutlass.const_expr(cfg.has_bias):
            self._add_bias(main, mBias, w.n_tile * self.tn + col, n)
        z = [ptx.f32_from_f32(main[i]) for i in range(cute.size(main))]
        if cutlass.const_expr(cfg.activation == "gelu"):
            z = [gelu_tanh_f32(x) for x in z]
        n64 = Int64(n)
        nb64 = Int64(n // BLOCK)
        q_base = mQ.iterator.toint()
        s_base = mS.iterator.toint()
        first_row = Int64(w.g) * Int64(m) + Int64(w.m_tile * self.tm + row)  # row of (G*M, N)
        tile_col = w.n_tile * self.tn
        lead = Boolean(col == 0)  # lane % 4 == 0 stores the quad's scale bytes
        odd = Uint32((col // 2) % 2)  # paired_stores: an odd lane of the quad stores 6 bytes further on
        odd_shift = Int64(6 * ((col // 2) % 2))
        # this thread's first column of the tile, in each row half (the blocks add constants)
        row_addr = [q_base + (first_row + 8 * v1) * n64 + Int64(tile_col + col) for v1 in range(2)]
        for v1 in cutlass.range_constexpr(2):
            row_ok = (w.m_tile * self.tm + row + 8 * v1) < m
            r64 = first_row + 8 * v1
            for j in cutlass.range_constexpr(self.tn // BLOCK):
                block_col = tile_col + BLOCK * j
                ok = row_ok & (block_col < n)
                vals = {}
                for u in cutlass.range_constexpr(4):
                    for v0 in cutlass.range_constexpr(2):
                        i = v0 + 2 * v1 + 4 * (4 * j + u)
                        assert acc_coords(i) == (v0, v1, 4 * j + u)
                        vals[(u, v0)] = z[i]
                b, f = block_scale(list(vals.values()), MX_EPILOGUE_ELEM, "up")
                addr = row_addr[v1] + BLOCK * j
                for u in cutlass.range_constexpr(0, 4, 2):
                    xs = [vals[(u, 0)], vals[(u, 1)], vals[(u + 1, 0)], vals[(u + 1, 1)]]
                    word = ptx.quantize4_f32(xs, [f] * 4, MX_EPILOGUE_ELEM)
                    if cutlass.const_expr(cfg.paired_stores):  # 4 contiguous bytes per lane (pair_exchange)
                        ptx.st_global(addr + 8 * u + odd_shift, [pair_exchange(word, odd)], pred=ok)
                    else:
                        ptx.st_global_u16(addr + 8 * u, word & Uint32(0xFFFF), pred=ok)
                        ptx.st_global_u16(addr + 8 * (u + 1), word >> Uint32(16), pred=ok)
                s_addr = s_base + r64 * nb64 + Int64(block_col // BLOCK)
                ptx.st_global_u8(s_addr, b, pred=ok & lead)
        if cutlass.const_expr(cfg.store_col):
            qc2, sc2, sbase = outs[3], outs[4], outs[5]
            mx_epilogue_col.column_epilogue(
                z, sbase, qc2.iterator.toint(), sc2.iterator.toint(), qc2.shape[1], m, n, self.tn, w, row, col
            )


def make_kernel(config: MXGemmEpilogueConfig) -> MXGemmEpilogueSm90:
    return MXGemmEpilogueSm90(config)
