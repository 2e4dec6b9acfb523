"""MX GEMM for Blackwell (sm_100f: B200/GB200 cc 10.0 and B300/GB300 cc 10.3), CuTe DSL, compiled ahead of time.

NOT RUN ON HARDWARE: no Blackwell GPU exists on this project's machines. Every variant is compiled and its
cubin checked statically (tools/check_sm100.py: UTCQMMA with TMEM scale operands, UTCCP, no local memory,
registers, shared memory, TMEM map); the arithmetic is modelled by primitives/mx_gemm_sm100_emulation.py.

What it computes (kernels/registry/gemm_sm100.py): per batch g, acc = the block-scaled product of A (M, K)
and B (N, K), E4M3, K-major, with E8M0 scales in the 128x4 blocked layout, applied by the tensor core per
32-block of K (tcgen05.mma.kind::mxf8f6f4.block_scale), accumulated in float32 in TMEM; then the epilogue
(kernels/sm100/mx_gemm_epilogue.py): plain c, or MX quantized rows / columns / both, with bias, GELU, pre.

Host entry (`entry()`, `fake_args()`, `tensor_names()`; all tensors 3-D (G, rows, cols), row-major):
  a   (G, M, K)          float8_e4m3fn      K a multiple of 32
  b   (G, N, K)          float8_e4m3fn      N a multiple of 32
  sa  (G, ceil(M/128) ceil(K/128), 512)  uint8   A's scales, blocked (formats/blocked_scales.py, tiles row-major)
  sb  (G, ceil(N/128) ceil(K/128), 512)  uint8
  bias (1, 1, N)         float32            has_bias only
  c   (G, M, N)          out_dtype          plain, or store_pre
  q   (G, M, N)          float8_e4m3fn      row / rowcol: blocks of 32 along N
  s   (G, ceil(M/128) ceil(N/128), 512)  uint8   their scales, blocked
  qc  (G, N, M)          float8_e4m3fn      col / rowcol: z transposed, blocks of 32 along M (M % 32 == 0)
  sc  (G, ceil(N/128) ceil(M/128), 512)  uint8
  sm_count  Int32        the persistent grid's bound: the device's SM count (the handler reads it)
  stream
M, N, K, G come from the shapes of a and b; the FFI handler (csrc/mx_gemm_sm100.cc) checks the rest against
them (config.unsupported gives the kernel's limits).

Structure (kernels/sm100/warp_roles.py): persistent, one CTA per SM (cta_group 2: a cluster pair per
256-row tile), warps 0-3 epilogue, warp 4 MMA, warp 5 TMA; a `stages`-deep shared-memory ring of 128-K
stages (A, B, SFA, SFB; TMA, 128B swizzle); per K tile the MMA warp copies the stage's scales to TMEM
(tcgen05.cp, UTCCP) and runs the 4 block-scaled MMAs (UTCQMMA) into one of two TMEM accumulator buffers
(kernels/sm100/blockscaled_mma.py), so the epilogue of a tile overlaps the next tile's mainloop. TMEM
columns come from the variant's declared map (config.tmem_map()).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blockscaled_layout as blockscaled
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import compute_tmem_cols_from_layout

from jax_mxfp8.kernels.registry.gemm_sm100 import COLUMN_SMEM_PER_WARP, CTA_ROWS, K_TILE, MXGemmSm100Config
from jax_mxfp8.kernels.sm100 import warp_roles as roles
from jax_mxfp8.kernels.sm100.blockscaled_mma import (
    SF_DTYPE,
    SF_VEC,
    MmaSetup,
    blocked_scale_layout,
    copy_scales,
    make_scale_copy,
    mma_k_tile,
    scale_tmem_tensors,
)
from jax_mxfp8.kernels.sm100.mx_gemm_epilogue import EpilogueTile, make_release

DTYPES = {
    "float8_e4m3fn": cutlass.Float8E4M3FN,
    "bfloat16": cutlass.BFloat16,
    "float32": Float32,
}
INPUTS = ("a", "b", "sa", "sb")


def fake_3d(dtype, g, rows, cols):
    """A fake row-major (G, rows, cols) tensor of the AOT signature (16-byte aligned base)."""
    from cutlass.cute.runtime import make_fake_compact_tensor

    return make_fake_compact_tensor(dtype, (g, rows, cols), stride_order=(2, 1, 0), assumed_align=16)


class MXGemmSm100:
    """The kernel object of one MXGemmSm100Config (module docstring)."""

    def __init__(self, config: MXGemmSm100Config):
        self.config = config
        self.a_dtype = DTYPES[config.a_dtype]
        self.b_dtype = DTYPES[config.b_dtype]
        self.tmem = config.tmem_map().check()
        for s in range(config.acc_stages):  # the accumulator buffers are addressed as base + stage * tile_n
            assert self.tmem.region(f"acc{s}").start == s * config.tile_n
        self.sched = roles.GemmTileScheduler(CTA_ROWS, config.tile_n, config.group_m, None, config.cta_group)
        self.epilogue = EpilogueTile(config)
        self.smem_struct_bytes = None  # set when traced (tools/check_sm100.py compares it with the config)
        self.tmem_layout_columns = None  # likewise: the DSL layouts' TMEM extents

    # ------------------------------------------------------------------------------------------------
    # AOT interface
    # ------------------------------------------------------------------------------------------------

    def tensor_names(self) -> tuple[str, ...]:
        return (*INPUTS, *(("bias",) if self.config.has_bias else ()), *self.config.outputs)

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_stream

        s = cute.sym_int32
        g, m, n, k = s(), s(), s(divisibility=32), s(divisibility=32)
        q = DTYPES["float8_e4m3fn"]
        shapes = {
            "a": (self.a_dtype, g, m, k),
            "b": (self.b_dtype, g, n, k),
            "sa": (cutlass.Uint8, g, s(), 512),
            "sb": (cutlass.Uint8, g, s(), 512),
            "bias": (Float32, 1, 1, n),
            "c": (DTYPES[self.config.out_dtype], g, m, n),
            "q": (q, g, m, n),
            "s": (cutlass.Uint8, g, s(), 512),
            "qc": (q, g, n, s(divisibility=32)),
            "sc": (cutlass.Uint8, g, s(), 512),
        }
        return (*(fake_3d(*shapes[name]) for name in self.tensor_names()), Int32(148), make_fake_stream())

    def build_facts(self) -> dict:
        """What the static checks need beyond the cubin, known once traced (tools/build_kernels.py writes it
        next to the dumped cubin; tools/check_sm100.py reads it)."""
        return {"smem_struct_bytes": int(self.smem_struct_bytes), "tmem_layout_columns": self.tmem_layout_columns}

    def entry(self):
        """The @cute.jit host function for this variant's number of tensors."""
        return {
            5: self.launch5,
            6: self.launch6,
            7: self.launch7,
            8: self.launch8,
            9: self.launch9,
            10: self.launch10,
        }[len(self.tensor_names())]

    # fmt: off
    @cute.jit
    def launch5(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                sm_count: Int32, stream: cuda.CUstream):
        self._launch((t0, t1, t2, t3, t4), sm_count, stream)

    @cute.jit
    def launch6(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                t5: cute.Tensor, sm_count: Int32, stream: cuda.CUstream):
        self._launch((t0, t1, t2, t3, t4, t5), sm_count, stream)

    @cute.jit
    def launch7(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                t5: cute.Tensor, t6: cute.Tensor, sm_count: Int32, stream: cuda.CUstream):
        self._launch((t0, t1, t2, t3, t4, t5, t6), sm_count, stream)

    @cute.jit
    def launch8(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, sm_count: Int32, stream: cuda.CUstream):
        self._launch((t0, t1, t2, t3, t4, t5, t6, t7), sm_count, stream)

    @cute.jit
    def launch9(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, t8: cute.Tensor, sm_count: Int32,
                stream: cuda.CUstream):
        self._launch((t0, t1, t2, t3, t4, t5, t6, t7, t8), sm_count, stream)

    @cute.jit
    def launch10(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                 t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, t8: cute.Tensor, t9: cute.Tensor,
                 sm_count: Int32, stream: cuda.CUstream):
        self._launch((t0, t1, t2, t3, t4, t5, t6, t7, t8, t9), sm_count, stream)
    # fmt: on

    # ------------------------------------------------------------------------------------------------
    # Host side
    # ------------------------------------------------------------------------------------------------

    @cute.jit
    def _launch(self, tensors, sm_count: Int32, stream: cuda.CUstream):
        cfg = self.config
        t = dict(zip(self.tensor_names(), tensors))
        g, m, k = t["a"].shape
        n = t["b"].shape[1]
        mA = cute.make_tensor(t["a"].iterator, cute.make_layout((m, k, g), stride=(k, 1, m * k)))
        mB = cute.make_tensor(t["b"].iterator, cute.make_layout((n, k, g), stride=(k, 1, n * k)))
        mSFA = cute.make_tensor(t["sa"].iterator, blocked_scale_layout(m, k, g))
        mSFB = cute.make_tensor(t["sb"].iterator, blocked_scale_layout(n, k, g))
        setup = MmaSetup(self.a_dtype, self.b_dtype, cfg.cta_group, cfg.tile_n, K_TILE, cfg.stages)
        tma_a, tma_b, tma_sfa, tma_sfb = setup.tma_atoms(mA, mB, mSFA, mSFB)
        tx_bytes = setup.tx_bytes(self.a_dtype, self.b_dtype)
        assert tx_bytes == cfg.tx_bytes * cfg.cta_group, (tx_bytes, cfg.tx_bytes)

        col_bytes = len(roles.EPILOGUE_WARPS) * COLUMN_SMEM_PER_WARP[cfg.column_amax]
        col_bytes = col_bytes if cfg.epilogue in ("col", "rowcol") else 0

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, 2 * cfg.stages]
            acc_mbar: cute.struct.MemRange[cutlass.Int64, 2 * cfg.acc_stages]
            tmem_dealloc_mbar: cutlass.Int64
            tmem_holding: cutlass.Int32
            sA: cute.struct.Align[cute.struct.MemRange[self.a_dtype, cute.cosize(setup.a_smem.outer)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.b_dtype, cute.cosize(setup.b_smem.outer)], 1024]
            sSFA: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E8M0FNU, cute.cosize(setup.sfa_smem)], 128]
            sSFB: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E8M0FNU, cute.cosize(setup.sfb_smem)], 128]
            sCol: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, col_bytes], 128]

        self.shared_storage = SharedStorage
        self.smem_struct_bytes = SharedStorage.size_in_bytes()
        self.tmem_layout_columns = tmem_layout_columns(setup, cfg)
        outs = tuple(t[name].iterator.toint() for name in self.tensor_names()[len(INPUTS) :])
        m_tiles, n_tiles, total = self.sched.tile_counts(m, n, g)
        k_tiles = (k + K_TILE - 1) // K_TILE
        self.kernel(
            setup.tiled_mma, setup.tiled_mma_sfb, tma_a, tma_b, tma_sfa, tma_sfb, setup.cluster_vmnk,
            setup.cluster_sfb_vmnk, setup.a_smem, setup.b_smem, setup.sfa_smem, setup.sfb_smem,
            outs, m, n, m_tiles, n_tiles, total, k_tiles,
        ).launch(
            grid=[self.sched.grid_for(total, sm_count), 1, 1],
            block=[roles.THREADS, 1, 1],
            cluster=[cfg.cta_group, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        tiled_mma_sfb: cute.TiledMma,
        tma_a,
        tma_b,
        tma_sfa,
        tma_sfb,
        cluster_vmnk: cute.Layout,
        cluster_sfb_vmnk: cute.Layout,
        a_smem: cute.ComposedLayout,
        b_smem: cute.ComposedLayout,
        sfa_smem: cute.Layout,
        sfb_smem: cute.Layout,
        outs,
        m: Int32,
        n: Int32,
        m_tiles: Int32,
        n_tiles: Int32,
        total: Int32,
        k_tiles: Int32,
    ):
        cfg = self.config
        cg = cfg.cta_group
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == roles.TMA_WARP:
            for atom in (tma_a[0], tma_b[0], tma_sfa[0], tma_sfb[0]):
                cpasync.prefetch_descriptor(atom)
        rank = Int32(0)
        if cutlass.const_expr(cg > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        coord = cluster_vmnk.get_flat_coord(rank)
        coord_sfb = cluster_sfb_vmnk.get_flat_coord(rank)

        storage = utils.SmemAllocator().allocate(self.shared_storage)
        setup_tx = cfg.tx_bytes * cg
        ab = roles.make_ab_pipeline(storage.ab_mbar.data_ptr(), cfg.stages, setup_tx, cluster_vmnk)
        acc = roles.make_acc_pipeline(storage.acc_mbar.data_ptr(), cfg.acc_stages, cg, cluster_vmnk)
        tmem = roles.make_tmem_allocator(storage.tmem_holding.ptr, storage.tmem_dealloc_mbar.ptr, cg)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(cg, 1), is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)
        sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        sSFA = storage.sSFA.get_tensor(sfa_smem)
        sSFB = storage.sSFB.get_tensor(sfb_smem)
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        acc_layout = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((cfg.tile_m, cfg.tile_n))).layout
        pipeline.pipeline_init_wait(cluster_shape_mn=(cg, 1))

        first, step = cute.arch.block_idx()[0] // cg, cute.arch.grid_dim()[0] // cg
        work = (first, step, total, m_tiles, n_tiles, k_tiles, rank)
        if warp == roles.TMA_WARP:
            self._load(work, tiled_mma, tiled_mma_sfb, (tma_a, tma_b, tma_sfa, tma_sfb), cluster_vmnk,
                       cluster_sfb_vmnk, coord, coord_sfb, (sA, sB, sSFA, sSFB), ab)  # fmt: skip
        if warp == roles.MMA_WARP:
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(Float32)
            self._mma(work, tiled_mma, acc_ptr, acc_layout, tCrA, tCrB, sSFA, sSFB, ab, acc)
        if warp < roles.MMA_WARP:
            tmem.allocate(self.tmem.alloc_columns)
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(Float32)
            self._drain(work, acc_ptr, outs, storage.sCol.data_ptr().toint(), m, n, warp, acc)
            tmem.relinquish_alloc_permit()
            roles.epilogue_barrier().arrive_and_wait()
            tmem.free(acc_ptr)

    @cute.jit
    def _load(self, work, tiled_mma, tiled_mma_sfb, atoms, cluster_vmnk, cluster_sfb_vmnk, coord, coord_sfb,
              smem, ab):  # fmt: skip
        """TMA warp: A, B, SFA, SFB of every K tile of this cluster's work tiles, into the ring."""
        cfg = self.config
        first, step, total, m_tiles, n_tiles, k_tiles, rank = work
        (tma_a, mA), (tma_b, mB), (tma_sfa, mSFA), (tma_sfb, mSFB) = atoms
        sA, sB, sSFA, sSFB = smem
        setup_tiler = (cfg.tile_m, cfg.tile_n, K_TILE)
        sfb_tiler = (CTA_ROWS, cfg.sfb_rows, K_TILE)
        thr = tiled_mma.get_slice(rank % cfg.cta_group)
        thr_sfb = tiled_mma_sfb.get_slice(rank % cfg.cta_group)
        gA = thr.partition_A(cute.local_tile(mA, cute.slice_(setup_tiler, (None, 0, None)), (None, None, None)))
        gB = thr.partition_B(cute.local_tile(mB, cute.slice_(setup_tiler, (0, None, None)), (None, None, None)))
        gSFA = thr.partition_A(cute.local_tile(mSFA, cute.slice_(setup_tiler, (None, 0, None)), (None, None, None)))
        gSFB = thr_sfb.partition_B(cute.local_tile(mSFB, cute.slice_(sfb_tiler, (0, None, None)), (None, None, None)))
        a_cta = cute.make_layout(cute.slice_(cluster_vmnk, (0, 0, None, 0)).shape)
        b_cta = cute.make_layout(cute.slice_(cluster_vmnk, (0, None, 0, 0)).shape)
        sfb_cta = cute.make_layout(cute.slice_(cluster_sfb_vmnk, (0, None, 0, 0)).shape)

        def part(atom, cta_coord, cta_layout, s, gl):
            s, gl = cute.group_modes(s, 0, 3), cute.group_modes(gl, 0, 3)
            return cpasync.tma_partition(atom, cta_coord, cta_layout, s, gl)

        tAsA, tAgA = part(tma_a, coord[2], a_cta, sA, gA)
        tBsB, tBgB = part(tma_b, coord[1], b_cta, sB, gB)
        tAsSFA, tAgSFA = part(tma_sfa, coord[2], a_cta, sSFA, gSFA)
        tBsSFB, tBgSFB = part(tma_sfb, coord_sfb[1], sfb_cta, sSFB, gSFB)
        tAsSFA, tAgSFA = cute.filter_zeros(tAsSFA), cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cute.filter_zeros(tBsSFB), cute.filter_zeros(tBgSFB)
        masks = (None, None, None, None)
        if cutlass.const_expr(cfg.cta_group > 1):
            masks = (
                cpasync.create_tma_multicast_mask(cluster_vmnk, coord, mcast_mode=2),
                cpasync.create_tma_multicast_mask(cluster_vmnk, coord, mcast_mode=1),
                cpasync.create_tma_multicast_mask(cluster_vmnk, coord, mcast_mode=2),
                cpasync.create_tma_multicast_mask(cluster_sfb_vmnk, coord_sfb, mcast_mode=1),
            )
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cfg.stages)
        for t in cutlass.range(first, total, step, unroll=1):
            w = self.sched.work_tile(t, m_tiles, n_tiles, rank)
            mm = w.m_tile // cfg.cta_group  # the MMA tile (both CTAs of a pair: the same)
            srcs = (tAgA[(None, mm, None, w.g)], tBgB[(None, w.n_tile, None, w.g)],
                    tAgSFA[(None, mm, None, w.g)], tBgSFB[(None, w.n_tile, None, w.g)])  # fmt: skip
            for kt in cutlass.range(k_tiles, unroll=1):
                ab.producer_acquire(state)
                bar = ab.producer_get_barrier(state)
                for atom, src, dst, mask in zip((tma_a, tma_b, tma_sfa, tma_sfb), srcs, (tAsA, tBsB, tAsSFA, tBsSFB),
                                                masks):  # fmt: skip
                    cute.copy(atom, src[(None, kt)], dst[(None, state.index)], tma_bar_ptr=bar, mcast_mask=mask)
                state.advance()
        ab.producer_tail(state)

    @cute.jit
    def _mma(self, work, tiled_mma, acc_ptr, acc_layout, tCrA, tCrB, sSFA, sSFB, ab, acc):
        """MMA warp (the pair's leader CTA issues for both): per tile, wait for an empty accumulator buffer,
        per K tile wait for the stage, copy its scales to TMEM, 4 block-scaled MMAs, release the stage;
        commit the tile to the epilogue."""
        cfg = self.config
        first, step, total, m_tiles, n_tiles, k_tiles, rank = work
        setup = MmaSetup(self.a_dtype, self.b_dtype, cfg.cta_group, cfg.tile_n, K_TILE, cfg.stages)
        sf_cols = self.tmem.region("sfa").start, self.tmem.region("sfb").start
        tCtSFA, tCtSFB = scale_tmem_tensors(setup, acc_ptr, *sf_cols)
        copy_sfa = make_scale_copy(setup, sSFA, tCtSFA)
        copy_sfb = make_scale_copy(setup, sSFB, tCtSFB)
        leader = rank % cfg.cta_group == 0
        ab_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cfg.acc_stages)
        for _t in cutlass.range(first, total, step, unroll=1):
            tAcc = cute.make_tensor(acc_ptr + acc_state.index * cfg.tile_n, acc_layout)
            if leader:
                acc.producer_acquire(acc_state)
            for kt in cutlass.range(k_tiles, unroll=1):
                if leader:
                    ab.consumer_wait(ab_state)
                    copy_scales(copy_sfa, ab_state.index)
                    copy_scales(copy_sfb, ab_state.index)
                    mma_k_tile(tiled_mma, tAcc, tCrA, tCrB, tCtSFA, tCtSFB, ab_state.index, kt != 0)
                    ab.consumer_release(ab_state)
                ab_state.advance()
            if leader:
                acc.producer_commit(acc_state)
            acc_state.advance()
        acc.producer_tail(acc_state)

    @cute.jit
    def _drain(self, work, acc_ptr, outs, stage, m, n, warp, acc):
        """Epilogue warps: every work tile's accumulator buffer through the epilogue, in schedule order."""
        cfg = self.config
        first, step, total, m_tiles, n_tiles, k_tiles, rank = work
        names = self.tensor_names()[len(INPUTS) :]
        bases = {name: Int64(addr) for name, addr in zip(names, outs)}
        bases["stage"] = stage
        lane = cute.arch.lane_idx()
        taddr0 = Uint32(acc_ptr.toint())
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.acc_stages)
        for t in cutlass.range(first, total, step, unroll=1):
            w = self.sched.work_tile(t, m_tiles, n_tiles, rank)
            acc.consumer_wait(state)
            taddr = taddr0 + Uint32(state.index * cfg.tile_n)
            self.epilogue.run(taddr, warp, lane, w, bases, (m, n), make_release(acc, state))
            state.advance()


def tmem_layout_columns(setup: MmaSetup, cfg: MXGemmSm100Config) -> dict[str, int]:
    """TMEM columns the DSL's layouts span: one accumulator buffer, one K tile's SFA and SFB (the declared
    map's regions must hold them; tools/check_sm100.py compares)."""
    acc = setup.tiled_mma.make_fragment_C(setup.tiled_mma.partition_shape_C((cfg.tile_m, cfg.tile_n))).layout
    sfa = blockscaled.make_tmem_layout_sfa(setup.tiled_mma, setup.mma_tiler, SF_VEC, setup.stage(setup.sfa_smem))
    sfb = blockscaled.make_tmem_layout_sfb(setup.tiled_mma, setup.mma_tiler, SF_VEC, setup.stage(setup.sfb_smem))
    return {
        "acc": compute_tmem_cols_from_layout(acc, Float32),
        "sfa": compute_tmem_cols_from_layout(sfa, SF_DTYPE),
        "sfb": compute_tmem_cols_from_layout(sfb, SF_DTYPE),
    }


def make_kernel(config: MXGemmSm100Config) -> MXGemmSm100:
    return MXGemmSm100(config)
