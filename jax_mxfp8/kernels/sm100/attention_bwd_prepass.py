"""The Blackwell attention backward's pre-pass (sm_100f, CuTe DSL, SIMT): one read of dO and O gives dO's
square-block E4M3 operand with both blocked scale orientations, and Delta. NOT RUN ON HARDWARE (compiled and
checked statically, tools/check_sm100_attention_bwd.py); its arithmetic is
primitives/attention_bwd_sm100_emulation.bwd_prepass (docs/perf/blackwell-attention.md "Delta").

Host function (`entry()`; the sm100 attention operand convention of docs/interfaces.md "sm100 attention",
AttentionBwdPrepassConfig.tensor_names order):
  do, o      (B T, N H)     bfloat16 / float32   the output gradient and the forward's output
  dlse       (B N, T)       float32              the LSE cotangent (zeros when there is none)
  lens       (2, B)         int32                query lengths in row 0 (dense)
  seqs       (6, S)         int32                packed (B = 1, T the packed total): the sequence table and
  query_tiles (2, Tc)       int32                the query-tile work list (item i = query chunk i) of
                                                 primitives/attention_sm100_packed.packed_tables
  do_q       (B T, N H)     float8_e4m3fn        dO in 32 x 32 square blocks over (T, H), rule "up"
  do_sf_hd   (B N, Tc 512)  uint8                its "hd" blocked scales (Tc = ceil(T / 128); packed: n_chunks_q)
  do_sf_seq  (B N, Tc 512)  uint8                its "seq" blocked scales
  delta      (B N, T)       float32              rowsum(dO O) - dLSE from the unquantized dO, O
  and the stream. Rows >= the query length of dO count as zero (their blocks hold only valid rows' values,
  the contract's jagged rule); packed blocks restart at every sequence start.

One CTA of 128 threads per (128-row tile, head, batch row) -- packed: per (query-tile item, head). Thread
t owns row r = tile 128 + t; warp w the square blocks of rows 32 w .. 32 w + 31. Per thread: the row of dO
(zeroed past the length) and of O, 16-byte loads; Delta = sum_h dO O (float32, ascending h, one rounding per
product and per add: XLA's reduction order may differ in the last bits) minus dLSE; per 32-column block the
lane's |x| bit max, the warp's unsigned max (redux.sync.max.u32: NaN / Inf give byte 0xFF), the byte and
factor (kernels/common/ptx.scale_and_factor "up"), E4M3 elements (quantize4_f32); the row's E4M3 bytes; its
4 "hd" bytes (one 32-bit store at (r % 32) 16 + (r // 32) 4 of the chunk); the "seq" bytes: lane l writes
byte (channel 32 j + l, row block w) at l 16 + j 4 + w; channels past H (H 64) get zero bytes.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from jax_mxfp8.kernels.common import ptx
from jax_mxfp8.kernels.common.packed_sequences import packed_item, sequence_rows
from jax_mxfp8.kernels.sm100 import attention_bwd_ptx as px
from jax_mxfp8.kernels.sm100 import epilogue_quantize as eq
from jax_mxfp8.kernels.sm100 import float32_ops as f32
from jax_mxfp8.kernels.sm100.attention_bwd_config import AttentionBwdPrepassConfig
from jax_mxfp8.kernels.sm100.attention_geometry import BLOCK, SCALE_CHUNK, TILE
from jax_mxfp8.kernels.sm100.attention_loads import scale_chunk_addr

E4M3 = "float8_e4m3fn"
THREADS = TILE
DTYPES = {"bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}


class AttentionBwdPrepass:
    """The kernel object of one AttentionBwdPrepassConfig (module docstring)."""

    def __init__(self, config: AttentionBwdPrepassConfig):
        self.config = config
        self.in_bytes = 2 if config.in_dtype == "bfloat16" else 4

    def tensor_names(self) -> tuple[str, ...]:
        return self.config.tensor_names

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        s, h = cute.sym_int32, self.config.head_dim
        u8, x = cutlass.Uint8, DTYPES[self.config.in_dtype]
        table = (Int32, (2, s()))
        shapes = {
            "do": (x, (s(), s(divisibility=h))), "o": (x, (s(), s(divisibility=h))), "dlse": (Float32, (s(), s())),
            "lens": table, "seqs": (Int32, (6, s())), "query_tiles": table,
            "do_q": (cutlass.Float8E4M3FN, (s(), s(divisibility=h))),
            "do_sf_hd": (u8, (s(), s(divisibility=SCALE_CHUNK))), "do_sf_seq": (u8, (s(), s(divisibility=SCALE_CHUNK))),
            "delta": (Float32, (s(), s())),
        }  # fmt: skip

        def fake(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)

        return (*(fake(*shapes[name]) for name in self.tensor_names()), make_fake_stream())

    def entry(self):
        return self.launch_packed if self.config.packed else self.launch

    def __call__(self, *args):
        """Runs the host function on (tensors in tensor_names order, [scalars,] stream): what cute.compile
        traces for the AOT build, and a JIT call where a GPU exists."""
        return self.entry()(*args)

    @cute.jit
    def launch(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
               t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, stream: cuda.CUstream):  # fmt: skip
        self._launch((t0, t1, t2, t3, t4, t5, t6, t7), stream)

    @cute.jit
    def launch_packed(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                      t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, t8: cute.Tensor,
                      stream: cuda.CUstream):  # fmt: skip
        self._launch((t0, t1, t2, t3, t4, t5, t6, t7, t8), stream)

    @cute.jit
    def _launch(self, tensors, stream: cuda.CUstream):
        t = dict(zip(self.tensor_names(), tensors))
        packed = self.config.packed
        batch = Int32(1) if cutlass.const_expr(packed) else t["lens"].shape[1]
        seq, heads = t["do"].shape[0] // batch, t["do"].shape[1] // self.config.head_dim
        chunks = t["do_sf_hd"].shape[1] // SCALE_CHUNK
        addrs = tuple(t[name].iterator.toint() for name in self._address_names())
        tables = (t["seqs"], t["query_tiles"]) if cutlass.const_expr(packed) else ()
        grid_x = t["query_tiles"].shape[1] if cutlass.const_expr(packed) else (seq + (TILE - 1)) // TILE
        self.kernel(addrs, (batch, seq, heads, chunks), tables).launch(
            grid=[grid_x, heads, 1 if packed else batch], block=[THREADS, 1, 1], stream=stream
        )

    def _address_names(self) -> tuple[str, ...]:
        """The tensors the kernel reaches by address: all but the packed tables."""
        return tuple(n for n in self.tensor_names() if n not in ("seqs", "query_tiles"))

    @cute.kernel
    def kernel(self, addrs, dims, tables):
        cfg = self.config
        h = cfg.head_dim
        a = {name: Int64(x) for name, x in zip(self._address_names(), addrs)}
        batch, seq, heads, chunks = dims
        tile, head, b = cute.arch.block_idx()
        tid = cute.arch.thread_idx()[0]
        warp, lane = tid // 32, tid % 32
        chunk, row0 = tile, Int32(0)
        if cutlass.const_expr(cfg.packed):
            seqs, query_tiles = tables
            it = packed_item(query_tiles, seqs, chunk)  # item i is query chunk i
            row0, _ = sequence_rows(seqs, it.seq)
            tile = it.tile
            length = cutlass.select_(it.live, it.q_len, Int32(0))
            exists = tile * TILE + tid < length  # the sequence's rows only: the next one's are not ours
            valid = exists
        else:
            length = cutlass.min(px.ld_global_i32(a["lens"] + Int64(b) * 4), seq)
            exists = tile * TILE + tid < seq
            valid = tile * TILE + tid < length  # rows past q_len count as zero dO
        r = tile * TILE + tid
        grow = Int64(b) * Int64(seq) + Int64(row0 + r)
        offset = (grow * Int64(heads) + Int64(head)) * h
        do = self._row(a["do"] + offset * self.in_bytes, valid)
        o = self._row(a["o"] + offset * self.in_bytes, exists)
        total = Float32(0.0)
        for i in cutlass.range_constexpr(h):
            total = total + f32.mul_rn(do[i], o[i])
        stat = (Int64(b) * Int64(heads) + Int64(head)) * Int64(seq) + Int64(row0 + r)
        dlse = px.ld_global_f32(a["dlse"] + stat * 4, exists, 0.0)
        delta = f32.sub_rn(total, dlse)
        ptx.st_global(a["delta"] + stat * 4, [delta.bitcast(Uint32)], pred=exists)
        hd_bytes, words = [], []
        for j in cutlass.range_constexpr(h // BLOCK):
            bits = [v.bitcast(Uint32) for v in do[BLOCK * j : BLOCK * j + BLOCK]]
            amax = eq.abs_bits(bits[0])
            for v in bits[1:]:
                amax = ptx.max_u32(amax, eq.abs_bits(v))
            byte, factor = ptx.scale_and_factor(eq.warp_max_u32(amax), E4M3, "up")
            hd_bytes.append(byte)
            words += [ptx.quantize4_f32(bits[4 * k : 4 * k + 4], [factor] * 4, E4M3) for k in range(BLOCK // 4)]
        eq.store_words(a["do_q"] + offset, words, exists)
        hd = scale_chunk_addr(a["do_sf_hd"], b, head, heads, chunks, chunk)
        hd_bytes += [Uint32(0)] * (4 - len(hd_bytes))
        ptx.st_global(hd + Int64(lane * 16 + warp * 4), [eq.pack_bytes(hd_bytes)])
        sq = scale_chunk_addr(a["do_sf_seq"], b, head, heads, chunks, chunk)
        for j in cutlass.range_constexpr(4):
            ptx.st_global_u8(sq + Int64(lane * 16 + j * 4 + warp), hd_bytes[j])

    def _row(self, addr: Int64, ok) -> list[Float32]:
        """The thread's row of H values as float32 (exact), zeros where not ok."""
        out = []
        for k in range(self.config.head_dim * self.in_bytes // 16):
            words = ptx.ld_global_v4_pred(addr + 16 * k, ok)
            if self.config.in_dtype == "bfloat16":
                for w in words:
                    out += [Uint32(ptx.bf16_lo(w)).bitcast(Float32), Uint32(ptx.bf16_hi(w)).bitcast(Float32)]
            else:
                out += [w.bitcast(Float32) for w in words]
        return out


def make_kernel(config: AttentionBwdPrepassConfig) -> AttentionBwdPrepass:
    return AttentionBwdPrepass(config)
