"""MXFP8 attention backward for Blackwell (sm_100f: B200 / GB200 cc 10.0, B300 / GB300 cc 10.3), CuTe DSL,
compiled ahead of time. NOT RUN ON HARDWARE: no Blackwell GPU exists on this project's machines; every variant
is compiled and its cubin checked statically (tools/check_sm100_attention_bwd.py), and its arithmetic is
primitives/attention_bwd_sm100_emulation.py's (docs/perf/blackwell-attention.md "Backward").

Host function (`__call__`, i.e. `entry()`: the @cute.jit function of the variant's arity; the sm100 attention
operand convention of docs/interfaces.md "sm100 attention": every tensor a 2-D row-major view of the
emulation's array, no copies; names and order AttentionBwdSm100Config.tensor_names):
  q          (Bq T, N H)    float8_e4m3fn  Bq = B, or 1 (broadcast_query_attention: one q for every row)
  q_sf_hd    (Bq N, Tc 512) uint8          Q's "hd" blocked scales (Bq, N, Tc, 1, 512), Tc = ceil(T / 128)
  q_sf_seq   (Bq N, Tc 512) uint8          Q's "seq" blocked scales (Bq, N, 1, Tc, 512)
  k          (B S, K H)     float8_e4m3fn  k_sf_hd, k_sf_seq as q's over (B K, Sc 512)
  v          (B S, K H)     float8_e4m3fn  v_sf_hd
  do         (B T, N H)     float8_e4m3fn  do_sf_hd, do_sf_seq (the pre-pass's output)
  lse, delta (B N, T)       float32        forward LSE (natural log), rowsum(dO O) - dLSE
  lens       (2, B)         int32          dense: query, key lengths
  seqs       (6, S)         int32          packed (B = 1, T and S the packed totals, Tc, Sc = n_chunks_q, _k):
  key_tiles  (2, Sc)        int32          the sequence table and the key-tile work list (item i = key chunk
                                           i) of primitives/attention_sm100_packed.packed_tables
  dq_sem     (B N, Tc)      int32          deterministic only; zero-filled by the caller
  dq         (Bq T, N H)    float32 / float16 (dQ 2^e)   accumulated: the caller zero-fills it
  dk, dv     (B S, K H)     float32        written once per key tile (rows past kv_len: the computed
                                           values, zeros for key tiles that visit nothing)
  (dkv "mx": dk_row, dk_col (B S, K H) float8_e4m3fn; dk_row_scale (B S, K H / 32), dk_col_scale (B S / 32,
  K H) uint8: MXGradient's row and col MXArrays of bfloat16(dk); the same four for dv)
  scale (tau), scale_log2 (float32(tau log2 e), the emulation's c), dq_scale (tau 2^e for float16 dQ, else
  tau): float32 scalars; the stream.
B is lens' (1 packed), T = do's rows / B, S = k's rows / B, N and K = columns / H, Bq = B when q has do's rows
and 1 otherwise. The caller (a future FFI handler) checks the shapes against config.unsupported and the
variant's key.

Structure (docs/perf/blackwell-attention.md "Backward"; AttentionBwdSm100Config for the warp roles): one CTA
of 16 warps per key tile (kernels/sm100/tile_scheduler.py KeyTile), TMEM per attention_bwd_config.tmem_columns,
the five block-scaled GEMMs of kernels/sm100/attention_bwd_gemms.py. Roles, one module each:
  load    (warp 13)    attention_bwd_load.py     TMA K, V once; Q, dO, their scale chunks and LSE / Delta per step
  MMA     (warp 12)    attention_bwd_mma.py      scale copies and the five GEMMs in the design's order
  compute (warps 4-11) attention_bwd_compute.py  P and dS, their quantization; then attention_bwd_epilogue.py
  reduce  (warps 0-3)  attention_bwd_dq.py       dQ from TMEM into dq (the dQ modes)
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.blockscaled_layout as blockscaled
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.memory import SmemAllocator, TmemAllocator, compute_tmem_cols_from_layout
from cutlass.pipeline import NamedBarrier

from jax_mxfp8.kernels.sm100 import attention_bwd_config as C
from jax_mxfp8.kernels.sm100.attention_bwd_compute import ComputeRole
from jax_mxfp8.kernels.sm100.attention_bwd_dq import ReduceRole
from jax_mxfp8.kernels.sm100.attention_bwd_epilogue import EpilogueRole
from jax_mxfp8.kernels.sm100.attention_bwd_gemms import E4M3, BwdGemms
from jax_mxfp8.kernels.sm100.attention_bwd_load import LoadRole
from jax_mxfp8.kernels.sm100.attention_bwd_mma import MmaRole
from jax_mxfp8.kernels.sm100.attention_geometry import SCALE_CHUNK, THREADS, TILE
from jax_mxfp8.kernels.sm100.attention_loads import rows_view
from jax_mxfp8.kernels.sm100.tile_scheduler import dense_key_tile, packed_key_tile

ARRIVALS = {
    "kv_full": 1, "q_full": 1, "q_empty": 1, "do_full": 1, "do_empty": 1, "stats_full": 1,
    "stats_empty": len(C.COMPUTE_WARPS), "s_full": 1, "s_drained": len(C.COMPUTE_WARPS),
    "p_full": len(C.COMPUTE_WARPS), "dp_full": 1, "dp_drained": len(C.COMPUTE_WARPS),
    "ds_full": len(C.COMPUTE_WARPS), "dq_full": 1, "dq_drained": len(C.REDUCE_WARPS), "dkv_full": 1,
}  # fmt: skip
"""Arrivals that complete a phase of each mbarrier: 1 for TMA (with its bytes) and tcgen05.commit, one
elected lane per warp for the compute and reduce warps."""


@dataclasses.dataclass(frozen=True)
class Barriers:
    """The storage struct's mbarriers by name (AttentionBwdSm100Config.MBARRIERS order). Frozen: the DSL
    reads it inside run-time branches and loops."""

    config: C.AttentionBwdSm100Config
    base: object

    def ptr(self, name: str, stage=0):
        i = 0
        for other, n in self.config.MBARRIERS:
            if other == name:
                return self.base + (i + stage)
            i += self.config.stages if n == "stages" else n
        raise KeyError(name)

    def addr(self, name: str, stage=0) -> Int32:
        """The mbarrier's shared-memory address (for inline PTX)."""
        return self.ptr(name, stage).toint()


