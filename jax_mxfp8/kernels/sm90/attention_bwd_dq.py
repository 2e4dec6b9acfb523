"""dQ accumulation modes of the Hopper attention backward (kernels/sm90/attention_bwd.py): float16 dq and
the deterministic (ordered) adds.

Supported (AttentionBwdConfig.dq_mode: dq_accum "fp16" and/or deterministic; dq_store "red", so overlap 0;
smem_stats either way), per consumer's dQ tile (64 query rows x its head-dim columns), tau 2^e dQ added into dq:
  "fp32", deterministic    red.global.add.f32 per element, the KV tiles' adds into each query tile in
                           ascending KV-tile order (float32 adds in a fixed order: bit-identical runs)
  "fp16"                   red.global.add.noftz.f16x2 of RN_f16(tau 2^e dQ) per column pair: two roundings
                           per KV tile (the partial, then the sum), in the order the CTAs reach the tile
  "fp16", deterministic    per column pair: ld f16x2, float32 add of the float32 partial, one
                           cvt.rn.f16x2.f32, st; in ascending KV-tile order: the reference's model exactly
                           (reference/attention_bwd.py: acc = f16(f32(acc) + tau 2^e dQ_tile) per KV tile,
                           tiles in ascending order), up to the float32 partial itself (its GEMM's order)
dq is (B*N, Tp*H) float16 for "fp16" (dQ * 2^e; the op multiplies by 2^-e), float32 otherwise; the handler
zero-fills it. The kernel gets tau 2^e (e = the call's dq_scale_log2, 0 for "fp32") as its scalar dq_scale.

Ordering (deterministic): dq_sem (B*N, Tp/32) int32, zero-filled by the handler; counter [bn, 2 m + c]
counts the KV tiles that have added into query tile m's head-dim half c (c = 0 only at H64). KV tile n's
consumer waits (thread 0 spins on ld.acquire.gpu) until its counter is n, adds, fences (fence.acq_rel.gpu
per thread), meets its warpgroup at a named barrier, and thread 0 increments the counter
(red.release.gpu). The KV tiles adding into a query tile are always 0 .. n_max (causal: KV tile n starts at
query tile 2n; KV tiles past kv_len run no step), so every count is reached. KV tile n waits only for lower
KV tiles of its (batch, KV head), which the launch order (tile_scheduler.KeyTileScheduler: key tiles ascending
within a head, causal or not) starts no later and which never wait for it: no deadlock. "Starts no later" rests
on the hardware starting CTAs in linear block order (x fastest, then y), which CUDA does not document but every
Hopper part does and FA3 / CUTLASS rely on: under causal masking KV tile n - 1 of a head is `heads` launches
earlier, often in the grid row before, so the order across rows is relied on as well (a CTA that started out of
order would spin until its predecessor, resident elsewhere or not yet started, runs: a hang only if the grid
could not make progress, which in-order starts exclude). The cost: KV tile n starts n query tiles behind KV
tile 0 of its head.

Overflow ("fp16"): |dQ| 2^e >= 65520 rounds to +-Inf (cvt.rn and the f16 adds), Inf - Inf is NaN; the op
returns dq / 2^e with that Inf / NaN (docs/numerics.md), never a clamped value.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64
from cutlass.cute.arch import inline_ptx

from jax_mxfp8.kernels.common.semaphore import fence_acq_rel_gpu, sem_release_add, sem_wait
from jax_mxfp8.kernels.sm90.attention_bwd_blocks import red_add_f32
from jax_mxfp8.kernels.sm90.wgmma_fragment import acc_coords

WG_THREADS = 128


def red_add_f16x2(addr: Int64, lo: Float32, hi: Float32) -> None:
    """dq[addr], dq[addr + 2] (float16) += RN_f16(lo), RN_f16(hi): one red.global.add.noftz.f16x2
    (4-byte aligned; cvt.rn.f16x2.f32 puts its first source in the upper half)."""
    inline_ptx(
        "{ .reg .b32 t; cvt.rn.f16x2.f32 t, {$r2}, {$r1}; red.global.add.noftz.f16x2 [{$r0}], t; }",
        read_only_args=[addr, lo, hi],
    )


def add_f16x2_exclusive(addr: Int64, lo: Float32, hi: Float32) -> None:
    """dq[addr], dq[addr + 2] (float16) = RN_f16(f32(dq) + lo), RN_f16(f32(dq) + hi): a plain read-modify-
    write (the caller holds the tile exclusively), L2-coherent loads and stores (.relaxed.gpu: no stale L1
    line of another CTA's earlier write)."""
    inline_ptx(
        "{ .reg .b32 o, d; .reg .b16 l, h; .reg .f32 fl, fh;"
        " ld.relaxed.gpu.global.b32 o, [{$r0}]; mov.b32 {l, h}, o;"
        " cvt.f32.f16 fl, l; cvt.f32.f16 fh, h; add.rn.f32 fl, fl, {$r1}; add.rn.f32 fh, fh, {$r2};"
        " cvt.rn.f16x2.f32 d, fh, fl; st.relaxed.gpu.global.b32 [{$r0}], d; }",
        read_only_args=[addr, lo, hi],
    )


@cute.jit
def store_dq_mode(
    config, acc_dq, dq_base, sem_base, bn, tp, row0, col0, q0, q_len, dq_scale, c, tid_wg, barrier_id: int, key_tile
):
    """dq[bn, row0 + r, col0 + col] += dq_scale * acc_dq for one consumer's dQ tile by `config`'s mode (the
    module docstring); rows >= q_len skipped.

    acc_dq: the wgmma accumulator fragment (64 rows x this consumer's columns) float32; dq_base, sem_base:
    global addresses of dq (B*N, Tp*H) and dq_sem (B*N, Tp/32); bn: query head row; tp: Tp; row0 =
    q0 + this thread's first row, col0 = its first column; c: the consumer (its head-dim half); tid_wg:
    thread index in the consumer warpgroup; barrier_id: a named barrier of the consumer's 128 threads; key_tile:
    the CTA's key tile (the ordered adds' turn)."""
    h = config.head_dim
    fp16 = config.dq_accum == "fp16"
    ordered = config.deterministic
    esize = 2 if fp16 else 4
    sem = sem_base
    if cutlass.const_expr(ordered):
        sem = sem_base + (Int64(bn) * Int64(tp // 32) + Int64(q0 // 32 + c)) * 4
        if tid_wg == 0:
            sem_wait(sem, key_tile)
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=WG_THREADS)
    for v1 in cutlass.range_constexpr(2):
        row = row0 + 8 * v1
        if row < q_len:
            base = dq_base + (Int64(bn) * Int64(tp) + Int64(row)) * Int64(h * esize)
            for i in cutlass.range_constexpr(0, cute.size(acc_dq), 2):
                _, vv, nbk = acc_coords(i)
                if cutlass.const_expr(vv == v1):
                    addr = base + Int64((col0 + 8 * nbk) * esize)
                    lo = acc_dq[i] * dq_scale
                    hi = acc_dq[i + 1] * dq_scale
                    if cutlass.const_expr(fp16 and ordered):
                        add_f16x2_exclusive(addr, lo, hi)
                    elif cutlass.const_expr(fp16):
                        red_add_f16x2(addr, lo, hi)
                    else:
                        red_add_f32(addr, lo)
                        red_add_f32(addr + Int64(4), hi)
    if cutlass.const_expr(ordered):
        fence_acq_rel_gpu()
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=WG_THREADS)
        if tid_wg == 0:
            sem_release_add(sem)
