"""MXFP8 attention forward for Blackwell (sm_100f: B200/GB200 cc 10.0, B300/GB300 cc 10.3), CuTe DSL, compiled
ahead of time. NOT RUN ON HARDWARE: no Blackwell GPU exists on this project's machines; every variant is
compiled and its cubin checked statically (tools/check_sm100_attention_fwd.py), and its arithmetic is
primitives/attention_sm100_emulation.py (dense, broadcast query) and attention_sm100_packed.py (packed).

What it computes (kernels/sm100/attention_fwd_config.py, AttentionFwdSm100Config): per query head n (KV head
n // (N / K): GQA, MQA), S = Q K^T and O = sum_j P_j V_j with block-scaled tcgen05 MMAs (E8M0 scales applied
by the tensor core per 32 elements), S and O in tensor memory, the online softmax over 128-key tiles in
ascending order with P quantized in the softmax warps ("const" / "block", rule "up"), O / l in bfloat16 and
the natural-log LSE in float32; causal (masked tiles skipped, the diagonal tiles masked), per-batch lengths,
packed jagged sequences (split addressing), one query sequence for every batch row (broadcast_q).

Host entry (`__call__`, `entry()`; the sm100 attention operand convention of docs/interfaces.md "sm100
attention": every tensor a 2-D row-major view of the emulation's array, no copies; names and order
AttentionFwdSm100Config.tensor_names):
  q         (Bq T, N H)    float8_e4m3fn  Q data as quantized: (Bq, T, N, H) square 32x32 blocks;
                                          Bq = B, or 1 for broadcast_q and packed (T = total rows)
  q_sf_hd   (Bq N, Tc 512) uint8          Q's "hd" scales (Bq, N, Tc, 1, 512), Tc = ceil(T / 128) chunks
                                          (packed: the per-sequence padded chunks, n_chunks_q of them)
  k         (B S, K H)     float8_e4m3fn  K data (B, S, K, H)
  k_sf_hd   (B K, Sc 512)  uint8          K's "hd" scales (B, K, Sc, 1, 512)
  v         (B S, K H)     float8_e4m3fn  V data (B, S, K, H), read MN-major by O = P V
  v_sf_seq  (B K, Sc 512)  uint8          V's "seq" scales (B, K, 1, Sc, 512)
  lens      (2, B)         int32          dense / broadcast_q: query, key lengths (<= T, S)
  seqs      (6, S)         int32          packed: the sequence table and its forward work list (Q tile
  work      (2, n_chunks_q) int32         pairs, longest first) from primitives/attention_sm100_packed.
                                          packed_tables (decoded by kernels/common/packed_sequences.py)
  o         (B T, N H)     bfloat16       O (packed: (T, N H)); rows >= q_len get 0
  lse       (B N, T)       float32        natural-log LSE per (batch, head) row; -inf where no key
  scale_log2               Float32        fl(tau log2 e) (the emulation's factor, computed by the caller)
  ctas                     Int32          persistent grid size (the device's SM count)
  stream                   CUstream
H = head_dim is the variant's; N, K, B, T, S, W come from the shapes. A handler must check the rest
(config.unsupported): N % K == 0, the scale chunk counts covering T and S, lens <= (T, S).

Structure (16 warps, one persistent CTA per SM; docs/perf/blackwell-attention.md section 2): softmax 0-7
(attention_fwd_softmax.py), correction 8-11 and epilogue 13 (attention_fwd_correction.py), MMA 12
(attention_fwd_mma.py), load 14 (here), 15 idle. Shared building blocks (the backward's too):
attention_loads.py (views, ragged packed rows, TMA tile sources), tile_scheduler.py (work items),
attention_mask.py, tmem_rows.py, float32_ops.py, attention_quant.py, attention_geometry.py. TMEM: the declared
map's columns (attention_fwd_config.tmem_columns), all 512 allocated.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass import Float32, Int32, Uint32
from cutlass.cute.nvgpu import cpasync, tcgen05

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.sm100 import tmem_rows
from jax_mxfp8.kernels.sm100.attention_fwd_config import (
    CORRECTION_WARPS,
    EPILOGUE_WARP,
    LOAD_WARP,
    MMA_WARP,
    Q_STAGES,
    REGISTERS,
    SOFTMAX_WARPS,
    TILE_M,
    TILE_N,
    AttentionFwdSm100Config,
)
from jax_mxfp8.kernels.sm100.attention_fwd_correction import CorrectionRole
from jax_mxfp8.kernels.sm100.attention_fwd_mma import FP8, ForwardMmas, MmaRole
from jax_mxfp8.kernels.sm100.attention_fwd_softmax import SoftmaxRole
from jax_mxfp8.kernels.sm100.attention_geometry import SCALE_CHUNK, THREADS
from jax_mxfp8.kernels.sm100.attention_loads import cols_view, rows_view, scale_tiles, scale_view, sequence_tiles
from jax_mxfp8.kernels.sm100.attention_quant import P_CONST_SCALE_BYTE
from jax_mxfp8.kernels.sm100.blockscaled_mma import SF_DTYPE
from jax_mxfp8.kernels.sm100.tile_scheduler import AttentionSchedule
from jax_mxfp8.kernels.sm100.warp_roles import make_ab_pipeline

TMEM_BARRIER = 1
TMEM_THREADS = 32 * (1 + len(SOFTMAX_WARPS) + len(CORRECTION_WARPS))
SIGNALS = ("s_full", "p_ready", "o_full", "stats", "final_full", "final_empty", "epi_full", "epi_empty")
SIGNAL_COUNT = {
    "s_full": 1,  # tcgen05.commit
    "p_ready": 256,  # 128 softmax + 128 correction threads
    "o_full": 1,
    "stats": 128,
    "final_full": 128,
    "final_empty": 128,
    "epi_full": 128,
    "epi_empty": 32,  # the epilogue warp
}


class AttentionForwardSm100(MmaRole, SoftmaxRole, CorrectionRole):
    """The kernel object of one AttentionFwdSm100Config (module docstring)."""

    def __init__(self, config: AttentionFwdSm100Config):
        self.cfg = config
        self.sched = AttentionSchedule(config.causal, config.packed, config.broadcast_q)
        # set when traced (tools/check_sm100_attention_fwd.py compares them with the config and the TMEM map)
        self.smem_struct_bytes = None
        self.stage_bytes = None
        self.sf_tmem_columns = None

    # ------------------------------------------------------------------------------------------ AOT interface
    def tensor_names(self) -> tuple[str, ...]:
        return self.cfg.tensor_names

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        s = cute.sym_int32
        h = self.cfg.head_dim

        def t(dtype, rows, cols):
            return make_fake_compact_tensor(dtype, (rows, cols), stride_order=(1, 0), assumed_align=16)

        data = (FP8, s(), s(divisibility=h))
        scales = (cutlass.Uint8, s(), s(divisibility=SCALE_CHUNK))
        tables = (t(Int32, s(), s()), t(Int32, s(), s())) if self.cfg.packed else (t(Int32, s(), s()),)
        return (
            t(*data), t(*scales), t(*data), t(*scales), t(*data), t(*scales), *tables,
            t(cutlass.BFloat16, s(), s(divisibility=h)), t(Float32, s(), s()),
            Float32(1.0), Int32(148), make_fake_stream(),
        )  # fmt: skip

    def build_facts(self) -> dict:
        """What the static checks need beyond the cubin, known once traced (written next to the dumped cubin:
        tools/sm100_static.py write_facts; tools/check_sm100_attention_fwd.py reads it)."""
        return {
            "smem_struct_bytes": int(self.smem_struct_bytes),
            "sf_tmem_columns": [int(c) for c in self.sf_tmem_columns],
            "stage_bytes": {k: int(v) for k, v in self.stage_bytes.items()},
        }

    def entry(self):
        """The @cute.jit host function of this variant: launch (dense, broadcast_q) or launch_packed."""
        return self.launch_packed if self.cfg.packed else self.launch

    def __call__(self, *args):
        """Runs the host function on the operands in the module docstring's order (JIT compiled on the first
        call; the library compiles ahead of time with entry() and fake_args() instead)."""
        return self.entry()(*args)

    # fmt: off
    @cute.jit
    def launch(self, q: cute.Tensor, q_sf_hd: cute.Tensor, k: cute.Tensor, k_sf_hd: cute.Tensor, v: cute.Tensor,
               v_sf_seq: cute.Tensor, lens: cute.Tensor, o: cute.Tensor, lse: cute.Tensor, scale_log2: Float32,
               ctas: Int32, stream: cuda.CUstream):
        self._launch(q, q_sf_hd, k, k_sf_hd, v, v_sf_seq, (lens,), o, lse, scale_log2, ctas, stream)

    @cute.jit
    def launch_packed(self, q: cute.Tensor, q_sf_hd: cute.Tensor, k: cute.Tensor, k_sf_hd: cute.Tensor, v: cute.Tensor,
                      v_sf_seq: cute.Tensor, seqs: cute.Tensor, work: cute.Tensor, o: cute.Tensor, lse: cute.Tensor,
                      scale_log2: Float32, ctas: Int32, stream: cuda.CUstream):
        self._launch(q, q_sf_hd, k, k_sf_hd, v, v_sf_seq, (seqs, work), o, lse, scale_log2, ctas, stream)
    # fmt: on

    # --------------------------------------------------------------------------------------------- host side
    @cute.jit
    def _launch(self, q, q_sf_hd, k, k_sf_hd, v, v_sf_seq, tables, o, lse, scale_log2: Float32, ctas: Int32, stream):
        cfg = self.cfg
        h = cfg.head_dim
        heads, kv_heads = q.shape[1] // h, k.shape[1] // h
        batch, w = Int32(1), Int32(0)
        if cutlass.const_expr(cfg.packed):
            w = tables[1].shape[1]
        else:
            batch = tables[0].shape[1]
        q_batch = Int32(1) if cutlass.const_expr(cfg.packed or cfg.broadcast_q) else batch
        dims = (batch, q.shape[0] // q_batch, k.shape[0] // batch, heads, kv_heads, w)
        mm = ForwardMmas(h, cfg.kv_stages)
        st = mm.stage
        m_q = rows_view(q, q_batch, heads, h, cfg.packed)
        m_k = rows_view(k, batch, kv_heads, h, cfg.packed)
        m_v = cols_view(v, batch, kv_heads, h, cfg.packed)
        m_o = rows_view(o, batch, heads, h, cfg.packed)
        chunks_q, chunks_kv = q_sf_hd.shape[1] // SCALE_CHUNK, k_sf_hd.shape[1] // SCALE_CHUNK
        m_sfq = scale_view(q_sf_hd, chunks_q * TILE_M, 128)
        m_sfk = scale_view(k_sf_hd, chunks_kv * TILE_N, 128)
        m_sfv = scale_view(v_sf_seq, 128, (v_sf_seq.shape[1] // SCALE_CHUNK) * TILE_N)
        vmnk = cute.tiled_divide(cute.make_layout((1, 1, 1)), (mm.qk.thr_id.shape,)).shape
        op = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        tma_a, tma_b = cute.nvgpu.make_tiled_tma_atom_A, cute.nvgpu.make_tiled_tma_atom_B
        tmas = (
            tma_a(op, m_q, st(mm.q_smem), mm.qk_tiler, mm.qk, vmnk),
            tma_b(op, m_k, st(mm.k_smem), mm.qk_tiler, mm.qk, vmnk),
            tma_b(op, m_v, st(mm.v_smem), mm.pv_tiler, mm.pv, vmnk),
            tma_a(op, m_sfq, st(mm.sfq_smem), mm.qk_sf_tiler, mm.qk, vmnk, internal_type=cutlass.Int16),
            tma_b(op, m_sfk, st(mm.sfk_smem), mm.qk_sf_tiler, mm.qk, vmnk, internal_type=cutlass.Int16),
            tma_b(op, m_sfv, st(mm.sfv_smem), mm.pv_sfb_tiler, mm.pv_sfb, vmnk, internal_type=cutlass.Int16),
        )
        o_stage = cute.slice_(mm.o_smem, (None, None, 0))
        tma_o = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), m_o, o_stage, (TILE_M, h))
        tmem0 = cute.make_ptr(Float32, 0, mem_space=cute.AddressSpace.tmem, assumed_align=16)
        self.sf_tmem_columns = [int(tcgen05.find_tmem_tensor_col_offset(t)) for t in mm.sf_tmem(tmem0, 0)]
        size = cute.size_in_bytes
        self.stage_bytes = {
            "q": size(FP8, st(mm.q_smem)) + size(SF_DTYPE, st(mm.sfq_smem)),
            "k": size(FP8, st(mm.k_smem)) + size(SF_DTYPE, st(mm.sfk_smem)),
            "v": size(FP8, st(mm.v_smem)) + size(SF_DTYPE, st(mm.sfv_smem)),
        }

        @cute.struct
        class SharedStorage:
            q_mbar: cute.struct.MemRange[cutlass.Int64, 2 * Q_STAGES]
            kv_mbar: cute.struct.MemRange[cutlass.Int64, 2 * cfg.kv_stages]
            signals: cute.struct.MemRange[cutlass.Int64, len(SIGNALS) * Q_STAGES]
            tmem_holding: Int32
            stats: cute.struct.MemRange[Float32, 3 * Q_STAGES * TILE_M]
            s_o: cute.struct.Align[cute.struct.MemRange[cutlass.BFloat16, cute.cosize(mm.o_smem.outer)], 1024]
            s_q: cute.struct.Align[cute.struct.MemRange[FP8, cute.cosize(mm.q_smem.outer)], 1024]
            s_kv: cute.struct.Align[cute.struct.MemRange[FP8, cute.cosize(mm.k_smem.outer)], 1024]
            s_sfq: cute.struct.Align[cute.struct.MemRange[SF_DTYPE, cute.cosize(mm.sfq_smem)], 128]
            s_sfk: cute.struct.Align[cute.struct.MemRange[SF_DTYPE, cute.cosize(mm.sfk_smem)], 128]
            s_sfv: cute.struct.Align[cute.struct.MemRange[SF_DTYPE, cute.cosize(mm.sfv_smem)], 128]
            s_sfp: cute.struct.Align[cute.struct.MemRange[SF_DTYPE, cute.cosize(mm.sfp_smem)], 128]

        self.shared_storage = SharedStorage
        self.smem_struct_bytes = SharedStorage.size_in_bytes()
        total = self.sched.total(dims)
        grid = cutlass.max(cutlass.min(total, ctas), Int32(1))
        self.kernel(tmas, tma_o, dims, tables, lse.iterator.toint(), scale_log2, total).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream, min_blocks_per_mp=1
        )

    # ------------------------------------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, tmas, tma_o, dims, tables, lse_base, scale_log2: Float32, total: Int32):
        cfg = self.cfg
        mm = ForwardMmas(cfg.head_dim, cfg.kv_stages)
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == LOAD_WARP:
            for i in cutlass.range_constexpr(len(tmas)):
                cpasync.prefetch_descriptor(tmas[i][0])
            cpasync.prefetch_descriptor(tma_o[0])
        storage = utils.SmemAllocator().allocate(self.shared_storage)
        vmnk = cute.tiled_divide(cute.make_layout((1, 1, 1)), (mm.qk.thr_id.shape,))
        pipes = {
            "q": make_ab_pipeline(storage.q_mbar.data_ptr(), Q_STAGES, self.stage_bytes["q"], vmnk),
            "kv": make_ab_pipeline(storage.kv_mbar.data_ptr(), cfg.kv_stages, self.stage_bytes["k"], vmnk),
        }
        bars = self._signals(storage)
        if warp == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(len(SIGNALS) * Q_STAGES):
                    name = SIGNALS[i // Q_STAGES]
                    cute.arch.mbarrier_init(bars[name] + i % Q_STAGES, SIGNAL_COUNT[name])
        sfp_addr = Int32(storage.s_sfp.data_ptr().toint())
        if cutlass.const_expr(cfg.p_scale == "const"):
            # PV's A scales never change: every byte 2^-8 (0x77), written once
            tid = cute.arch.thread_idx()[0]
            word = P_CONST_SCALE_BYTE * 0x01010101
            for i in cutlass.range_constexpr(Q_STAGES * SCALE_CHUNK // 4 // THREADS + 1):
                idx = tid + i * THREADS
                if idx < Q_STAGES * SCALE_CHUNK // 4:
                    ptx.st_shared_b32(sfp_addr + idx * 4, Uint32(word))
            tmem_rows.fence_async_shared()
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        # each role derives its shared-memory views, barriers and TMEM base after its setmaxnreg: values live
        # across another warpgroup's register reallocation would be spilled
        if warp >= MMA_WARP:
            cute.arch.setmaxregister_decrease(REGISTERS["other"])
        if warp == LOAD_WARP:
            self.load_role(mm, tmas, self._smem(storage, mm), pipes, total, dims, tables)
        if warp == EPILOGUE_WARP:
            s_o = storage.s_o.get_tensor(mm.o_smem.outer, swizzle=mm.o_smem.inner)
            self.epilogue_role(tma_o, s_o, self._signals(storage), total, dims, tables)
        if warp == MMA_WARP:
            tmem = self._tmem(storage)
            tmem.allocate(cfg.tmem_alloc_columns)
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(Float32)
            self.mma_role(mm, tmem_ptr, self._smem(storage, mm), pipes, self._signals(storage), total, dims, tables)
            tmem.relinquish_alloc_permit()
            cute.arch.barrier(barrier_id=TMEM_BARRIER, number_of_threads=TMEM_THREADS)
            tmem.free(tmem_ptr)
        if warp < CORRECTION_WARPS[0]:
            cute.arch.setmaxregister_increase(REGISTERS["softmax"])
            tmem = self._tmem(storage)
            tmem.wait_for_alloc()
            tmem_base = Uint32(tmem.retrieve_ptr(Float32).toint())
            smem = self._smem(storage, mm)
            self.softmax_role(tmem_base, smem, self._signals(storage), total, dims, tables, scale_log2)
            cute.arch.barrier_arrive(barrier_id=TMEM_BARRIER, number_of_threads=TMEM_THREADS)
        if warp >= CORRECTION_WARPS[0] and warp < MMA_WARP:
            cute.arch.setmaxregister_decrease(REGISTERS["correction"])
            tmem = self._tmem(storage)
            tmem.wait_for_alloc()
            tmem_base = Uint32(tmem.retrieve_ptr(Float32).toint())
            smem = self._smem(storage, mm)
            self.correction_role(tmem_base, smem, self._signals(storage), total, dims, tables, lse_base)
            cute.arch.barrier_arrive(barrier_id=TMEM_BARRIER, number_of_threads=TMEM_THREADS)

    def _smem(self, storage, mm: ForwardMmas) -> dict:
        """The shared-memory tensors and raw addresses the roles use."""
        smem = {
            "q": storage.s_q.get_tensor(mm.q_smem.outer, swizzle=mm.q_smem.inner),
            "k": storage.s_kv.get_tensor(mm.k_smem.outer, swizzle=mm.k_smem.inner),
            "sfq": storage.s_sfq.get_tensor(mm.sfq_smem),
            "sfk": storage.s_sfk.get_tensor(mm.sfk_smem),
            "sfv": storage.s_sfv.get_tensor(mm.sfv_smem),
            "sfp": storage.s_sfp.get_tensor(mm.sfp_smem),
            "sfp_addr": Int32(storage.s_sfp.data_ptr().toint()),
            "stats": storage.stats.get_tensor(cute.make_layout((TILE_M, Q_STAGES, 3), stride=(1, TILE_M, 2 * TILE_M))),
            "o_addr": Int32(storage.s_o.data_ptr().toint()),
        }
        smem["v"] = cute.make_tensor(cute.recast_ptr(smem["k"].iterator, mm.v_smem.inner), mm.v_smem.outer)
        return smem

    @staticmethod
    def _signals(storage) -> dict:
        """Signal name -> pointer to its Q_STAGES mbarriers (stage s at + s)."""
        base = storage.signals.data_ptr()
        return {name: base + i * Q_STAGES for i, name in enumerate(SIGNALS)}

    @staticmethod
    def _tmem(storage):
        """The TMEM allocator (MMA warp allocates; softmax and correction warps wait for its address)."""
        return utils.TmemAllocator(
            storage.tmem_holding.ptr,
            barrier_for_retrieve=pipeline.NamedBarrier(barrier_id=TMEM_BARRIER, num_threads=TMEM_THREADS),
            allocator_warp_id=MMA_WARP,
        )

    # -------------------------------------------------------------------------------------------- load warp
    @cute.jit
    def load_role(self, mm: ForwardMmas, tmas, smem: dict, pipes: dict, total_items, dims, tables):
        """Warp 14: per item Q_0 (+ its scale chunk), K_0, Q_1, V_0, then K_j, V_j (each with its chunk)."""
        cfg = self.cfg
        h, stages = cfg.head_dim, cfg.kv_stages
        (a_q, t_q), (a_k, t_k), (a_v, t_v), (a_sfq, t_sfq), (a_sfk, t_sfk), (a_sfv, t_sfv) = tmas
        thr_qk, thr_pv, thr_sfv = mm.qk.get_slice(0), mm.pv.get_slice(0), mm.pv_sfb.get_slice(0)
        q_pipe, kv_pipe = pipes["q"], pipes["kv"]

        def part(atom, s_tensor, g_tensor, scales: bool):
            s_t, g_t = cpasync.tma_partition(
                atom, 0, cute.make_layout(1), cute.group_modes(s_tensor, 0, 3), cute.group_modes(g_tensor, 0, 3)
            )
            if cutlass.const_expr(scales):
                s_t, g_t = cute.filter_zeros(s_t), cute.filter_zeros(g_t)
            return s_t, g_t

        first, step, total = cute.arch.block_idx()[0], cute.arch.grid_dim()[0], total_items
        pos = Int32(0)
        q_items = Int32(0)
        for idx in cutlass.range(first, total, step, unroll=1):
            it = self.sched.item(idx, dims, tables)
            if it.live and it.n_kv > 0:
                g_q = thr_qk.partition_A(sequence_tiles(t_q, it.q, it.head, (TILE_M, h), 0, cfg.packed))
                g_k = thr_qk.partition_B(sequence_tiles(t_k, it.kv, it.kv_head, (TILE_N, h), 0, cfg.packed))
                g_v = thr_pv.partition_B(sequence_tiles(t_v, it.kv, it.kv_head, (h, TILE_N), 1, cfg.packed))
                g_sfq = thr_qk.partition_A(scale_tiles(t_sfq, it.q.g, (TILE_M, 128), 0))
                g_sfk = thr_qk.partition_B(scale_tiles(t_sfk, it.kv.g, (TILE_N, 128), 0))
                g_sfv = thr_sfv.partition_B(scale_tiles(t_sfv, it.kv.g, (128, TILE_N), 1))
                q_s, q_g = part(a_q, smem["q"], g_q, False)
                k_s, k_g = part(a_k, smem["k"], g_k, False)
                v_s, v_g = part(a_v, smem["v"], g_v, False)
                sfq_s, sfq_g = part(a_sfq, smem["sfq"], g_sfq, True)
                sfk_s, sfk_g = part(a_sfk, smem["sfk"], g_sfk, True)
                sfv_s, sfv_g = part(a_sfv, smem["sfv"], g_sfv, True)
                for s in cutlass.range_constexpr(Q_STAGES):
                    state = pipeline.PipelineState(Q_STAGES, q_items, Int32(s), (q_items % 2) ^ 1)
                    q_pipe.producer_acquire(state)
                    bar = q_pipe.producer_get_barrier(state)
                    tile = it.pair * Q_STAGES + s
                    cute.copy(a_q, q_g[None, tile], q_s[None, s], tma_bar_ptr=bar)
                    cute.copy(a_sfq, sfq_g[None, it.q.chunk0 + tile], sfq_s[None, s], tma_bar_ptr=bar)
                    if cutlass.const_expr(s == 0):
                        self._load_kv(kv_pipe, pos, (a_k, k_g, k_s), (a_sfk, sfk_g, sfk_s), Int32(0), it.kv.chunk0)
                    else:
                        self._load_kv(kv_pipe, pos + 1, (a_v, v_g, v_s), (a_sfv, sfv_g, sfv_s), Int32(0), it.kv.chunk0)
                for j in cutlass.range(1, it.n_kv, unroll=1):
                    p = pos + 2 * j
                    self._load_kv(kv_pipe, p, (a_k, k_g, k_s), (a_sfk, sfk_g, sfk_s), j, it.kv.chunk0)
                    self._load_kv(kv_pipe, p + 1, (a_v, v_g, v_s), (a_sfv, sfv_g, sfv_s), j, it.kv.chunk0)
                pos += 2 * it.n_kv
                q_items += 1
        kv_pipe.producer_tail(pipeline.PipelineState(stages, pos, pos % stages, ((pos // stages) % 2) ^ 1))

    @cute.jit
    def _load_kv(self, kv_pipe, pos, data, scales, j, chunk0):
        """K_j or V_j (data = (atom, gmem tiles, smem stages)) and its scale chunk into ring position pos."""
        stages = self.cfg.kv_stages
        state = pipeline.PipelineState(stages, pos, pos % stages, ((pos // stages) % 2) ^ 1)
        kv_pipe.producer_acquire(state)
        bar = kv_pipe.producer_get_barrier(state)
        atom, g, s = data
        cute.copy(atom, g[None, j], s[None, state.index], tma_bar_ptr=bar)
        atom, g, s = scales
        cute.copy(atom, g[None, chunk0 + j], s[None, state.index], tma_bar_ptr=bar)


def make_kernel(config: AttentionFwdSm100Config) -> AttentionForwardSm100:
    return AttentionForwardSm100(config)