def _init_barriers(config, bars: Barriers) -> None:
    for name, n in config.MBARRIERS:
        for s in range(config.stages if n == "stages" else n):
            cute.arch.mbarrier_init(bars.ptr(name, s), ARRIVALS[name])


class AttentionBwdSm100(LoadRole, MmaRole, ComputeRole, ReduceRole, EpilogueRole):
    """The kernel object of one AttentionBwdSm100Config (module docstring)."""

    def __init__(self, config: C.AttentionBwdSm100Config):
        self.config = config
        self.tmem = config.tmem_map().check()
        self.cols = config.tmem
        self.smem_struct_bytes = None  # set when traced: tools/check_sm100_attention_bwd.py compares these two
        self.tmem_layout_columns = None

    # -------------------------------------------------------------------------------- AOT interface
    def tensor_names(self) -> tuple[str, ...]:
        return self.config.tensor_names

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        cfg, s = self.config, cute.sym_int32
        h = cfg.head_dim
        u8, i32, f32 = cutlass.Uint8, Int32, Float32
        dq_dtype = f32 if cfg.dq_accum == "fp32" else cutlass.Float16

        def rows(dtype):  # (rows, heads * H) data
            return dtype, (s(), s(divisibility=h))

        def chunks():  # (batch * heads, chunks * 512) blocked scales
            return u8, (s(), s(divisibility=SCALE_CHUNK))

        shapes = {
            "q": rows(E4M3), "k": rows(E4M3), "v": rows(E4M3), "do": rows(E4M3),
            "lse": (f32, (s(), s())), "delta": (f32, (s(), s())), "lens": (i32, (2, s())), "seqs": (i32, (6, s())),
            "key_tiles": (i32, (2, s())),
            "dq_sem": (i32, (s(), s())), "dq": rows(dq_dtype), "dk": rows(f32), "dv": rows(f32),
        }  # fmt: skip
        for name in ("q_sf_hd", "q_sf_seq", "k_sf_hd", "k_sf_seq", "v_sf_hd", "do_sf_hd", "do_sf_seq"):
            shapes[name] = chunks()
        for name in ("dk", "dv"):
            shapes[f"{name}_row"] = shapes[f"{name}_col"] = (E4M3, (s(divisibility=32), s(divisibility=32)))
            shapes[f"{name}_row_scale"] = shapes[f"{name}_col_scale"] = (u8, (s(), s()))

        def fake(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)

        tensors = tuple(fake(*shapes[name]) for name in self.tensor_names())
        return (*tensors, Float32(1.0), Float32(1.0), Float32(1.0), make_fake_stream())

    def build_facts(self) -> dict:
        """What the static checks need beyond the cubin, known once traced (written next to the dumped cubin:
        tools/sm100_static.py write_facts; tools/check_sm100_attention_bwd.py reads it)."""
        return {"smem_struct_bytes": int(self.smem_struct_bytes), "tmem_layout_columns": self.tmem_layout_columns}

    def entry(self):
        """The @cute.jit host function for this variant's number of tensors."""
        return {17: self.launch17, 18: self.launch18, 23: self.launch23}[len(self.tensor_names())]

    def __call__(self, *args):
        """Runs the host function on (tensors in tensor_names order, [scalars,] stream): what cute.compile
        traces for the AOT build, and a JIT call where a GPU exists."""
        return self.entry()(*args)

    # fmt: off
    @cute.jit
    def launch17(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                 t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, t8: cute.Tensor, t9: cute.Tensor,
                 t10: cute.Tensor, t11: cute.Tensor, t12: cute.Tensor, t13: cute.Tensor, t14: cute.Tensor,
                 t15: cute.Tensor, t16: cute.Tensor, scale: Float32, scale_log2: Float32, dq_scale: Float32,
                 stream: cuda.CUstream):
        self._launch((t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16),
                     (scale, scale_log2, dq_scale), stream)

    @cute.jit
    def launch18(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                 t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, t8: cute.Tensor, t9: cute.Tensor,
                 t10: cute.Tensor, t11: cute.Tensor, t12: cute.Tensor, t13: cute.Tensor, t14: cute.Tensor,
                 t15: cute.Tensor, t16: cute.Tensor, t17: cute.Tensor, scale: Float32, scale_log2: Float32,
                 dq_scale: Float32, stream: cuda.CUstream):
        self._launch((t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16, t17),
                     (scale, scale_log2, dq_scale), stream)

    @cute.jit
    def launch23(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                 t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, t8: cute.Tensor, t9: cute.Tensor,
                 t10: cute.Tensor, t11: cute.Tensor, t12: cute.Tensor, t13: cute.Tensor, t14: cute.Tensor,
                 t15: cute.Tensor, t16: cute.Tensor, t17: cute.Tensor, t18: cute.Tensor, t19: cute.Tensor,
                 t20: cute.Tensor, t21: cute.Tensor, t22: cute.Tensor, scale: Float32, scale_log2: Float32,
                 dq_scale: Float32, stream: cuda.CUstream):
        self._launch((t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16, t17, t18, t19,
                      t20, t21, t22), (scale, scale_log2, dq_scale), stream)
    # fmt: on

    # ------------------------------------------------------------------------------------ host side
    @cute.jit
    def _launch(self, tensors, scalars, stream: cuda.CUstream):
        cfg = self.config
        t = dict(zip(self.tensor_names(), tensors))
        h = cfg.head_dim
        n_heads, kv_heads = t["do"].shape[1] // h, t["k"].shape[1] // h
        batch = Int32(1) if cutlass.const_expr(cfg.packed) else t["lens"].shape[1]
        seq_q, seq_k = t["do"].shape[0] // batch, t["k"].shape[0] // batch
        q_batch = cutlass.select_(t["q"].shape[0] == t["do"].shape[0], batch, Int32(1))  # B, or 1 (broadcast q)
        g = BwdGemms(cfg.head_dim, cfg.stages)
        g.check_views(cfg.head_dim)
        op = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        vmnk = (1, 1, 1, 1)
        row_batch = {"q": q_batch, "k": batch, "v": batch, "do": batch}
        row_heads = {"q": n_heads, "k": kv_heads, "v": kv_heads, "do": n_heads}
        rows = {name: rows_view(t[name], row_batch[name], row_heads[name], h, cfg.packed) for name in row_batch}
        tma_k = cute.nvgpu.make_tiled_tma_atom_A(op, rows["k"], g.k_smem, g.tiler["S"], g.mma["S"], vmnk)
        tma_v = cute.nvgpu.make_tiled_tma_atom_A(op, rows["v"], g.k_smem, g.tiler["dP"], g.mma["dP"], vmnk)
        q_stage = cute.slice_(g.q_smem, (None, None, None, 0))
        tma_q = cute.nvgpu.make_tiled_tma_atom_B(op, rows["q"], q_stage, g.tiler["S"], g.mma["S"], vmnk)
        tma_do = cute.nvgpu.make_tiled_tma_atom_B(op, rows["do"], q_stage, g.tiler["dP"], g.mma["dP"], vmnk)

        st = cfg.stages
        size = dict((name, nbytes) for name, nbytes, _ in cfg.smem_regions)
        n_k, n_v, n_q, n_do, n_ds = size["sK"], size["sV"], size["sQ"], size["sdO"], size["sdS"]
        n_sf_kv, n_sf_q, n_sf_do, n_sf_c = size["sSF_kv"], size["sSF_q"], size["sSF_do"], size["sSF_c"]
        n_stats, n_dq = size["sStats"] // 4, size["sdQ"]

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[cutlass.Int64, cfg.mbarrier_count]
            tmem_holding: cutlass.Int32
            sK: cute.struct.Align[cute.struct.MemRange[E4M3, n_k], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[E4M3, n_v], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[E4M3, n_q], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[E4M3, n_do], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[E4M3, n_ds], 1024]
            sSF_kv: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, n_sf_kv], 128]
            sSF_q: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, n_sf_q], 128]
            sSF_do: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, n_sf_do], 128]
            sSF_c: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, n_sf_c], 128]
            sStats: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, n_stats], 128]
            sdQ: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, n_dq], 128]

        self.shared_storage = SharedStorage
        self.smem_struct_bytes = SharedStorage.size_in_bytes()
        self.tmem_layout_columns = tmem_layout_columns(g)
        assert st * cfg.tile_bytes == n_q
        addrs = tuple(t[name].iterator.toint() for name in self._address_names())
        tables = (t["seqs"], t["key_tiles"]) if cutlass.const_expr(cfg.packed) else ()
        ct = t["q_sf_hd"].shape[1] // SCALE_CHUNK  # query scale chunks per head (dense: Tp/128; packed: n_chunks)
        ck = t["k_sf_hd"].shape[1] // SCALE_CHUNK
        dims = (q_batch, batch, seq_q, seq_k, n_heads, kv_heads, ct, ck)
        key_tiles = t["key_tiles"].shape[1] if cutlass.const_expr(cfg.packed) else (seq_k + (TILE - 1)) // TILE
        grid = [kv_heads, 1 if cfg.packed else batch, key_tiles]
        self.kernel(tma_q[0], tma_q[1], tma_k[0], tma_k[1], tma_v[0], tma_v[1], tma_do[0], tma_do[1], addrs, dims,
                    scalars, tables).launch(grid=grid, block=[THREADS, 1, 1], stream=stream,
                                            min_blocks_per_mp=1)  # fmt: skip

    # ---------------------------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor,
               tma_v: cute.CopyAtom, mV: cute.Tensor, tma_do: cute.CopyAtom, mdO: cute.Tensor, addrs, dims,
               scalars, tables):  # fmt: skip
        cfg = self.config
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        storage = SmemAllocator().allocate(self.shared_storage)
        bars = Barriers(cfg, storage.mbar.data_ptr())
        if warp == 0:
            with cute.arch.elect_one():
                _init_barriers(cfg, bars)
            cute.arch.mbarrier_init_fence()
        if warp == C.LOAD_WARP:
            for atom in (tma_q, tma_k, tma_v, tma_do):
                cpasync.prefetch_descriptor(atom)
        cute.arch.sync_threads()

        users = 32 * (1 + len(C.COMPUTE_WARPS) + len(C.REDUCE_WARPS))
        tmem = TmemAllocator(storage.tmem_holding.ptr,
                             barrier_for_retrieve=NamedBarrier(barrier_id=C.BAR_TMEM_ALLOC, num_threads=users),
                             allocator_warp_id=C.MMA_WARP)  # fmt: skip

        if warp >= C.MMA_WARP:
            cute.arch.setmaxregister_decrease(C.REGISTERS["other"])
            ctx = self._context(storage, bars, addrs, dims, scalars, tables)
            if warp == C.LOAD_WARP:
                self.load(ctx, (tma_q, mQ), (tma_k, mK), (tma_v, mV), (tma_do, mdO))
            if warp == C.MMA_WARP:
                tmem.allocate(self.tmem.alloc_columns)
                tmem.wait_for_alloc()
                tmem_ptr = tmem.retrieve_ptr(Float32)
                self.mma(ctx, tmem_ptr)
                tmem.relinquish_alloc_permit()
                NamedBarrier(barrier_id=C.BAR_TMEM_ALLOC, num_threads=users).arrive_and_wait()
                tmem.free(tmem_ptr)
        if warp >= C.COMPUTE_WARPS[0] and warp <= C.COMPUTE_WARPS[-1]:
            cute.arch.setmaxregister_increase(C.REGISTERS["compute"])
            ctx = self._context(storage, bars, addrs, dims, scalars, tables)
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(Float32)
            self.compute(ctx, tmem_ptr, warp)
            self.epilogue(ctx, tmem_ptr, warp)
            NamedBarrier(barrier_id=C.BAR_TMEM_ALLOC, num_threads=users).arrive()
        if warp <= C.REDUCE_WARPS[-1]:
            cute.arch.setmaxregister_decrease(C.REGISTERS["reduce"])
            ctx = self._context(storage, bars, addrs, dims, scalars, tables)
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(Float32)
            self.reduce_dq(ctx, tmem_ptr, warp)
            NamedBarrier(barrier_id=C.BAR_TMEM_ALLOC, num_threads=users).arrive()

    def _address_names(self) -> tuple[str, ...]:
        """The tensors the kernel reaches by address: all but the TMA operands and the packed tables."""
        return tuple(n for n in self.tensor_names() if n not in ("q", "k", "v", "do", "seqs", "key_tiles"))

    def _context(self, storage, bars, addrs, dims, scalars, tables):
        """The roles' _Context, built by each role after its setmaxnreg (nothing computed before the role
        split stays live across it: ptxas would spill it)."""
        cfg = self.config
        a = {name: Int64(x) for name, x in zip(self._address_names(), addrs)}
        q_batch, batch, seq_q, seq_k, n_heads, kv_heads, ct, ck = dims
        groups = n_heads // kv_heads
        if cfg.packed:
            work = packed_key_tile(*tables, groups, cfg.causal)
        else:
            work = dense_key_tile(a["lens"], seq_q, seq_k, q_batch, groups, cfg.causal)
        return _Context(cfg, storage, bars, a, work, q_batch, batch, seq_q, seq_k, n_heads, kv_heads, ct, ck, *scalars)


