"""MX quantize / dequantize kernels (CuTe DSL), compiled ahead of time for sm_90a and sm_100f.

Supported features (see kernels/registry/ for the variant list):
  MXQuantize:   2-D (M, K) row-major bfloat16 or float32 input, M and K multiples of 32, any size up to
                2**31 - 1 per dimension (64-bit addressing). One pass over the input produces
                  "rowcol": row-wise MXArray (blocks of 32 along K; data (M, K), scale (M, K/32)) AND
                            column-wise MXArray (blocks of 32 along M; data (M, K), scale (M/32, K)),
                  "row" / "col": one of the two,
                  "square": 32x32 blocks (data (M, K), scale (M/32, K/32)).
                Elements float8_e4m3fn or float8_e5m2; scale_rounding "up" or "floor"; round to nearest
                even with saturation. Zero blocks give scale 0 and zeros; blocks holding Inf/NaN give
                scale 0xFF and NaN elements. Bit-identical to jax_mxfp8.formats.quantize.
  MXDequantize: 2-D (M, K) FP8 data with row / col / square scales to bfloat16 or float32, bit-identical
                to jax_mxfp8.formats.dequantize (scaling by two normal powers of two, no subnormal divide;
                finite values beyond the output dtype's range saturate to its largest finite value).
Not supported here (the XLA reference handles them): stochastic rounding, float16 input, strided or
non-2-D layouts (the primitive reshapes leading axes away), dimensions that are not multiples of 32.

Design (memory-bound; numerics: docs/numerics.md):
  Each warp owns a tile of 32 rows x (R * V) columns, V = 16 bytes / sizeof(input) (8 for bf16, 4 for
  f32), R = rows_per_thread (16 by default). The warp is split into 32/R bands of R lanes; lane l of
  band b holds rows [b*R, b*R + R) of columns [l*V, l*V + V): R independent 16-byte loads, fully
  coalesced (each band reads R * 16 contiguous bytes of a row). Column amax (blocks along M) is a
  per-thread reduction over the R registers and a butterfly across the bands; row amax (blocks along
  K) is a reduction over V values and a butterfly across the G = 32/V lanes that share a 32-column
  block (two rows' bf16 amaxes are packed in one shuffle). Amax is taken on sign-cleared bit patterns
  with integer max (no FTZ; NaN/Inf detected as patterns >= 0x7F800000). Outputs: FP8 rows stored as
  8- (bf16) or 4-byte (f32) vectors per lane, coalesced; column scales as V contiguous bytes per lane;
  row scales as single bytes spread over the G lanes of a block. No shared memory, no block-level
  synchronisation.

  v2 (production for "rowcol" and "row", row_scale_store="smem"): a CTA owns a strip of 32 rows x
  (warps x tiles_per_warp) tiles along K (1024 columns for the production variants); at step i its
  warps quantize adjacent tiles as above, but each row-scale byte goes to shared memory, and after one
  barrier the CTA writes the strip's row scales as 8-byte words (32 bytes = one whole sector per row).
  v1 wrote every sector of the row-scale array in 4-byte pieces from 8 different warps, which cost
  ~11 points of copy bandwidth on the H200 (docs/perf/removed-variants.md). Byte stores remain where K/32 is not
  a multiple of 8 and at the right edge of K.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import numpy as np
from cutlass import Boolean, Int32, Int64

from jax_mxfp8.formats.scales import saturation_bound
from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.registry import DequantizeConfig, QuantizeConfig

_IN_TYPES = {"bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}
_OUT_TYPES = {**_IN_TYPES, "float16": cutlass.Float16}  # dequantize's outputs
_FP8_TYPES = {"float8_e4m3fn": cutlass.Float8E4M3FN, "float8_e5m2": cutlass.Float8E5M2}


class MXQuantize:
    """One-pass MX quantize of a 2-D array; `config` fixes dtype, mode, element format and rounding.

    Host call (all tensors 2-D row-major, device pointers 16-byte aligned):
      rowcol: (x, row_data, row_scale, col_data, col_scale, stream)
      row:    (x, row_data, row_scale, stream)
      col:    (x, col_data, col_scale, stream)
      square: (x, sq_data, sq_scale, stream)
    """

    def __init__(self, config: QuantizeConfig):
        self.config = config
        self.in_bytes = 2 if config.in_dtype == "bfloat16" else 4
        self.vec = 16 // self.in_bytes  # elements of one row per lane
        self.group = 32 // self.vec  # lanes sharing one 32-column block
        self.rows = config.rows_per_thread  # lanes per row segment == rows per thread (32 / rows bands)
        self.tile_cols = self.rows * self.vec  # columns per warp tile
        self.warps = config.warps_per_cta
        self.do_row = config.mode in ("rowcol", "row")
        self.do_col = config.mode in ("rowcol", "col")
        self.do_square = config.mode == "square"
        self.staged = config.row_scale_store == "smem"
        self.blocks_per_tile = self.tile_cols // 32
        # staged row scales: a CTA owns a strip of 32 rows x (warps * tiles_per_warp) tiles along K and
        # writes its row-scale bytes (strip_bytes per row) from shared memory at the end
        self.strip_bytes = self.warps * config.tiles_per_warp * self.blocks_per_tile

    # ------------------------------------------------------------------------------------------ host
    def fake_args(self):
        """Fake tensors/stream for cute.compile: M, K dynamic multiples of 32."""
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        c = self.config
        m = cute.sym_int32(divisibility=32)
        k = cute.sym_int32(divisibility=32)
        m32 = cute.sym_int32()
        k32 = cute.sym_int32()

        def t(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)

        fp8 = _FP8_TYPES[c.elem_dtype]
        args = [t(_IN_TYPES[c.in_dtype], (m, k))]
        if self.do_row:
            args += [t(fp8, (m, k)), t(cutlass.Uint8, (m, k32))]
        if self.do_col:
            args += [t(fp8, (m, k)), t(cutlass.Uint8, (m32, k))]
        if self.do_square:
            args += [t(fp8, (m, k)), t(cutlass.Uint8, (m32, k32))]
        return (*args, make_fake_stream())

    def tensor_names(self) -> tuple[str, ...]:
        names = ["x"]
        if self.do_row:
            names += ["row_data", "row_scale"]
        if self.do_col:
            names += ["col_data", "col_scale"]
        if self.do_square:
            names += ["sq_data", "sq_scale"]
        return tuple(names)

    def entry(self):
        """The @cute.jit host function to compile for this config."""
        return self.launch_rowcol if self.config.mode == "rowcol" else self.launch_single

    @cute.jit
    def launch_rowcol(
        self,
        mX: cute.Tensor,
        mA: cute.Tensor,
        mSA: cute.Tensor,
        mB: cute.Tensor,
        mSB: cute.Tensor,
        stream: cuda.CUstream,
    ):
        self._launch(mX, mA, mSA, mB, mSB, stream)

    @cute.jit
    def launch_single(self, mX: cute.Tensor, mA: cute.Tensor, mSA: cute.Tensor, stream: cuda.CUstream):
        self._launch(mX, mA, mSA, mA, mSA, stream)

    def _launch(self, mX, mA, mSA, mB, mSB, stream):
        m = mX.shape[0]
        k = mX.shape[1]
        ntk = (k + (self.tile_cols - 1)) // self.tile_cols
        ntiles = (m // 32) * ntk
        per_cta = self.warps * self.config.tiles_per_warp
        grid = (ntiles + (per_cta - 1)) // per_cta
        if cutlass.const_expr(self.staged):  # one CTA per (32-row strip, group of per_cta tiles along K)
            grid = (m // 32) * ((ntk + (per_cta - 1)) // per_cta)
        bounds = {}
        if cutlass.const_expr(self.config.min_ctas_per_sm > 0):
            bounds = dict(
                max_number_threads=[32 * self.warps, 1, 1],
                min_blocks_per_mp=self.config.min_ctas_per_sm,
                preferred_smem_carveout=0,
            )
        self.kernel(mX, mA, mSA, mB, mSB).launch(
            grid=[grid, 1, 1], block=[32 * self.warps, 1, 1], stream=stream, **bounds
        )

    # ---------------------------------------------------------------------------------------- device
    @cute.kernel
    def kernel(self, mX: cute.Tensor, mA: cute.Tensor, mSA: cute.Tensor, mB: cute.Tensor, mSB: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        m = mX.shape[0]
        k = mX.shape[1]
        ntk = (k + (self.tile_cols - 1)) // self.tile_cols
        ntiles = (m // 32) * ntk
        if cutlass.const_expr(self.staged):
            # Row scales staged in shared memory: the CTA's warps quantize the strip's tiles (at step i
            # the W warps take W adjacent tiles), each row-scale byte goes to shared memory, and after a
            # barrier the CTA stores strip_bytes per row as whole 8-byte words (whole 32-byte sectors
            # when strip_bytes >= 32) instead of single bytes from 8 different warps per sector.
            per = self.warps * self.config.tiles_per_warp
            nkg = (ntk + (per - 1)) // per
            tm = bidx // nkg
            kg = bidx - tm * nkg
            smem = cute.arch.alloc_smem(cutlass.Uint8, 32 * self.strip_bytes, alignment=16)
            sbase = smem.toint()
            i = Int32(0)
            while i < self.config.tiles_per_warp:
                tk = kg * per + i * self.warps + warp
                if tk < ntk:
                    co = self._coords_tk(mX, tm, tk, lane)
                    co["sbase"] = sbase
                    co["sblk"] = (i * self.warps + warp) * self.blocks_per_tile
                    self._process(self._load(mX, co), mA, mSA, mB, mSB, co, lane)
                i = i + 1
            cute.arch.barrier()
            self._store_staged_row_scales(mSA, sbase, tm, kg * (per * self.blocks_per_tile), Int32(tidx), k)
        else:
            tile = bidx * self.warps + warp
            if tile < ntiles:
                co = self._coords(mX, tile, ntk, lane)
                self._process(self._load(mX, co), mA, mSA, mB, mSB, co, lane)

    def _coords(self, mX, tile, ntk, lane) -> dict:
        """Addresses and predicates of the warp's tile `tile` (32 rows x tile_cols columns)."""
        tm = tile // ntk
        return self._coords_tk(mX, tm, tile - tm * ntk, lane)

    def _coords_tk(self, mX, tm, tk, lane) -> dict:
        """Addresses and predicates of the tile in 32-row strip `tm`, column tile `tk`."""
        V, R = self.vec, self.rows
        k = mX.shape[1]
        half = lane // R  # band: lanes [b*R, b*R + R) hold rows [b*R, b*R + R) of the same columns
        col = tk * self.tile_cols + (lane % R) * V
        colc = cutlass.select_(col < k, col, k - V)  # out-of-range lanes read a valid chunk, store nothing
        k64 = Int64(k)
        col64 = Int64(colc)
        row0 = Int64(tm * 32 + half * R)  # this thread's first row
        offset = row0 * k64 + col64  # element offset of (row0, col) in every (M, K) array
        return dict(
            tm=tm,
            half=half,
            col=col,
            ok=Boolean(col < k),
            k=k,
            k64=k64,
            col64=col64,
            row0=row0,
            offset=offset,
            x_addr=mX.iterator.toint() + offset * self.in_bytes,
        )

    def _load(self, mX, co) -> list:
        """R independent 16-byte loads per thread (a warp reads 2 x 256 contiguous bytes each time), as a
        flat list of 4 * R words."""
        out = []
        for r in range(self.rows):
            out += list(ptx.ld_global_v4(co["x_addr"] + co["k64"] * (self.in_bytes * r)))
        return out

    def _process(self, flat, mA, mSA, mB, mSB, co, lane):
        """Quantizes the warp's 32 x (16 * V) tile from its loaded words (trace-time Python: loops unroll)."""
        c = self.config
        R = self.rows
        regs = [flat[4 * r : 4 * r + 4] for r in range(R)]
        tm, half, ok, k64, col64, row0, offset = (co[n] for n in ("tm", "half", "ok", "k64", "col64", "row0", "offset"))

        bf16 = c.in_dtype == "bfloat16"
        abs_mask = ptx._u32(0x7FFF7FFF if bf16 else 0x7FFFFFFF)
        vmax = ptx.max_u16x2 if bf16 else ptx.max_u32

        # ---- column (and square) amax over the 32 rows: R in-thread, then the other bands
        colmax = None
        if cutlass.const_expr(self.do_col or self.do_square):
            colmax = [regs[0][j] & abs_mask for j in range(4)]
            for r in range(1, R):
                for j in range(4):
                    colmax[j] = vmax(colmax[j], regs[r][j] & abs_mask)
            s = R
            while s < 32:  # combine the bands
                colmax = [vmax(w, ptx.shfl_bfly(w, s)) for w in colmax]
                s *= 2

        if cutlass.const_expr(self.do_row):
            self._row_pass(regs, abs_mask, vmax, mA, mSA, offset, row0, k64, col64, lane, ok, co)
        if cutlass.const_expr(self.do_col):
            dst, dst_s = (mB, mSB) if c.mode == "rowcol" else (mA, mSA)
            self._col_pass(regs, colmax, dst, dst_s, offset, tm, k64, col64, half, ok)
        if cutlass.const_expr(self.do_square):
            self._square_pass(regs, colmax, mA, mSA, offset, tm, k64, col64, lane, ok)

    # Helpers below run at trace time inside `kernel` (plain Python: they emit instructions).
    def _quantize_row(self, words, factors) -> list:
        """One row of V elements (4 words) -> FP8 words (2 for bf16, 1 for f32)."""
        e = self.config.elem_dtype
        if self.config.in_dtype == "bfloat16":
            return [
                ptx.quantize4_bf16x2(words[0], words[1], factors[0:4], e),
                ptx.quantize4_bf16x2(words[2], words[3], factors[4:8], e),
            ]
        return [ptx.quantize4_f32(words, factors, e)]

    def _reduce_group(self, v, vmax):
        """Butterfly max over the G lanes that share a 32-column block."""
        s = 1
        while s < self.group:
            v = vmax(v, ptx.shfl_bfly(v, s))
            s *= 2
        return v

    def _row_pass(self, regs, abs_mask, vmax, mA, mSA, offset, row0, k64, col64, lane, ok, co):
        c = self.config
        V, G, R = self.vec, self.group, self.rows
        bf16 = c.in_dtype == "bfloat16"
        a_addr = mA.iterator.toint() + offset
        ks = k64 // 32
        s_addr = mSA.iterator.toint() + row0 * ks + col64 // 32
        j = Int32(lane % G)

        def thread_max(r):
            a = [regs[r][i] & abs_mask for i in range(4)]
            return vmax(vmax(a[0], a[1]), vmax(a[2], a[3]))

        def finish(r, amax):
            b, f = ptx.scale_and_factor(amax, c.elem_dtype, c.scale_rounding)
            ptx.st_global(a_addr + k64 * r, self._quantize_row(regs[r], [f] * V), pred=ok)
            if self.staged:
                # shared memory [32 rows][strip_bytes]: row (band * R + r), byte sblk + block in tile
                srow = co["half"] * R + r
                saddr = co["sbase"] + srow * self.strip_bytes + co["sblk"] + (Int32(lane) % R) // G
                ptx.st_shared_u8(saddr, b, pred=ok & (j == (r % G)))
            else:
                # lane j of each block group stores the scale bytes of the rows r with r % G == j
                ptx.st_global_u8(s_addr + ks * r, b, pred=ok & (j == (r % G)))

        if cutlass.const_expr(bf16):
            # two rows' bf16 amaxes per word (row r low half, row r+1 high half): one butterfly for both
            for r in range(0, R, 2):
                t0, t1 = thread_max(r), thread_max(r + 1)
                pair = ptx.max_u16x2(ptx.prmt(t0, t1, 0x5410), ptx.prmt(t0, t1, 0x7632))
                pair = self._reduce_group(pair, ptx.max_u16x2)
                finish(r, pair << 16)
                finish(r + 1, pair & ptx._u32(0xFFFF0000))
        else:
            for r in range(R):
                finish(r, self._reduce_group(thread_max(r), ptx.max_u32))

    def _store_staged_row_scales(self, mSA, sbase, tm, kb0, tidx, k):
        """Stores the strip's row scales from shared memory: thread t writes 8-byte word(s) of a row
        (byte stores where the row stride K/32 is not a multiple of 8 or at the right edge of K)."""
        sb = self.strip_bytes
        words_per_row = sb // 8
        total = 32 * words_per_row
        nthreads = 32 * self.warps
        ks = k // 32
        for it in range((total + nthreads - 1) // nthreads):
            ch = it * nthreads + tidx
            in_range = ch < total
            row = ch // words_per_row
            cc = ch - row * words_per_row
            kb = kb0 + cc * 8
            words = ptx.ld_shared_v2(sbase + (row % 32) * sb + cc * 8)
            gaddr = mSA.iterator.toint() + Int64(tm * 32 + (row % 32)) * Int64(ks) + Int64(kb)
            fast = in_range & (ks % 8 == 0) & (kb + 8 <= ks)
            ptx.st_global(gaddr, list(words), pred=fast)
            for bi in range(8):
                byte = (words[bi // 4] >> (8 * (bi % 4))) & ptx._u32(0xFF)
                ptx.st_global_u8(gaddr + bi, byte, pred=in_range & (~fast) & (kb + bi < ks))

    def _col_pass(self, regs, colmax, mB, mSB, offset, tm, k64, col64, half, ok):
        c = self.config
        amax = []
        if cutlass.const_expr(c.in_dtype == "bfloat16"):
            for w in colmax:
                amax += [w << 16, w & ptx._u32(0xFFFF0000)]
        else:
            amax = list(colmax)
        bs, fs = [], []
        for a in amax:
            b, f = ptx.scale_and_factor(a, c.elem_dtype, c.scale_rounding)
            bs.append(b)
            fs.append(f)
        b_addr = mB.iterator.toint() + offset
        for r in range(self.rows):
            ptx.st_global(b_addr + k64 * r, self._quantize_row(regs[r], fs), pred=ok)
        packed = [ptx.pack_bytes4(*bs[i : i + 4]) for i in range(0, len(bs), 4)]
        ptx.st_global(mSB.iterator.toint() + Int64(tm) * k64 + col64, packed, pred=ok & (half == 0))

    def _square_pass(self, regs, colmax, mS, mSS, offset, tm, k64, col64, lane, ok):
        c = self.config
        if cutlass.const_expr(c.in_dtype == "bfloat16"):
            w = ptx.max_u16x2(ptx.max_u16x2(colmax[0], colmax[1]), ptx.max_u16x2(colmax[2], colmax[3]))
            amax = self._reduce_group(ptx.max_u32(w & ptx._u32(0xFFFF), w >> 16), ptx.max_u32) << 16
        else:
            v = ptx.max_u32(ptx.max_u32(colmax[0], colmax[1]), ptx.max_u32(colmax[2], colmax[3]))
            amax = self._reduce_group(v, ptx.max_u32)
        b, f = ptx.scale_and_factor(amax, c.elem_dtype, c.scale_rounding)
        d_addr = mS.iterator.toint() + offset
        for r in range(self.rows):
            ptx.st_global(d_addr + k64 * r, self._quantize_row(regs[r], [f] * self.vec), pred=ok)
        ss_addr = mSS.iterator.toint() + Int64(tm) * (k64 // 32) + col64 // 32
        ptx.st_global_u8(ss_addr, b, pred=ok & (Int32(lane) % self.group == 0) & (Int32(lane) < self.rows))


class MXDequantize:
    """MX dequantize of 2-D FP8 data with row / col / square scales.

    Host call: (data (M, K) fp8, scale, out (M, K) bf16/f32/f16, stream); scale is (M, K/32) for "row",
    (M/32, K) for "col", (M/32, K/32) for "square". Each thread converts 16 consecutive elements.
    """

    def __init__(self, config: DequantizeConfig):
        self.config = config
        self.threads = config.threads_per_cta
        self.out_bytes = 4 if config.out_dtype == "float32" else 2
        # finite MX values saturate to the output dtype's largest finite value (formats.scales.saturate)
        self.sat_bits = int(np.float32(saturation_bound(config.out_dtype)).view(np.uint32))

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        c = self.config
        m = cute.sym_int32(divisibility=32)
        k = cute.sym_int32(divisibility=32)
        m32 = cute.sym_int32()
        k32 = cute.sym_int32()

        def t(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)

        scale_shape = {"row": (m, k32), "col": (m32, k), "square": (m32, k32)}[c.block]
        return (
            t(_FP8_TYPES[c.elem_dtype], (m, k)),
            t(cutlass.Uint8, scale_shape),
            t(_OUT_TYPES[c.out_dtype], (m, k)),
            make_fake_stream(),
        )

    def tensor_names(self) -> tuple[str, ...]:
        return ("data", "scale", "out")

    def entry(self):
        return self.launch

    @cute.jit
    def launch(self, mD: cute.Tensor, mS: cute.Tensor, mO: cute.Tensor, stream: cuda.CUstream):
        chunks = Int64(mD.shape[0]) * Int64(mD.shape[1] // 16)
        grid = Int32((chunks + (self.threads - 1)) // self.threads)
        self.kernel(mD, mS, mO).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mD: cute.Tensor, mS: cute.Tensor, mO: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        m = mD.shape[0]
        k = mD.shape[1]
        k64 = Int64(k)
        kc = k64 // 16
        idx = Int64(bidx) * self.threads + Int64(tidx)
        if idx < Int64(m) * kc:
            self._chunk(mD, mS, mO, idx, k64, kc)

    def _chunk(self, mD, mS, mO, idx, k64, kc):
        """Dequantizes the thread's 16 elements (trace-time Python: loops unroll)."""
        c = self.config
        row = idx // kc
        col = (idx - row * kc) * 16
        words = ptx.ld_global_v4(mD.iterator.toint() + row * k64 + col)
        s_base = mS.iterator.toint()
        if cutlass.const_expr(c.block == "row"):
            sb = [ptx.ld_global_u8(s_base + row * (k64 // 32) + col // 32)] * 16
        elif cutlass.const_expr(c.block == "square"):
            sb = [ptx.ld_global_u8(s_base + (row // 32) * (k64 // 32) + col // 32)] * 16
        else:
            sw = ptx.ld_global_v4(s_base + (row // 32) * k64 + col)
            sb = [(sw[i // 4] >> (8 * (i % 4))) & ptx._u32(0xFF) for i in range(16)]
        factors = {}
        ys = []
        for i in range(4):
            xs = ptx.fp8x4_to_f32(words[i], c.elem_dtype)
            for t in range(4):
                s = sb[4 * i + t]
                if id(s) not in factors:  # row / square: one scale for all 16 elements
                    factors[id(s)] = ptx.decode_factors(s)
                ys.append(ptx.dequant1(xs[t], *factors[id(s)], self.sat_bits))
        if cutlass.const_expr(c.out_dtype == "bfloat16"):
            out = [ptx.pack_bf16x2_rn(ys[2 * p], ys[2 * p + 1]) for p in range(8)]
        elif cutlass.const_expr(c.out_dtype == "float16"):  # ys saturated at 65504 (sat_bits): no inf
            out = [ptx.pack_f16x2_rn(ys[2 * p], ys[2 * p + 1]) for p in range(8)]
        else:
            out = ys
        o_addr = mO.iterator.toint() + (row * k64 + col) * self.out_bytes
        for v in range(len(out) // 4):
            ptx.st_global(o_addr + 16 * v, out[4 * v : 4 * v + 4])
