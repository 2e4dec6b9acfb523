"""The reduce warps of the Blackwell attention backward (kernels/sm100/attention_bwd.py, warps 0-3): each
step's dQ tile (queries in the TMEM lanes, head_dim columns) into dq, in the config's dQ mode.

Thread t (warp t // 32) owns query row m 128 + t of the step's tile (TMEM lane t). It reads its row 16
columns at a time (tcgen05.ld.32x32b.x16), multiplies by dq_scale (mul.rn: tau, or tau 2^e for float16 dQ;
an exact power-of-two scaling, so fl(acc tau) 2^e as the emulation) and stages the row in its own shared
slot; after the last chunk the warp arrives on dq_drained (the MMA warp may overwrite the columns at once).
The row is then added into dq row (q_off +) m 128 + t of query head g, only for rows inside the sequence
(q_len: a packed tile's rows past its sequence belong to the next sequence and are never touched):

  dq_accum "fp32"                one cp.reduce.async.bulk .add.f32 of the row (the L2 performs the adds;
                                 any order across key tiles)
  "fp16"                         RN_f16 of the row staged, one cp.reduce.async.bulk .add.noftz.f16: two
                                 roundings per key tile, any order ("fp16_reduce" in the emulation)
  "fp32", deterministic          as "fp32", between a semaphore wait and release: key tile n adds into query
                                 tile m only after n key tiles have (thread 0 spins on dq_sem[b, head, m] ==
                                 n, ld.acquire.gpu), waits for its reduction to complete, fences, and the
                                 128 threads meet before thread 0 increments the count (red.release.gpu):
                                 ascending key-tile order, bit-identical runs
  "fp16", deterministic          in the same order, a plain read-add-write per 8 values: float16 loaded, the
                                 staged float32 partial added in float32, one cvt.rn to float16 ("fp16" in
                                 the emulation, the reference's model)
Deadlock freedom of the ordered modes: key tile n waits only for key tiles n' < n of the same (batch, KV
head), whose CTAs have a lower linear block index (the key tile is the slowest grid index) and never wait
for it; every key tile n' < n visits every query tile m >= n (causal: m >= n'), so each count is reached.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

from jax_mxfp8.kernels.common import ptx, semaphore
from jax_mxfp8.kernels.sm100 import attention_bwd_ptx as px
from jax_mxfp8.kernels.sm100 import float32_ops as f32
from jax_mxfp8.kernels.sm100 import tmem_rows
from jax_mxfp8.kernels.sm100.attention_bwd_config import BAR_REDUCE, REDUCE_WARPS
from jax_mxfp8.kernels.sm100.attention_geometry import TILE

THREADS = 32 * len(REDUCE_WARPS)
CHUNK = 16
"""Columns per TMEM load: 16 keeps the reduce warps' live values small (their register budget is the
smallest)."""


def f16_accumulate8(addr: Int64, vals, pred) -> None:
    """dq[addr .. addr + 16) (8 float16) = RN_f16(f32(dq) + vals[i]) when pred: one 16-byte load and store
    (.relaxed.gpu: never a stale L1 line of another CTA's earlier write)."""
    body = "".join(
        f"mov.b32 {{l, h}}, w{k};\ncvt.f32.f16 a, l;\ncvt.f32.f16 b, h;\n"
        f"add.rn.f32 a, a, {{$r{2 + 2 * k}}};\nadd.rn.f32 b, b, {{$r{3 + 2 * k}}};\ncvt.rn.f16x2.f32 w{k}, b, a;\n"
        for k in range(4)
    )
    inline_ptx(
        "{\n.reg .pred p;\n.reg .b32 w0, w1, w2, w3;\n.reg .b16 l, h;\n.reg .f32 a, b;\n"
        "setp.ne.u32 p, {$r1}, 0;\n@!p bra F16ACC_END;\n"
        "ld.relaxed.gpu.global.v4.b32 {w0, w1, w2, w3}, [{$r0}];\n"
        + body
        + "st.relaxed.gpu.global.v4.b32 [{$r0}], {w0, w1, w2, w3};\nF16ACC_END:\n}",
        read_only_args=[addr, Uint32(pred), *vals],
    )


class ReduceRole:
    """The reduce warps' method of AttentionBwdSm100."""

    @cute.jit
    def reduce_dq(self, ctx, tmem, warp):
        cfg, w, bars, c = self.config, ctx.work, ctx.bars, self.cols
        h = cfg.head_dim
        fp16, ordered = cfg.dq_accum == "fp16", cfg.deterministic
        staged_f16 = fp16 and not ordered
        tid = warp * 32 + cute.arch.lane_idx()
        taddr = tmem_rows.lane_addr(Uint32(tmem.toint()), warp, c["dQ"])
        slot = ctx.smem_addr("sdQ") + tid * cfg.dq_row_bytes
        i = Int32(0)
        for gi in cutlass.range(w.groups, unroll=1):
            head = w.kv * w.groups + gi
            for m in cutlass.range(w.m_lo, w.m_hi, unroll=1):
                row = m * TILE + tid
                ok = row < w.q_len
                grow = Int64(w.bq) * Int64(ctx.seq_q) + Int64(w.q_off + row)
                dq_row = ctx.addrs["dq"] + (grow * Int64(ctx.n_heads) + Int64(head)) * (h * (2 if fp16 else 4))
                cute.arch.mbarrier_wait(bars.ptr("dq_full"), i % 2)
                tmem_rows.fence_after_sync()
                px.bulk_wait_read(0)  # the previous step's reduction has read the slot
                for chunk in cutlass.range_constexpr(h // CHUNK):
                    vals = tmem_rows.load_cols(taddr + Uint32(CHUNK * chunk), CHUNK, Float32)
                    bits = [f32.mul_rn(v, ctx.dq_scale).bitcast(Uint32) for v in vals]
                    if cutlass.const_expr(staged_f16):
                        words = [ptx.pack_f16x2_rn(bits[2 * k], bits[2 * k + 1]) for k in range(CHUNK // 2)]
                    else:
                        words = bits
                    for k in cutlass.range_constexpr(len(words) // 4):
                        ptx.st_shared_v4(slot + (len(words) * chunk + 4 * k) * 4, words[4 * k : 4 * k + 4])
                tmem_rows.fence_before_sync()
                cute.arch.sync_warp()
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive(bars.ptr("dq_drained"))
                tmem_rows.fence_async_shared()
                sem = ctx.addrs["dq"]
                if cutlass.const_expr(ordered):
                    tile = (Int64(w.b) * Int64(ctx.n_heads) + Int64(head)) * Int64(ctx.q_chunks) + Int64(m)
                    sem = ctx.addrs["dq_sem"] + tile * 4
                    if tid == 0:
                        semaphore.sem_wait(sem, w.n)
                    px.named_barrier(BAR_REDUCE, THREADS)
                if cutlass.const_expr(fp16 and ordered):
                    for k in cutlass.range_constexpr(h // 8):
                        part = ptx.ld_shared_v4_f32(slot + 32 * k) + ptx.ld_shared_v4_f32(slot + 32 * k + 16)
                        f16_accumulate8(dq_row + 16 * k, part, ok)
                else:
                    px.bulk_reduce_add(dq_row, slot, cfg.dq_row_bytes, "float16" if fp16 else "float32", ok)
                if cutlass.const_expr(ordered):
                    px.bulk_wait_all()
                    semaphore.fence_acq_rel_gpu()
                    px.named_barrier(BAR_REDUCE, THREADS)
                    if tid == 0:
                        semaphore.sem_release_add(sem)
                i += 1
        px.bulk_wait_all()
