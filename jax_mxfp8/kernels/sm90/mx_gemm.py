"""MX GEMM for Hopper (sm_90a), CuTe DSL, compiled ahead of time: FP8 wgmma with per-128-K promotion.

Supported features (kernels/registry/gemm.py, MXGemmConfig):
  a, b float8_e4m3fn or float8_e5m2 (any mix); out bfloat16 or float32; optional float32 bias (N,);
  batch G (the tile scheduler walks G x M tiles x N tiles); M and N multiples of GEMM_ALIGN (16), not
  necessarily of the tile (TMA zero-fills rows and columns past M and N, the epilogue masks its stores);
  Kp a multiple of 128 (the aligned operands are padded with zero elements by their producer). CTA tile
  128 x tile_n (128 or 192), K tile 128.
  Not here (primitives/mx_gemm.py mx_gemm_unsupported says why, the XLA emulation takes them): M or N not
  multiples of 16, K = 0, per-32 promotion (the contract's raw scales: align128 first), transposed operands.

Operands (docs/interfaces.md; 2-D row-major views from csrc/mx_gemm.cc):
  a    (G*M, Kp)       FP8    K-major rows of the left operand, aligned to one exponent per 128 K
  b    (G*N, Kp)       FP8    K-major rows of the right operand
  sa   (G*Kp/128, M)   f32    scale of a[g, m, kt*128:(kt+1)*128]  (a power of two, or NaN)
  sb   (G*Kp/128, N)   f32    scale of b[g, n, kt*128:(kt+1)*128]
  bias (1, N)          f32    variant has_bias only
  c    (G*M, N)        bf16 / f32
Numerics: for every 128-K tile kt, tmp = a_kt b_kt^T by FP8 wgmmas on a fresh float32 accumulator (the
tensor core's FP8 accumulation keeps fewer than float32's bits, so it never chains across K tiles), then
main = main + tmp * (sa[kt, m] * sb[kt, n]) on the CUDA cores (the scale product is a power of two, so
tmp * s is exact and the FMA rounds once, like the emulation's float32 add). Epilogue: main (+ bias[n])
rounded once to the output dtype. Deterministic: a fixed order per output element, no split K.

Structure (persistent, warp-specialized; 3 warpgroups, 384 threads, one CTA per SM):
  WG0    producer: one warp issues TMA for A (128 x 128), B (tile_n x 128), sa (128), sb (tile_n) of every
         K tile of every work tile this CTA owns into a `stages`-deep shared-memory ring (one mbarrier pair
         per stage, kernels/sm90/warp_specialization.py), PRODUCER_REGISTERS registers.
  WG1/2  consumers (CONSUMER_REGISTERS): one tiled MMA over both (atom layout (2, 1, 1)), 64 rows each,
         m64 n{tile_n} k32 wgmmas from shared memory, promotion, epilogue (registers -> global, vector
         stores on full tiles, masked scalar stores on edge tiles).
  config.unroll_stages: the consumer's K loop body is one lap of the ring (`stages` K tiles with
  trace-time stage indices: barrier addresses, smem descriptors and scale addresses become immediates,
  DeepGEMM's unrolling), so every work tile starts at stage 0 (the producer wraps its stage per tile) and
  the ring phases are tracked per stage (a bit mask: stage s's uses differ by the k_tiles % stages tiles
  of a lap left over, which run in a plain loop after the laps). Same per-element operations in the same
  order as without it (bit-identical).
  config.uniform_desc: the A / B fragments (smem descriptors) are partitioned with the warpgroup's first
  thread marked warp-uniform, so their per-K-block descriptors are uniform-register adds.
  The schedules measured and no longer built (pingpong turns, two temporaries, early / preloaded scales,
  split column halves, a row-scale-only diagnostic): docs/perf/removed-variants.md.
  Scheduling: kernels/common/gemm_schedule.py GemmTileScheduler (grid min(tiles, max_ctas), bands of
  group_m M tiles). The producer runs ahead into the next work tile while the consumers finish one.
Building blocks: kernels/sm90/wgmma (tiled FP8 MMA, K-block issue loop), warp_specialization (TMA ring,
register budget, ring_state), wgmma_fragment (accumulator coordinates), kernels/common/gemm_schedule.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32

from jax_mxfp8.kernels.common.gemm_schedule import GemmTile, GemmTileScheduler
from jax_mxfp8.kernels.registry import GEMM_K_TILE, MXGemmConfig
from jax_mxfp8.kernels.sm90 import warp_specialization as ws
from jax_mxfp8.kernels.sm90 import wgmma
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords

DTYPES = {
    "float8_e4m3fn": cutlass.Float8E4M3FN,
    "float8_e5m2": cutlass.Float8E5M2,
    "bfloat16": cutlass.BFloat16,
    "float32": Float32,
}
NUM_CONSUMERS = 2
WG_M = 64  # rows per consumer warpgroup
PRODUCER_REGISTERS = 40  # the scheduler's divisions need more than attention's 24
CONSUMER_REGISTERS = 232
BK = GEMM_K_TILE
K_BLOCKS = BK // 32  # wgmmas (k32 each) per K tile


def fake_2d(dtype, rows, cols):
    """A fake row-major 2-D tensor of the AOT signature (16-byte aligned base)."""
    from cutlass.cute.runtime import make_fake_compact_tensor

    return make_fake_compact_tensor(dtype, (rows, cols), stride_order=(1, 0), assumed_align=16)


class MXGemmSm90:
    """Host entry: (a, b, sa, sb, [bias], c, stream); see the module docstring for shapes."""

    def __init__(self, config: MXGemmConfig):
        self.config = config
        self.a_dtype = DTYPES[config.a_dtype]
        self.b_dtype = DTYPES[config.b_dtype]
        self.c_dtype = DTYPES[config.out_dtype]
        self.tm, self.tn = config.tile_m, config.tile_n
        self.stages = config.stages
        self.cta_tiler = (self.tm, self.tn, BK)
        self.threads = ws.WARPGROUP_THREADS * (1 + NUM_CONSUMERS)
        # bytes one stage receives: A, B (1 byte per element), sa, sb (float32)
        self.tx_bytes = self.tm * BK + self.tn * BK + 4 * (self.tm + self.tn)
        self.cm = config.cluster_m
        self.sched = GemmTileScheduler(self.tm, self.tn, config.group_m, config.max_ctas, self.cm)
        ws.check_register_budget(NUM_CONSUMERS, PRODUCER_REGISTERS, CONSUMER_REGISTERS)

    # ------------------------------------------------------------------------------------------------
    # AOT interface (tools/build_kernels.py)
    # ------------------------------------------------------------------------------------------------

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_stream

        s = cute.sym_int32
        c = fake_2d(self.c_dtype, s(divisibility=16), s(divisibility=16))  # c (G*M, N)
        return (*self.fake_inputs(), c, make_fake_stream())

    def fake_inputs(self) -> list:
        """The fake a, b, sa, sb[, bias] of the AOT signature (shared with the epilogue subclasses)."""
        s = cute.sym_int32
        args = [
            fake_2d(self.a_dtype, s(divisibility=16), s(divisibility=BK)),  # a (G*M, Kp)
            fake_2d(self.b_dtype, s(divisibility=16), s(divisibility=BK)),  # b (G*N, Kp)
            fake_2d(Float32, s(), s(divisibility=16)),  # sa (G*Kt, M)
            fake_2d(Float32, s(), s(divisibility=16)),  # sb (G*Kt, N)
        ]
        if self.config.has_bias:
            args.append(fake_2d(Float32, s(), s(divisibility=16)))  # bias (1, N)
        return args

    def tensor_names(self) -> tuple[str, ...]:
        return ("a", "b", "sa", "sb", *(("bias",) if self.config.has_bias else ()), "c")

    def entry(self):
        return self.launch_bias if self.config.has_bias else self.launch

    # ------------------------------------------------------------------------------------------------
    # Host side: views, TMA descriptors, launch
    # ------------------------------------------------------------------------------------------------

    @cute.jit
    def launch(self, a2: cute.Tensor, b2: cute.Tensor, sa2: cute.Tensor, sb2: cute.Tensor, c2: cute.Tensor,
               stream: cuda.CUstream):  # fmt: skip
        self._launch(a2, b2, sa2, sb2, sb2, c2, stream)

    @cute.jit
    def launch_bias(self, a2: cute.Tensor, b2: cute.Tensor, sa2: cute.Tensor, sb2: cute.Tensor,
                    bias2: cute.Tensor, c2: cute.Tensor, stream: cuda.CUstream):  # fmt: skip
        self._launch(a2, b2, sa2, sb2, bias2, c2, stream)

    @cute.jit
    def _launch(self, a2: cute.Tensor, b2: cute.Tensor, sa2: cute.Tensor, sb2: cute.Tensor, bias2: cute.Tensor,
                c2: cute.Tensor, stream: cuda.CUstream):  # fmt: skip
        kp = a2.shape[1]
        kt = kp // BK
        m = sa2.shape[1]
        n = sb2.shape[1]
        g = sa2.shape[0] // kt
        # (rows, K, batch) views of the 2-D buffers; scales (rows, K tile, batch)
        a = cute.make_tensor(a2.iterator, cute.make_layout((m, kp, g), stride=(kp, 1, m * kp)))
        b = cute.make_tensor(b2.iterator, cute.make_layout((n, kp, g), stride=(kp, 1, n * kp)))
        sa = cute.make_tensor(sa2.iterator, cute.make_layout((m, kt, g), stride=(1, m, kt * m)))
        sb = cute.make_tensor(sb2.iterator, cute.make_layout((n, kt, g), stride=(1, n, kt * n)))
        c = self._out_views(c2, m, n, g)
        bias = cute.make_tensor(bias2.iterator, cute.make_layout((n,), stride=(1,)))

        kmajor = utils.LayoutEnum.ROW_MAJOR
        a_smem = sm90_utils.make_smem_layout_a(kmajor, self.cta_tiler, self.a_dtype, self.stages)
        b_smem = sm90_utils.make_smem_layout_b(kmajor, self.cta_tiler, self.b_dtype, self.stages)
        sa_smem = cute.make_layout((self.tm, 1, self.stages), stride=(1, self.tm, self.tm))
        sb_smem = cute.make_layout((self.tn, 1, self.stages), stride=(1, self.tn, self.tn))

        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        one = lambda layout: cute.slice_(layout, (None, None, 0))  # noqa: E731
        tma_a, ta = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, a, one(a_smem), (self.tm, BK))
        if cutlass.const_expr(self.cm > 1):  # each CTA of the pair loads half of B into both
            mcast = cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp()
            tma_b, tb = cute.nvgpu.cpasync.make_tiled_tma_atom(
                mcast, b, one(b_smem), (self.tn, BK), num_multicast=self.cm
            )
        else:
            tma_b, tb = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, b, one(b_smem), (self.tn, BK))
        tma_sa, tsa = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, sa, one(sa_smem), (self.tm, 1))
        tma_sb, tsb = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, sb, one(sb_smem), (self.tn, 1))

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[self.a_dtype, cute.cosize(a_smem)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.b_dtype, cute.cosize(b_smem)], 1024]
            sSA: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sa_smem)], 128]
            sSB: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sb_smem)], 128]

        self.shared_storage = SharedStorage
        m_tiles, n_tiles, total = self.sched.tile_counts(m, n, g)
        self.kernel(
            tma_a, ta, tma_b, tb, tma_sa, tsa, tma_sb, tsb, bias, c, a_smem, b_smem, sa_smem, sb_smem,
            m_tiles, n_tiles, total, kt,
        ).launch(
            grid=[self.sched.grid(total), 1, 1],
            block=[self.threads, 1, 1],
            cluster=[self.cm, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    def _out_views(self, c2: cute.Tensor, m, n, g):
        """The kernel's output argument: c (M, N, G) over the 2-D buffer (epilogue subclasses override it)."""
        return cute.make_tensor(c2.iterator, cute.make_layout((m, n, g), stride=(n, 1, m * n)))

    # ------------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_sa: cute.CopyAtom,
        mSA: cute.Tensor,
        tma_sb: cute.CopyAtom,
        mSB: cute.Tensor,
        mBias: cute.Tensor,
        mC,  # a cute.Tensor; a tuple of them for the epilogue subclasses (_out_views)
        a_smem: cute.ComposedLayout,
        b_smem: cute.ComposedLayout,
        sa_smem: cute.Layout,
        sb_smem: cute.Layout,
        m_tiles: Int32,
        n_tiles: Int32,
        total: Int32,
        k_tiles: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // ws.WARPGROUP_THREADS)
        if warp == 0:
            for atom in (tma_a, tma_b, tma_sa, tma_sb):
                cute.nvgpu.cpasync.prefetch_descriptor(atom)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        # every consumer warp releases every stage (both warpgroups read the same B tile)
        pipe = ws.make_tma_pipeline(
            storage.mbar.data_ptr(), self.stages, ws.WARPGROUP_WARPS * NUM_CONSUMERS, self.tx_bytes, self.cm
        )
        sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)
        sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        sSA = storage.sSA.get_tensor(sa_smem)
        sSB = storage.sSB.get_tensor(sb_smem)
        mC = self._with_epilogue_smem(mC)

        rank = Int32(0)
        if cutlass.const_expr(self.cm > 1):
            # every CTA's barriers must be initialized before its peer's multicast can arrive on them
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            pipeline.pipeline_init_arrive(cluster_shape_mn=(self.cm, 1), is_relaxed=True)
            pipeline.pipeline_init_wait(cluster_shape_mn=(self.cm, 1))
        else:
            cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()

        if wg == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp == 0:
                self._produce(tma_a, mA, sA, tma_b, mB, sB, tma_sa, mSA, sSA, tma_sb, mSB, sSB, pipe,
                              m_tiles, n_tiles, total, k_tiles, rank)  # fmt: skip
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGISTERS)
            self._consume(sA, sB, sSA, sSB, pipe, mBias, mC, m_tiles, n_tiles, total, k_tiles,
                          tidx - ws.WARPGROUP_THREADS, rank)  # fmt: skip

    @cute.jit
    def _produce(self, tma_a, mA, sA, tma_b, mB, sB, tma_sa, mSA, sSA, tma_sb, mSB, sSB, pipe,
                 m_tiles, n_tiles, total, k_tiles, rank):  # fmt: skip
        """Producer warp: A, B, sa, sb of every K tile of this CTA's work tiles, in consumption order (with
        cluster_m = 2: this CTA's half of B, multicast into both CTAs of the pair)."""

        def part(atom, s_tensor, g_tensor, tile, cta=0, ctas=1):
            return cute.nvgpu.cpasync.tma_partition(
                atom,
                cta,
                cute.make_layout(ctas),
                cute.group_modes(s_tensor, 0, 2),
                cute.group_modes(cute.flat_divide(g_tensor, tile), 0, 2),
            )

        tAsA, tAgA = part(tma_a, sA, mA, (self.tm, BK))
        tBsB, tBgB = part(tma_b, sB, mB, (self.tn, BK), rank, self.cm)
        b_mask = None
        if cutlass.const_expr(self.cm > 1):
            cta_layout = cute.make_layout((self.cm, 1, 1))
            b_mask = cute.make_layout_image_mask(cta_layout, cta_layout.get_flat_coord(rank), mode=0)
        tSsA, tSgA = part(tma_sa, sSA, mSA, (self.tm, 1))
        tSsB, tSgB = part(tma_sb, sSB, mSB, (self.tn, 1))
        prod = pipe.make_producer()
        first, step = self._cluster_range()
        phases = Int32(0)  # unroll_stages: bit s = parity of stage s's uses so far
        for t in cutlass.range(first, total, step, unroll=1):
            w = self.sched.work_tile(t, m_tiles, n_tiles, rank)
            s = Int32(0)  # unroll_stages: every work tile starts at stage 0 (the consumers' unrolled laps)
            for kt in cutlass.range(k_tiles, unroll=1):
                if cutlass.const_expr(self.config.unroll_stages):
                    state = self._stage_state(s, phases, 1)
                    pipe.producer_acquire(state)
                    index, bar = s, pipe.producer_get_barrier(state)
                    phases = phases ^ (Int32(1) << s)
                    s = (s + 1) % self.stages
                else:
                    h = prod.acquire_and_advance()
                    index, bar = h.index, h.barrier
                cute.copy(tma_a, tAgA[(None, w.m_tile, kt, w.g)], tAsA[(None, index)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB[(None, w.n_tile, kt, w.g)], tBsB[(None, index)], tma_bar_ptr=bar,
                          mcast_mask=b_mask)  # fmt: skip
                cute.copy(tma_sa, tSgA[(None, w.m_tile, kt, w.g)], tSsA[(None, index)], tma_bar_ptr=bar)
                cute.copy(tma_sb, tSgB[(None, w.n_tile, kt, w.g)], tSsB[(None, index)], tma_bar_ptr=bar)
        if cutlass.const_expr(self.config.unroll_stages):
            # the consumers' last release of every stage (what prod.tail() waits for on an even ring)
            for s in cutlass.range_constexpr(self.stages):
                pipe.sync_object_empty.wait(s, self._stage_state(s, phases, 1).phase)
        else:
            prod.tail()

    def _cluster_range(self) -> tuple[Int32, Int32]:
        """(this cluster's first work item, the number of clusters): the persistent loop's start and step."""
        bx, _, _ = cute.arch.block_idx()
        gx, _, _ = cute.arch.grid_dim()
        return bx // self.cm, gx // self.cm

    def _make_mma(self) -> cute.TiledMma:
        """Both consumer warpgroups' m64 n{tile_n} k32 FP8 wgmma, A and B K-major in shared memory."""
        return wgmma.make_fp8_ss_mma((WG_M, self.tn), self.a_dtype, self.b_dtype, (NUM_CONSUMERS, 1, 1))

    @cute.jit
    def _consume(self, sA, sB, sSA, sSB, pipe, mBias, mC, m_tiles, n_tiles, total, k_tiles, tid, rank):
        """Consumer thread tid in [0, 256): rows 64 (tid // 128) + 16 warp + lane // 4 (+ 8) of each work
        tile; per K tile: wgmma into a temporary accumulator, promotion into the main one; then the epilogue."""
        mma = self._make_mma()
        thr = mma.get_slice(tid)
        thr_ab = thr
        if cutlass.const_expr(self.config.uniform_desc):
            # the SS operands' descriptors are the same for every thread of a warpgroup: partitioned with
            # the warpgroup's first thread, marked warp-uniform, they stay in uniform registers (no
            # per-K-block 64-bit vector adds + R2UR for A, whose slice depends on the warpgroup)
            thr_ab = mma.get_slice(cute.arch.make_warp_uniform(tid // ws.WARPGROUP_THREADS) * ws.WARPGROUP_THREADS)
        tCrA = mma.make_fragment_A(thr_ab.partition_A(sA))
        tCrB = mma.make_fragment_B(thr_ab.partition_B(sB))
        acc_shape = thr.partition_shape_C((self.tm, self.tn))
        main = cute.make_rmem_tensor(acc_shape, Float32)
        tmp = cute.make_rmem_tensor(acc_shape, Float32)
        assert cute.size(main) == self.tn // 2
        gC_all = self._out_tiles(mC)

        c = tid // ws.WARPGROUP_THREADS  # consumer warpgroup 0 or 1
        lane = tid % 32
        row = c * WG_M + ((tid % ws.WARPGROUP_THREADS) // 32) * 16 + lane // 4
        col = 2 * (lane % 4)  # this thread's columns: col + v0 + 8 nb
        first, step = self._cluster_range()
        phases = Int32(0)  # unroll_stages: bit s = parity of stage s's uses so far (each tile starts at stage 0)
        for t in cutlass.range(first, total, step, unroll=1):
            w = self.sched.work_tile(t, m_tiles, n_tiles, rank)
            base = ((t - first) // step) * k_tiles  # ring position of this work tile's first K tile
            main.fill(0.0)
            ktile = (pipe, main, tmp, tCrA, tCrB, sSA, sSB, row, col)
            if cutlass.const_expr(self.config.unroll_stages):
                phases = self._mainloop_unrolled(lambda pos, kt=ktile: self._ktile(kt, pos), k_tiles, phases)
            else:
                for kt in cutlass.range(k_tiles, unroll=1):
                    self._ktile(ktile, base + kt)
            self._epilogue(main, thr, gC_all, mBias, mC, w, row, col)

    def _with_epilogue_smem(self, mC):
        """mC plus any shared memory an epilogue subclass allocates beside the ring (none here: mC as is)."""
        return mC

    def _out_tiles(self, mC):
        """The consumers' (tile_m, tile_n) tiles of c, for _epilogue (epilogue subclasses override both)."""
        return cute.local_tile(mC, (self.tm, self.tn), (None, None, None))

    @cute.jit
    def _ktile(self, ktile, pos):
        """One K tile at ring position pos (an absolute position, or with unroll_stages a PipelineState whose
        stage index is a trace-time constant): issue, wait, promote.
        ktile = (pipe, main, tmp, tCrA, tCrB, sSA, sSB, row, col)."""
        pipe, main, tmp, tCrA, tCrB, sSA, sSB, row, col = ktile
        self._issue(pipe, tmp, tCrA, tCrB, pos)
        cute.nvgpu.warpgroup.wait_group(0)
        self._finish(pipe, main, tmp, sSA, sSB, pos, row, col)

    @cute.jit
    def _mainloop_unrolled(self, step, k_tiles, phases):
        """config.unroll_stages: one work tile's K tiles, its first one at stage 0; the loop body is one lap
        of the ring (`stages` K tiles, stage indices 0 .. stages - 1 trace-time constants, so barrier
        addresses, smem descriptors and scale addresses are immediates), then the k_tiles % stages left
        over at run-time stages 0 .. . step(state): one K tile (_ktile).
        phases (bit s: parity of stage s's uses so far) -> the new phases."""
        n = self.stages
        for _ in cutlass.range(k_tiles // n, unroll=1):
            for s in cutlass.range_constexpr(n):
                step(self._stage_state(s, phases, 0))
            phases = phases ^ ((1 << n) - 1)
        rem = k_tiles % n
        for s in cutlass.range(rem, unroll=1):
            step(self._stage_state(s, phases, 0))
        return phases ^ ((Int32(1) << rem) - 1)

    def _stage_state(self, s, phases, flip: int) -> pipeline.PipelineState:
        """unroll_stages: the pipeline state of stage s at its next use (phase: bit s of phases, xor flip:
        1 for the producer, whose first wait on an empty barrier passes)."""
        return pipeline.PipelineState(self.stages, Int32(0), s, ((phases >> s) & 1) ^ flip)

    def _state(self, pos) -> pipeline.PipelineState:
        """The pipeline state of pos: an absolute ring position, or already a state (unroll_stages)."""
        return pos if isinstance(pos, pipeline.PipelineState) else ws.ring_state(self.stages, pos)

    @cute.jit
    def _issue(self, pipe, tmp, tCrA, tCrB, pos):
        """Waits for ring position pos and issues its K tile's wgmmas into tmp (fresh: the first k-block
        does not accumulate); commits one group."""
        state = self._state(pos)
        pipe.consumer_wait(state)
        cute.nvgpu.warpgroup.fence()
        s = state.index
        wgmma.gemm(self._make_mma, tmp, tCrA[(None, None, None, s)], tCrB[(None, None, None, s)], False)
        cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def _load_scales(self, sa_r, sb_c, sSA, sSB, pos, row, col):
        """sa_r, sb_c = this thread's row and column scales of ring position pos."""
        s = self._state(pos).index
        for v1 in cutlass.range_constexpr(2):
            sa_r[v1] = sSA[(row + 8 * v1, 0, s)]
        for j in cutlass.range_constexpr(self.tn // 4):
            sb_c[j] = sSB[(col + j % 2 + 8 * (j // 2), 0, s)]

    @cute.jit
    def _finish(self, pipe, main, tmp, sSA, sSB, pos, row, col):
        """main += tmp * sa[row] * sb[col] for ring position pos, whose wgmmas have completed: loads its
        scales, releases the stage, promotes."""
        sa_r = cute.make_rmem_tensor((2,), Float32)  # this thread's scales of one K tile: rows row, row + 8
        sb_c = cute.make_rmem_tensor((self.tn // 4,), Float32)  # columns col + j % 2 + 8 (j // 2)
        self._load_scales(sa_r, sb_c, sSA, sSB, pos, row, col)
        pipe.consumer_release(self._state(pos))
        self._fma(main, tmp, sa_r, sb_c)

    @cute.jit
    def _fma(self, main, tmp, sa_r, sb_c):
        """main += tmp * (sa * sb): one FMUL of the power-of-two scales and one FFMA per element."""
        for i in cutlass.range_constexpr(cute.size(main)):
            v0, v1, nb = acc_coords(i)
            main[i] = main[i] + tmp[i] * (sa_r[v1] * sb_c[2 * nb + v0])

    @cute.jit
    def _epilogue(self, main, thr, gC_all, mBias, mC, w: GemmTile, row, col):
        """main (+ bias) rounded once to the output dtype; vector stores on a full tile, masked scalar
        stores on an edge tile (rows >= M, columns >= N are not written)."""
        m, n = mC.shape[0], mC.shape[1]
        r0 = w.m_tile * self.tm + row
        c0 = w.n_tile * self.tn + col
        if cutlass.const_expr(self.config.has_bias):
            self._add_bias(main, mBias, c0, n)
        out = cute.make_rmem_tensor_like(main, self.c_dtype)
        out.store(main.load().to(self.c_dtype))
        tCgC = thr.partition_C(gC_all[(None, None, w.m_tile, w.n_tile, w.g)])
        full = ((w.m_tile + 1) * self.tm <= m) & ((w.n_tile + 1) * self.tn <= n)
        if full:
            cute.autovec_copy(out, tCgC)
        else:
            self._store_masked(out, tCgC, r0, c0, m, n)

    @cute.jit
    def _add_bias(self, main, mBias, c0, n):
        """main[.., column c] += bias[c] (clamped index: columns past N are never stored)."""
        for i in cutlass.range_constexpr(cute.size(main)):
            v0, _, nb = acc_coords(i)
            main[i] = main[i] + mBias[cutlass.min(c0 + v0 + 8 * nb, n - 1)]

    @cute.jit
    def _store_masked(self, out, tCgC, r0, c0, m, n):
        """Edge tile: element i goes to (r0 + 8 v1, c0 + v0 + 8 nb) when that lies inside (M, N)."""
        for i in cutlass.range_constexpr(cute.size(out)):
            v0, v1, nb = acc_coords(i)
            if (r0 + 8 * v1 < m) & (c0 + v0 + 8 * nb < n):
                tCgC[i] = out[i]


def make_kernel(config: MXGemmConfig) -> MXGemmSm90:
    return MXGemmSm90(config)
