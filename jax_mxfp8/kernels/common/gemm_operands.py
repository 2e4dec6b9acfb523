"""The Hopper MX GEMM's operand producer (CuTe DSL): MX quantize + align128 in one pass, AOT for sm_90a / sm_100a.

Supported features (kernels/registry/gemm_operands.py): x (G, R, C) row-major bfloat16 / float32, R and C
multiples of 32; per orientation, exactly align128(formats.quantize(x, axis, dtype, scale_rounding)):
  "row": blocks along C -> data (G, R, Cp) FP8, scale (G, Cp/128, R) float32
  "col": blocks along R, written TRANSPOSED (K-major for wgmma) -> data (G, C, Rp), scale (G, Rp/128, C)
  "both": the four outputs from one read of x.
Cp, Rp: C, R rounded up to 128; padding elements are +0 (reference/gemm_align.py has the numerics).
Host call (2-D row-major views, leading axes flattened, 16-byte aligned):
  x (G*R, C), row data (G*R, Cp), row scale (G*Cp/128, R), col data (G*C, Rp), col scale (G*Rp/128, C)
  "both": (x, row data, row scale, col data, col scale, stream); "row" / "col": (x, data, scale, stream).

Design (memory-bound). One CTA of 4 warps per 128 x 128 tile (grid Cp/128 x Rp/128 x G). Warp w owns
rows 32w .. 32w+31 of the tile; lane l of band l // 16 holds 16 rows (16 * band ..) of 8 columns: one
16-byte load per row for bf16 (columns 8 * (l % 16) ..), two for float32 (columns 4 * (l % 16) .. and
64 + 4 * (l % 16) .., each load instruction still contiguous across the band). All loads are issued first.
  Row blocks: amax over the thread's elements, butterfly over the lanes of the 32-column block (block
  exponent e_b, the contract's scale rule: kernels/common/ptx.py), then over all 16 lanes of the band: the
  128-run's amax. The scale rule is monotonic in amax (NaN/Inf patterns give 255), so E = max e_b is the
  rule applied to the run amax: no exponent traffic. Elements: q = RNE(x * 2^(127 - e_b)) as in the
  quantize kernel, then requant4 (RNE(q * 2^(e_b - E)), exact outside subnormals). Row data: 8 bytes per
  lane and row; row scale: one float per lane (row 16 * band + l % 16, picked by selects), 128
  contiguous bytes per warp.
  Column blocks: amax over the thread's 16 rows and a butterfly across the two bands (32-row block);
  the 128-run along R spans the 4 warps: each warp puts its 128 column amaxes in shared memory (2 KiB),
  one barrier, every thread maxes the 4. The column data is transposed in registers: the thread's 16
  rows x 8 columns of FP8 become 8 x 16 bytes by 4x4 byte transposes (prmt), so each lane stores 16
  contiguous bytes of an output row (c, rows ..) and the two bands fill whole 32-byte sectors; a shared-
  memory byte transpose (attention_realign's way) would cost 16 shared loads per 16 bytes instead.
  Edges: rows >= R and columns >= C load as zeros (they cannot raise a run's amax), so the padding of
  the outputs comes out as +0; row outputs are not stored for rows >= R, column outputs not for
  columns >= C.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from jax_mxfp8.kernels.common import ptx, ptx_align
from jax_mxfp8.kernels.registry.gemm_operands import GemmOperandsConfig

_IN_TYPES = {"bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}
_FP8_TYPES = {"float8_e4m3fn": cutlass.Float8E4M3FN, "float8_e5m2": cutlass.Float8E5M2}
TILE = 128
WARPS = 4
ROWS = 16  # rows per thread (lanes per band)


class GemmOperands:
    """One pass over x (G, R, C): contract MX quantization + align128 in the "row" and/or "col" orientation."""

    def __init__(self, config: GemmOperandsConfig):
        self.config = config
        self.elem = config.elem_dtype
        self.bf16 = config.in_dtype == "bfloat16"
        self.in_bytes = 2 if self.bf16 else 4
        self.vec = 16 // self.in_bytes  # elements per 16-byte load
        self.nch = 8 // self.vec  # loads per thread and row (8 columns per thread)
        self.group = 32 // self.vec  # lanes sharing a 32-column block
        self.do_row = config.orientations in ("row", "both")
        self.do_col = config.orientations in ("col", "both")

    # ------------------------------------------------------------------------------------------ host
    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        def t(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)

        s = cute.sym_int32
        fp8 = _FP8_TYPES[self.elem]
        args = [t(_IN_TYPES[self.config.in_dtype], (s(divisibility=32), s(divisibility=32)))]
        for on in (self.do_row, self.do_col):
            if on:
                args += [t(fp8, (s(), s(divisibility=TILE))), t(cutlass.Float32, (s(), s(divisibility=32)))]
        return (*args, make_fake_stream())

    def tensor_names(self) -> tuple[str, ...]:
        names = ["x"]
        if self.do_row:
            names += ["row_data", "row_scale"]
        if self.do_col:
            names += ["col_data", "col_scale"]
        return tuple(names)

    def entry(self):
        return self.launch_both if self.config.orientations == "both" else self.launch_single

    @cute.jit
    def launch_both(self, mX: cute.Tensor, mRD: cute.Tensor, mRS: cute.Tensor, mCD: cute.Tensor,
                    mCS: cute.Tensor, stream: cuda.CUstream):  # fmt: skip
        self._launch(mX, mRD, mRS, mCD, mCS, stream)

    @cute.jit
    def launch_single(self, mX: cute.Tensor, mD: cute.Tensor, mS: cute.Tensor, stream: cuda.CUstream):
        self._launch(mX, mD, mS, mD, mS, stream)

    def _launch(self, mX, mRD, mRS, mCD, mCS, stream):
        g, r, c = self._dims(mX, mRS, mCD)
        grid = [(c + (TILE - 1)) // TILE, (r + (TILE - 1)) // TILE, g]
        bounds = {}
        if cutlass.const_expr(self.config.min_ctas_per_sm > 0):
            # an explicit carveout (percent of the SM's shared memory; 25% holds many CTAs' 3 KiB) also keeps the
            # DSL from querying a device at compile time
            bounds = dict(
                max_number_threads=[32 * WARPS, 1, 1],
                min_blocks_per_mp=self.config.min_ctas_per_sm,
                preferred_smem_carveout=25,
            )
        self.kernel(mX, mRD, mRS, mCD, mCS).launch(grid=grid, block=[32 * WARPS, 1, 1], stream=stream, **bounds)

    def _dims(self, mX, mRS, mCD):
        """(G, R, C) from the views: R is the row scale's width ("row"/"both"), else G = col rows / C."""
        c = Int32(mX.shape[1])
        if cutlass.const_expr(self.do_row):
            r = Int32(mRS.shape[1])
            g = Int32(mX.shape[0]) // r
        else:
            g = Int32(mCD.shape[0]) // c
            r = Int32(mX.shape[0]) // g
        return g, r, c

    # ---------------------------------------------------------------------------------------- device
    @cute.kernel
    def kernel(self, mX: cute.Tensor, mRD: cute.Tensor, mRS: cute.Tensor, mCD: cute.Tensor, mCS: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        kt, rt, g = cute.arch.block_idx()
        sbase = Int32(0)
        if cutlass.const_expr(self.do_col):
            smem = cute.arch.alloc_smem(cutlass.Uint8, WARPS * TILE * 4, alignment=16)
            sbase = smem.toint()
        _, r, c = self._dims(mX, mRS, mCD)
        lane = Int32(tidx) % 32
        warp = Int32(tidx) // 32
        co = dict(
            g=Int64(g),
            r=r,
            c=c,
            kt=Int32(kt),
            rt=Int32(rt),
            warp=warp,
            band=lane // 16,
            li=lane % 16,
            row0=Int32(rt) * TILE + warp * 32 + (lane // 16) * ROWS,  # the thread's first row (within g)
            sbase=sbase,
        )
        # tile-local columns of the thread's loads: chunk h covers tcol[h] .. tcol[h] + vec - 1
        co["tcol"] = [h * 16 * self.vec + co["li"] * self.vec for h in range(self.nch)]
        regs = self._load(mX, co)
        if cutlass.const_expr(self.do_row):
            self._row_pass(regs, mRD, mRS, co)
        if cutlass.const_expr(self.do_col):
            self._col_pass(regs, mCD, mCS, co)

    def _load(self, mX, co) -> list:
        """regs[i][h]: the 4 words of row row0 + i, chunk h (zeros outside R x C)."""
        c64 = Int64(co["c"])
        regs = []
        for i in range(ROWS):
            row = []
            for h in range(self.nch):
                col = co["kt"] * TILE + co["tcol"][h]
                ok = (co["row0"] + i < co["r"]) & (col < co["c"])
                off = (co["g"] * Int64(co["r"]) + Int64(co["row0"] + i)) * c64 + Int64(col)
                row.append(list(ptx.ld_global_v4_pred(mX.iterator.toint() + off * self.in_bytes, ok)))
            regs.append(row)
        return regs

    def _abs_max(self, words):
        """Sign-cleared in-thread max of 4 words: bf16 pairs (u16x2) or float32 patterns."""
        if cutlass.const_expr(self.bf16):
            m = ptx._u32(0x7FFF7FFF)
            a = [w & m for w in words]
            return ptx.max_u16x2(ptx.max_u16x2(a[0], a[1]), ptx.max_u16x2(a[2], a[3]))
        m = ptx._u32(0x7FFFFFFF)
        a = [w & m for w in words]
        return ptx.max_u32(ptx.max_u32(a[0], a[1]), ptx.max_u32(a[2], a[3]))

    def _quantize4(self, words, half: int, factors):
        """Quantizes 4 elements of a row's chunk (bf16: words 2*half, 2*half + 1; f32: the chunk) to one word."""
        if cutlass.const_expr(self.bf16):
            return ptx.quantize4_bf16x2(words[2 * half], words[2 * half + 1], factors, self.elem)
        return ptx.quantize4_f32(words, factors, self.elem)

    def _requant_factors(self, af):
        """requant4's factors for 4 elements with align factors af[0..3]."""
        if cutlass.const_expr(self.elem == "float8_e4m3fn"):
            return [ptx_align.pack_halves(af[0], af[1]), ptx_align.pack_halves(af[2], af[3])]
        return list(af)

    # ------------------------------------------------------------------------------------------ rows
    def _row_amaxes(self, regs):
        """Per row i: ([block amax bits of chunk h], run amax bits), each as float32 patterns."""
        out = []
        if cutlass.const_expr(self.bf16):
            for i in range(0, ROWS, 2):  # two rows per shuffle (bf16 halves)
                t0, t1 = self._abs_max(regs[i][0]), self._abs_max(regs[i + 1][0])
                blk = ptx.max_u16x2(ptx.prmt(t0, t1, 0x5410), ptx.prmt(t0, t1, 0x7632))
                s = 1
                while s < self.group:
                    blk = ptx.max_u16x2(blk, ptx.shfl_bfly(blk, s))
                    s *= 2
                run = blk
                while s < 16:
                    run = ptx.max_u16x2(run, ptx.shfl_bfly(run, s))
                    s *= 2
                hi = ptx._u32(0xFFFF0000)
                out.append(([blk << 16], run << 16))
                out.append(([blk & hi], run & hi))
            return out
        for i in range(ROWS):
            blks = []
            for h in range(self.nch):
                b = self._abs_max(regs[i][h])
                s = 1
                while s < self.group:
                    b = ptx.max_u32(b, ptx.shfl_bfly(b, s))
                    s *= 2
                blks.append(b)
            run = blks[0]
            for b in blks[1:]:
                run = ptx.max_u32(run, b)
            s = self.group
            while s < 16:
                run = ptx.max_u32(run, ptx.shfl_bfly(run, s))
                s *= 2
            out.append((blks, run))
        return out

    def _row_pass(self, regs, mRD, mRS, co):
        cfg = self.config
        r64 = Int64(co["r"])
        cp = Int64(mRD.shape[1])
        sbits = []
        for i, (blks, run) in enumerate(self._row_amaxes(regs)):
            e_run, _ = ptx.scale_and_factor(run, self.elem, cfg.scale_rounding)
            sbits.append(ptx_align.run_scale_bits(e_run))
            words = []
            for h, amax in enumerate(blks):
                b, f = ptx.scale_and_factor(amax, self.elem, cfg.scale_rounding)
                fac = self._requant_factors([ptx_align.align_factor(e_run, b, self.elem)] * 4)
                for half in range(2 if self.bf16 else 1):
                    q = self._quantize4(regs[i][h], half, [f] * 4)
                    words.append(ptx_align.requant4(q, fac, self.elem))
            row = co["row0"] + i
            base = mRD.iterator.toint() + (co["g"] * r64 + Int64(row)) * cp + Int64(co["kt"] * TILE)
            if cutlass.const_expr(self.bf16):
                ptx.st_global(base + Int64(co["tcol"][0]), words, pred=row < co["r"])
            else:
                for h in range(self.nch):
                    ptx.st_global(base + Int64(co["tcol"][h]), [words[h]], pred=row < co["r"])
        # row scale (G, Cp/128, R): lane l of the band writes row 16 * band + l
        v = sbits[0]
        for i in range(1, ROWS):
            v = cutlass.select_(co["li"] == i, sbits[i], v)
        nct = Int64(mRD.shape[1] // TILE)
        row = co["row0"] + co["li"]
        addr = mRS.iterator.toint() + ((co["g"] * nct + Int64(co["kt"])) * r64 + Int64(row)) * 4
        ptx.st_global(addr, [v], pred=row < co["r"])

    # --------------------------------------------------------------------------------------- columns
    def _col_amaxes(self, regs) -> list:
        """The 32-row block amax (float32 patterns) of the thread's 8 columns, in thread-column order
        (tc = 4 * u + e: bf16 columns tcol + tc; f32 chunk u, column tcol[u] + e)."""
        vmax = ptx.max_u16x2 if self.bf16 else ptx.max_u32
        mask = ptx._u32(0x7FFF7FFF if self.bf16 else 0x7FFFFFFF)
        out = []
        for h in range(self.nch):
            cm = [regs[0][h][j] & mask for j in range(4)]
            for i in range(1, ROWS):
                cm = [vmax(cm[j], regs[i][h][j] & mask) for j in range(4)]
            cm = [vmax(w, ptx.shfl_bfly(w, 16)) for w in cm]  # the other band: the 32-row block
            for w in cm:
                if cutlass.const_expr(self.bf16):
                    out += [w << 16, w & ptx._u32(0xFFFF0000)]
                else:
                    out.append(w)
        return out

    def _tile_col(self, co, tc: int):
        """Tile-local column of thread column tc."""
        if cutlass.const_expr(self.bf16):
            return co["tcol"][0] + tc
        return co["tcol"][tc // 4] + tc % 4

    def _col_pass(self, regs, mCD, mCS, co):
        cfg = self.config
        amax = self._col_amaxes(regs)
        # the 128-run along R spans the CTA's 4 warps: run amax through shared memory [warp][128 columns]
        sb = co["sbase"]
        for u in range(2):
            addr = sb + (co["warp"] * TILE + self._tile_col(co, 4 * u)) * 4
            ptx_align.st_shared_v4(addr, amax[4 * u : 4 * u + 4], pred=co["band"] == 0)
        cute.arch.barrier()
        run = list(amax)
        for w in range(WARPS):
            for u in range(2):
                vals = ptx_align.ld_shared_v4(sb + (w * TILE + self._tile_col(co, 4 * u)) * 4)
                for e in range(4):
                    run[4 * u + e] = ptx.max_u32(run[4 * u + e], vals[e])
        fs, af, ebits = [], [], []
        for tc in range(8):
            b, f = ptx.scale_and_factor(amax[tc], self.elem, cfg.scale_rounding)
            e_run, _ = ptx.scale_and_factor(run[tc], self.elem, cfg.scale_rounding)
            fs.append(f)
            af.append(ptx_align.align_factor(e_run, b, self.elem))
            ebits.append(ptx_align.run_scale_bits(e_run))
        c64 = Int64(co["c"])
        rp = Int64(mCD.shape[1])
        col0 = co["kt"] * TILE
        out_row = Int64(co["row0"])  # rows row0 .. row0 + 15 of the transposed output
        for u in range(2):
            fac = self._requant_factors(af[4 * u : 4 * u + 4])
            q = []
            for i in range(ROWS):
                words = regs[i][0] if self.bf16 else regs[i][u]
                q.append(ptx_align.requant4(self._quantize4(words, u, fs[4 * u : 4 * u + 4]), fac, self.elem))
            cols = [[None] * 4 for _ in range(4)]  # cols[e][ig]: column 4u + e, rows 4 ig .. 4 ig + 3
            for ig in range(4):
                t = ptx_align.transpose4x4(q[4 * ig : 4 * ig + 4])
                for e in range(4):
                    cols[e][ig] = t[e]
            for e in range(4):
                col = col0 + self._tile_col(co, 4 * u + e)
                addr = mCD.iterator.toint() + (co["g"] * c64 + Int64(col)) * rp + out_row
                ptx.st_global(addr, cols[e], pred=col < co["c"])
        # column scale (G, Rp/128, C): warp 0, band 0 writes the tile's 128 columns
        nrt = Int64(mCD.shape[1] // TILE)
        for u in range(2):
            col = col0 + self._tile_col(co, 4 * u)
            addr = mCS.iterator.toint() + ((co["g"] * nrt + Int64(co["rt"])) * c64 + Int64(col)) * 4
            ok = (co["warp"] == 0) & (co["band"] == 0) & (col < co["c"])
            ptx.st_global(addr, ebits[4 * u : 4 * u + 4], pred=ok)
