"""The Hopper MX GEMM's operand producer (CuTe DSL): MX quantize + align128 in one pass, AOT for sm_90a.

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
  Phase 1, exponents only. Row blocks: amax over the thread's elements, butterfly over the lanes of the
  32-column block, the contract's scale rule (kernels/common/ptx.py) -> e_b; the run's E = max e_b by a
  butterfly over the band's 16 lanes on u16x2 pairs (two bf16 rows per shuffle). Column blocks: amax over
  the thread's 16 rows and a butterfly across the two bands (32-row block) -> e_b; the 128-run along R
  spans the 4 warps: u16x2 pairs of e_b through shared memory (1 KiB), one barrier, max of the 4.
  Phase 2, row by row (the input registers die as it goes: ~143 registers for bf16 "both"): q = RNE(x *
  2^(127 - e_b)) as in the quantize kernel, then requant4 (RNE(q * 2^(e_b - E)), exact outside
  subnormals). Row data: 8 bytes per lane and row; row scale: one float per lane (row 16 * band + l % 16,
  picked by selects), 128 contiguous bytes per warp. Column data, transposed in registers: the thread's
  16 rows x 8 columns of FP8 become 8 x 16 bytes by 4x4 byte transposes (prmt), so each lane stores 16
  contiguous bytes of an output row (c, rows ..) and the two bands fill whole 32-byte sectors; a shared-
  memory byte transpose (attention_realign's way) would cost 16 shared loads per 16 bytes instead.
  Edges: rows >= R and columns >= C load as zeros (they cannot raise a run's E: e_b(0) = 0), so the
  padding of the outputs comes out as +0; row outputs are not stored for rows >= R, column outputs not for
  columns >= C. Measured and dropped (docs/perf/journal/perf-notes.md): v1 (block amaxes kept, the row pass before the
  column pass: 217 registers, 0.60 of copy bandwidth for "both"), and persistent CTAs copying the next
  tile into shared memory with cp.async (168 registers with spills, 0.62-0.64).
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
COL_BYTES = WARPS * TILE * 2  # shared memory of the column-run exchange: [warp][64 u16x2 pairs of e_b]


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
        args = [t(_IN_TYPES[self.config.in_dtype], (s(divisibility=32), s(divisibility=32)))]
        for on in (self.do_row, self.do_col):
            if on:
                args += [t(dtype, shape) for dtype, shape in self._output_pair_fakes(s)]
        return (*args, make_fake_stream())

    def _output_pair_fakes(self, s):
        """(dtype, shape) of one orientation's (data, scale) in the AOT signature: data (rows, Kp), scale
        (Kp/128 rows, cols) float32."""
        return (_FP8_TYPES[self.elem], (s(), s(divisibility=TILE))), (cutlass.Float32, (s(), s(divisibility=32)))

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
            # an explicit carveout (percent of the SM's shared memory; 25% holds many CTAs' 1 KiB) also keeps the
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
        bx, by, bz = cute.arch.block_idx()
        _, r, c = self._dims(mX, mRS, mCD)
        sbase = Int32(0)
        if cutlass.const_expr(self.do_col):
            sbase = cute.arch.alloc_smem(cutlass.Uint8, COL_BYTES, alignment=16).toint()
        co = self._coords(tidx, bx, by, bz, r, c, mCD, sbase)
        self._tile(self._load(mX, co), co, mRD, mRS, mCD, mCS)

    def _coords(self, tidx, kt, rt, g, r, c, mCD, sbase) -> dict:
        """The thread's geometry in tile (kt, rt) of batch g (module docstring)."""
        lane = Int32(tidx) % 32
        warp = Int32(tidx) // 32
        li = lane % 16
        row0 = Int32(rt) * TILE + warp * 32 + (lane // 16) * ROWS  # the thread's first row (within g)
        tcol = [h * 16 * self.vec + li * self.vec for h in range(self.nch)]  # tile-local column of chunk h
        co = dict(
            g=Int64(g),
            r=r,
            c=c,
            kt=Int32(kt),
            rt=Int32(rt),
            warp=warp,
            band=lane // 16,
            li=li,
            row0=row0,
            sbase=sbase,
            tcol=tcol,
            # R and C are multiples of 32: a thread's 16 rows (and a chunk's columns) are all in or all out
            row_ok=row0 < r,
            col_ok=[Int32(kt) * TILE + t < c for t in tcol],
        )
        if self.do_col:
            co["nrt"] = Int64(mCD.shape[1] // TILE)
        return co

    def _tile(self, regs, co, mRD, mRS, mCD, mCS) -> None:
        """One 128 x 128 tile from the thread's loaded words."""
        # phase 1: block and run exponents (rows: shuffles in the band; columns: the CTA's 4 warps)
        rows = self._row_exponents(regs) if self.do_row else None
        cols = self._col_exponents(regs, mCS, co) if self.do_col else None
        self._phase2(regs, rows, cols, mRD, mRS, mCD, co)

    def _phase2(self, regs, rows, cols, mRD, mRS, mCD, co) -> None:
        """Row by row, quantize + align (the inputs die row by row), then the transposed column stores and
        the row scales (trace-time Python: loops unroll)."""
        col_words = [[], []]
        for i in range(ROWS):
            if self.do_row:
                self._row_out(regs[i], rows[i], i, mRD, co)
            if self.do_col:
                for u in range(2):
                    words = regs[i][0] if self.bf16 else regs[i][u]
                    q = self._quantize4(words, u, cols["f"][4 * u : 4 * u + 4])
                    col_words[u].append(ptx_align.requant4(q, cols["fac"][u], self.elem))
        if self.do_col:
            self._col_store(col_words, mCD, co)
        if self.do_row:
            self._row_scale_store(rows, mRD, mRS, co)

    def _load(self, mX, co) -> list:
        """regs[i][h]: the 4 words of row row0 + i, chunk h (zeros outside R x C); all loads issued first."""
        stride = Int64(co["c"]) * self.in_bytes
        row = co["g"] * Int64(co["r"]) + Int64(co["row0"])
        x0 = mX.iterator.toint()
        addr = [x0 + (row * Int64(co["c"]) + Int64(co["kt"] * TILE + t)) * self.in_bytes for t in co["tcol"]]
        regs = []
        for _ in range(ROWS):
            regs.append([list(ptx.ld_global_v4_pred(addr[h], co["row_ok"] & co["col_ok"][h])) for h in range(self.nch)])
            addr = [a + stride for a in addr]
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

    def _bfly_max16(self, v, start: int):
        """Max of u16x2 pairs over the lanes l ^ s, s = start .. 8 (powers of two) of the band."""
        s = start
        while s < 16:
            v = ptx.max_u16x2(v, ptx.shfl_bfly(v, s))
            s *= 2
        return v

    # ------------------------------------------------------------------------------------------ rows
    def _row_exponents(self, regs) -> list:
        """Per row i: ([e_b of chunk h], E) as Uint32 values. Block amax: in-thread max, butterfly over the
        block's lanes, the contract's scale rule; E: the max e_b over the band (the run's 4 blocks),
        exchanged as u16x2 pairs (two rows per shuffle for bf16, the two chunks for f32)."""
        c = self.config
        out = []
        lo = ptx._u32(0xFFFF)
        if cutlass.const_expr(self.bf16):
            for i in range(0, ROWS, 2):
                t0, t1 = self._abs_max(regs[i][0]), self._abs_max(regs[i + 1][0])
                blk = ptx.max_u16x2(ptx.prmt(t0, t1, 0x5410), ptx.prmt(t0, t1, 0x7632))
                s = 1
                while s < self.group:
                    blk = ptx.max_u16x2(blk, ptx.shfl_bfly(blk, s))
                    s *= 2
                b0, _ = ptx.scale_and_factor(blk << 16, self.elem, c.scale_rounding)
                b1, _ = ptx.scale_and_factor(blk & ptx._u32(0xFFFF0000), self.elem, c.scale_rounding)
                e = self._bfly_max16(ptx_align.pack_halves(b0, b1), self.group)
                out.append(([b0], e & lo))
                out.append(([b1], e >> 16))
            return out
        for i in range(ROWS):
            bs = []
            for h in range(self.nch):
                a = self._abs_max(regs[i][h])
                s = 1
                while s < self.group:
                    a = ptx.max_u32(a, ptx.shfl_bfly(a, s))
                    s *= 2
                bs.append(ptx.scale_and_factor(a, self.elem, c.scale_rounding)[0])
            e = bs[0]
            for b in bs[1:]:
                e = ptx.max_u32(e, b)
            s = self.group
            while s < 16:
                e = ptx.max_u32(e, ptx.shfl_bfly(e, s))
                s *= 2
            out.append((bs, e))
        return out

    def _row_out(self, words, row, i: int, mRD, co) -> None:
        """Row row0 + i of the row data (G, R, Cp): quantize with e_b, align to E, 8 bytes per lane."""
        bs, e = row
        cp = Int64(mRD.shape[1])
        base = mRD.iterator.toint() + (co["g"] * Int64(co["r"]) + Int64(co["row0"] + i)) * cp + Int64(co["kt"] * TILE)
        out = []
        for h, b in enumerate(bs):
            f = ptx_align.quant_factor(b)
            fac = self._requant_factors([ptx_align.align_factor(e, b, self.elem)] * 4)
            for half in range(2 if self.bf16 else 1):
                out.append(ptx_align.requant4(self._quantize4(words[h], half, [f] * 4), fac, self.elem))
        if cutlass.const_expr(self.bf16):
            ptx.st_global(base + Int64(co["tcol"][0]), out, pred=co["row_ok"])
        else:
            for h in range(self.nch):
                ptx.st_global(base + Int64(co["tcol"][h]), [out[h]], pred=co["row_ok"])

    def _row_scale_store(self, rows, mRD, mRS, co) -> None:
        """Row scale (G, Cp/128, R): lane l of the band writes row 16 * band + l (E picked by selects)."""
        e = rows[0][1]
        for i in range(1, ROWS):
            e = cutlass.select_(co["li"] == i, rows[i][1], e)
        nct = Int64(mRD.shape[1] // TILE)
        row = co["row0"] + co["li"]
        addr = mRS.iterator.toint() + ((co["g"] * nct + Int64(co["kt"])) * Int64(co["r"]) + Int64(row)) * 4
        ptx.st_global(addr, [ptx_align.run_scale_bits(e)], pred=co["row_ok"])

    # --------------------------------------------------------------------------------------- columns
    def _tile_col(self, co, tc: int):
        """Tile-local column of thread column tc = 4 u + e (bf16: tcol + tc; f32: chunk u, column tcol[u] + e)."""
        if cutlass.const_expr(self.bf16):
            return co["tcol"][0] + tc
        return co["tcol"][tc // 4] + tc % 4

    def _col_exponents(self, regs, mCS, co) -> dict:
        """Column blocks: e_b and the quantize factors of the thread's 8 columns, the run exponent E over
        the CTA's 128 rows (u16x2 pairs of e_b through shared memory [warp][64 column pairs], one
        barrier), the align factors; warp 0 also stores the column scale (G, Rp/128, C)."""
        bs, fs = self._col_block_scales(regs)
        pairs = [ptx_align.pack_halves(bs[2 * j], bs[2 * j + 1]) for j in range(4)]
        sb = co["sbase"]
        for u in range(2):
            addr = sb + (co["warp"] * (TILE // 2) + self._tile_col(co, 4 * u) // 2) * 4
            ptx_align.st_shared_v2(addr, pairs[2 * u : 2 * u + 2], pred=co["band"] == 0)
        cute.arch.barrier()
        run = list(pairs)
        for w in range(WARPS):
            for u in range(2):
                vals = ptx.ld_shared_v2(sb + (w * (TILE // 2) + self._tile_col(co, 4 * u) // 2) * 4)
                for j in range(2):
                    run[2 * u + j] = ptx.max_u16x2(run[2 * u + j], vals[j])
        lo = ptx._u32(0xFFFF)
        es = [run[tc // 2] & lo if tc % 2 == 0 else run[tc // 2] >> 16 for tc in range(8)]
        af = [ptx_align.align_factor(es[tc], bs[tc], self.elem) for tc in range(8)]
        c64 = Int64(co["c"])
        first = (co["warp"] == 0) & (co["band"] == 0)  # column scale: warp 0, band 0 writes the 128 columns
        for u in range(2):
            col = co["kt"] * TILE + self._tile_col(co, 4 * u)
            addr = mCS.iterator.toint() + ((co["g"] * co["nrt"] + Int64(co["rt"])) * c64 + Int64(col)) * 4
            bits = [ptx_align.run_scale_bits(es[4 * u + e]) for e in range(4)]
            ptx.st_global(addr, bits, pred=first & co["col_ok"][0 if self.bf16 else u])
        return dict(f=fs, fac=[self._requant_factors(af[4 * u : 4 * u + 4]) for u in range(2)])

    def _col_block_scales(self, regs) -> tuple[list, list]:
        """Column blocks (32 rows: the thread's 16 and the other band's): per thread column tc = 0..7 the
        E8M0 byte and the quantize factor (thread-column order)."""
        c = self.config
        vmax = ptx.max_u16x2 if self.bf16 else ptx.max_u32
        mask = ptx._u32(0x7FFF7FFF if self.bf16 else 0x7FFFFFFF)
        amax = []  # thread-column order tc = 0..7
        for h in range(self.nch):
            cm = [regs[0][h][j] & mask for j in range(4)]
            for i in range(1, ROWS):
                cm = [vmax(cm[j], regs[i][h][j] & mask) for j in range(4)]
            cm = [vmax(w, ptx.shfl_bfly(w, 16)) for w in cm]  # the other band: the 32-row block
            for w in cm:
                if cutlass.const_expr(self.bf16):
                    amax += [w << 16, w & ptx._u32(0xFFFF0000)]
                else:
                    amax.append(w)
        bs, fs = [], []
        for a in amax:
            b, f = ptx.scale_and_factor(a, self.elem, c.scale_rounding)
            bs.append(b)
            fs.append(f)
        return bs, fs

    def _col_store(self, col_words, mCD, co) -> None:
        """Column data (G, C, Rp), transposed in registers: 4x4 byte transposes turn the thread's 16 rows x
        8 columns into 8 x 16 bytes, one 16-byte store per column (the two bands fill 32-byte sectors)."""
        c64 = Int64(co["c"])
        rp = Int64(mCD.shape[1])
        for u in range(2):
            cols = [[None] * 4 for _ in range(4)]  # cols[e][ig]: column 4u + e, rows 4 ig .. 4 ig + 3
            for ig in range(4):
                t = ptx_align.transpose4x4(col_words[u][4 * ig : 4 * ig + 4])
                for e in range(4):
                    cols[e][ig] = t[e]
            ok = self._col_store_ok(co, u)
            for e in range(4):
                col = co["kt"] * TILE + self._tile_col(co, 4 * u + e)
                addr = mCD.iterator.toint() + (co["g"] * c64 + Int64(col)) * rp + Int64(co["row0"])
                ptx.st_global(addr, cols[e], pred=ok)

    def _col_store_ok(self, co, u: int):
        """Whether the thread's column-data stores of half u land inside the output: its columns inside C
        (its rows past R are the zero padding of Rp, stored)."""
        return co["col_ok"][0 if self.bf16 else u]