@dataclasses.dataclass(frozen=True)
class _Context:
    """What every role reads (frozen: read inside run-time branches and loops): the config, shared memory,
    barriers, buffer addresses (by tensor name), the CTA's Work, the problem's dims and the scalars (tau,
    c = float32(tau log2 e), dq_scale)."""

    config: C.AttentionBwdSm100Config
    storage: object
    bars: Barriers
    addrs: dict
    work: object
    q_batch: Int32
    batch: Int32
    seq_q: Int32
    seq_k: Int32
    n_heads: Int32
    kv_heads: Int32
    q_chunks: Int32
    k_chunks: Int32
    scale: Float32
    scale_log2: Float32
    dq_scale: Float32

    def smem_addr(self, region: str) -> Int32:
        """A storage region's shared-memory address."""
        return getattr(self.storage, region).data_ptr().toint()


def tmem_layout_columns(g: BwdGemms) -> dict[str, int]:
    """TMEM columns the DSL's layouts span per GEMM: the accumulator, one K tile's SFA and SFB (the declared
    map's regions must be as wide; tools/check_sm100_attention_bwd.py compares)."""
    out = {}
    for gemm in ("S", "dP", "dV", "dK", "dQ"):
        mma, tiler = g.mma[gemm], g.tiler[gemm]
        acc = mma.make_fragment_C(mma.get_slice(0).partition_shape_C(tiler[:2])).layout
        out[f"acc_{gemm}"] = compute_tmem_cols_from_layout(acc, Float32)
        sides = (("sfa", blockscaled.make_tmem_layout_sfa, g.sfa), ("sfb", blockscaled.make_tmem_layout_sfb, g.sfb))
        for side, make, sf in sides:
            layout = make(mma, tiler, 32, cute.slice_(sf[gemm], (None, None, None, 0)))
            out[f"{side}_{gemm}"] = compute_tmem_cols_from_layout(layout, cutlass.Float8E8M0FNU)
    return out


def make_kernel(config: C.AttentionBwdSm100Config) -> AttentionBwdSm100:
    return AttentionBwdSm100(config)
