"""Hopper attention backward variants (kernels/sm90/attention_bwd.py), sm_90a only (wgmma).

The FFI call is `jax_mxfp8_attention_bwd` (csrc/attention_bwd.cc; /work/coord/ATTN_BWD_INTERFACE.md): dense
padded batches, operands in bfloat16 holding the contract's MX values exactly; the sdp_fp8 variants
(production since session 8) take `jax_mxfp8_attention_bwd_fp8` with FP8 copies of Q, K, V, dO as well. Only
tested variants are registered (ATTENTION_BWD_VARIANTS).
"""

from __future__ import annotations

import dataclasses

from jax_mxfp8.kernels.registry.base import P_SCALE_CODE, P_SCALES, ROUNDING_CODE, SCALE_ROUNDINGS, KernelConfig

DQ_ACCUMS = ("fp32", "fp16")
DQ_ACCUM_CODE = {"fp32": 0, "fp16": 1}
DQ_STORES = ("red", "bulk", "tma", "tma_warp", "tma_writer")


@dataclasses.dataclass(frozen=True)
class AttentionBwdConfig(KernelConfig):
    """MXFP8 attention backward (kernels/sm90/attention_bwd.py): one variant per head_dim x causal.

    Attributes:
      head_dim: 64 or 128.
      causal: top-left causal masking (query i sees keys j <= i).
      p_scale: the contract's AttentionConfig.p_scale for dV's P operand: "const" (E4M3(P 2^8) 2^-8) or
        "block" (one E8M0 scale per 32 queries of each key, dV's contracting axis; needs p_scaled=False, the
        fp32 dQ path and no broadcast_q; registered as BLOCK_P's variants).
      p_rounding: the P scale rule for p_scale="block" (unused for "const": must be "up").
      dq_accum: dQ accumulation across KV tiles: "fp32" (float32 adds into a zero-filled float32 dq) or
        "fp16" (a zero-filled float16 dq holding dQ * 2^e; e is the call's attribute dq_scale_log2, the
        kernel gets tau 2^e as its second scalar; kernels/sm90/attention_bwd_dq.py).
      deterministic: dQ's adds of the KV tiles in ascending tile order (a per-query-tile semaphore, the
        kernel's dq_sem operand), so dq is bit-identical across runs; False: in whatever order the CTAs
        reach them (atomics).
      packed: packed jagged sequences: one batch row of the aligned packed layout (every sequence from a
        128-row tile; ops/varlen_kernel.py), the lens operand a (4, Sp / 128) table per key tile (its sequence's
        first query row, query end row, KV end row, first KV row); PACKED's variants (dq_accum "fp32", not
        deterministic, no broadcast_q, no dv_f16: dv_f16's dO shift per KV head would span every sequence).
      q_stage: Q / dO tiles (64 query rows each) in flight in shared memory.
      dq_store: how each query tile's dQ partial reaches dq: "red" (one red.global.add.f32 per element
        from the registers) or "bulk" (staged in shared memory, then cp.reduce.async.bulk .add.f32 of
        whole rows: 256-byte bulk reductions in L2 instead of scattered 4-byte ones) or "tma" (staged in
        shared memory in the 128-byte-swizzled layout of a TMA tensor map on dq, then one
        cp.reduce.async.bulk.tensor .add per consumer and tile, issued by one thread, after a 128-thread
        barrier; overlap 0, dq_keys "cta" only) or "tma_warp" (the same, but each warp reduces its own 16
        rows, 2 KB boxes: no barrier, a warp's staging stores and its TMA ordered by __syncwarp; overlap 0) or
        "tma_writer" (the "tma_warp" staging, but the consumers only arrive on a named barrier after their
        stores and warp 1 of the producer warpgroup issues every box's reduction, waits for their reads and
        frees the tile on a second barrier, FA3's dQ writer; overlap 0, dq_keys "cta").
      overlap: 0, or issue the next query tile's S^T (1) or S^T and dP^T (2) wgmmas between this tile's dQ
        staging and its bulk reductions (waited at the end of the step), so that the dQ store's barriers and
        reductions run while they occupy the tensor cores; with 1, dP^T is issued at the top of the step and
        runs during the P computation as in tune 0. ("bulk" only; with global stats the next tile's LSE /
        delta stay live across the store: H128 spills 232-256 bytes.)
      smem_stats: False: each consumer thread loads its 16 LSE and 16 delta values per query tile from
        global memory (32 LDG, live in registers from the tile's start); True: the producer copies the
        tile's 64 LSE and 64 delta values (cp.async.bulk, 2 x 256 bytes) into the Q / dO stage, and the
        consumers read them from shared memory right where they are used (fewer live registers).
      amax_reduce: the dS square block's warp amax: "shfl" (5 dependent shfl.sync.bfly + max per query
        block) or "redux" (one redux.sync.max.u32: the same integer max of |x| bits, one instruction).
      dq_first: the dQ wgmma issued before dK's (not after) and its store run while dK's wgmma is in flight
        (wait_group(1)), instead of after both; overlap 0, dq_keys "cta" only. The same sums (dk, dv bits
        unchanged).
      stats_early: smem_stats only (overlap 0): each tile's LSE shared-memory loads are issued before the
        S^T wait instead of after it, so their latency hides under the wgmma.
      dq_red_width: dq_store "red": floats per red.global.add (1: .f32; 2: .v2.f32, a thread's two adjacent
        columns in one 8-byte reduction: half the instructions and L2 reduction requests; 4: .v4.f32, lane
        pairs swap half their values first so that each lane holds 4 adjacent columns of one row).
      dq_keys: dQ = dS K per query tile over "cta" (all 128 keys of the CTA: both consumers' dS in shared
        memory behind a 256-thread barrier, the head-dim split over the consumers at H128, consumer 0 alone
        at H64) or "own" (each consumer over its own 64 keys, all head-dim columns: only a 128-thread
        barrier per consumer, so the two consumers run independently; twice the dQ reductions into dq).
        "own" needs overlap 0, and dq_store "red" or "tma_warp" at head_dim 128 (the bulk path stages 64
        columns; "tma_warp" stages each consumer's two 64-column halves in turn in its own block).
      broadcast_q: one query sequence for every batch row (broadcast_query_attention): q and dq hold batch 1;
        the producer loads each query head's Q tiles at batch 0 and every batch row's dQ reductions add into
        batch 0's dq (the float32 sum over the batch, in the atomics' order); dO, LSE and delta stay per
        batch row. Not with the dQ modes (their float16 dq and dq_sem ordering are per batch row).
      sdp_fp8: S^T = K Q^T and dP^T = V dO^T on FP8 wgmma (twice BF16's rate) from FP8 copies of Q, K, V, dO
        re-encoded to one exponent per 32 rows (the forward's "way (a)", primitives/attention_operands.py
        aligned_rows), their accumulators scaled by the row factors (the call's extra operands q8, k8, v8, do8,
        qs, ks, vs, dos: target jax_mxfp8_attention_bwd_fp8); dV, dK, dQ stay on BF16 wgmma. Not with the dQ
        modes, broadcast_q or overlap.
      next_early: 0, or issue the next query tile's S^T (1) or S^T and dP^T (2) right after this tile's dQ
        store (dq_first: while dK's wgmma runs), so that they queue behind dK on the tensor cores and are
        complete (the step's final wait) when the next step starts: its P phase starts at once (with 1,
        dP^T is issued at the top of the next step and runs under its P phase). Needs dq_first (overlap 0,
        dq_keys "cta"); overlap is the older form for the "bulk" store. (Issued before the dS barrier instead,
        acc_s next to acc_dq and dS's A fragment does not fit the H128 registers: ptxas serializes every
        wgmma, C7512.)
      dk_ss: dK += dSq^T Q reads dSq^T from the dS tile in shared memory (SS wgmma: the tile dQ reads,
        query-contiguous, is K-major for dK's A) instead of a bfloat16 A fragment in registers: 16 fewer
        registers held while dK runs and no second bfloat16 packing of dS. The same products (dk bits equal).
      p_scaled: P is computed as 2^8 P by the exponent (8 folded into LSE log2(e) and the clamp), so Pq =
        E4M3(2^8 P) needs no multiplies either side (dV accumulates 2^8 dV), dS comes out as 2^8 dS, its
        square blocks quantize to the same E4M3 values with scales 2^8 larger, and the 2^-8 rides on dQ's and
        dK's tau and dV's epilogue (exact powers of two). Saves 64 multiplies per thread and tile; ex2 of x + 8
        instead of 2^8 ex2(x) moves P by an ulp or so, so dk, dv are not bit-equal to tune 0's.
      dv_f16: dV += Pq^T dO on float16 wgmma: Pq's E4M3 values go to the A fragment by one cvt per pair
        (e4m3x2 -> f16x2, exact) instead of the round trip through float32 to bfloat16, and the do operand is
        float16 holding dO 2^-shift, one power of two per (batch, KV head) that puts its largest block near
        2^15 (primitives/attention_operands.py do_shift / do_float16; exact for blocks within 22 binades of it).
        dv comes out times 2^-shift and the caller scales it back: dv bit-equal to the same config without
        dv_f16 where every dO block is within those 22 binades and none is NaN (a NaN block makes its 32 rows
        NaN in the float16 copy). Needs sdp_fp8 and p_scaled (dO's bfloat16 copy is then read by dV alone).
      factors_ahead: sdp_fp8's per-tile query-block factors (qs, dos: four uniform global loads) are loaded one
        loop step before their tile instead of at its top, where the P phase waited for them (ncu: ~5% of the
        stall samples at the loads' first uses). Needs sdp_fp8 and next_early 0. The same products.
      tune: 0 for the production variant; > 0 for alternatives built only for benchmarks.
    """

    op = "attention_bwd"
    kernels = {"sm_90a": "jax_mxfp8.kernels.sm90.attention_bwd:make_kernel"}  # wgmma: Hopper only
    key_fields = ("head_dim", "causal", "p_scale", "p_rounding", "dq_accum", "deterministic", "packed", "broadcast_q")
    codes = {"p_scale": P_SCALE_CODE, "p_rounding": ROUNDING_CODE, "dq_accum": DQ_ACCUM_CODE}
    # in the kernel table: the handler checks that an sdp_fp8 variant is called with its FP8 operands
    table_fields = ("sdp_fp8", "dv_f16")  # dv_f16: the handler checks that do is float16

    head_dim: int = 128
    causal: bool = False
    p_scale: str = "const"
    p_rounding: str = "up"
    dq_accum: str = "fp32"
    deterministic: bool = False
    packed: bool = False
    q_stage: int = 2
    dq_store: str = "bulk"
    overlap: int = 0
    smem_stats: bool = False
    amax_reduce: str = "shfl"
    stats_early: bool = False
    dq_first: bool = False
    dq_red_width: int = 1
    dq_keys: str = "cta"
    broadcast_q: bool = False
    sdp_fp8: bool = False
    next_early: int = 0
    dk_ss: bool = False
    p_scaled: bool = False
    dv_f16: bool = False
    factors_ahead: bool = False
    tune: int = 0

    def __post_init__(self):
        if self.head_dim not in (64, 128):
            raise ValueError(f"head_dim={self.head_dim} not in (64, 128)")
        if self.p_scale not in P_SCALES:
            raise ValueError(f"p_scale={self.p_scale!r} not in {P_SCALES}")
        if self.p_scale == "block" and (self.p_scaled or self.dq_mode or self.broadcast_q):
            raise ValueError(
                "p_scale='block' needs p_scaled=False (its block scales come from P itself), dq_accum='fp32', "
                "deterministic=False and broadcast_q=False"
            )
        if self.p_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"p_rounding={self.p_rounding!r} not in {SCALE_ROUNDINGS}")
        if self.p_scale == "const" and self.p_rounding != "up":
            raise ValueError("p_rounding only applies to p_scale='block' (leave it 'up' for 'const')")
        if self.dq_accum not in DQ_ACCUMS:
            raise ValueError(f"dq_accum={self.dq_accum!r} not in {DQ_ACCUMS}")
        if not isinstance(self.deterministic, bool):
            raise ValueError(f"deterministic={self.deterministic!r} is not a bool")
        if self.dq_mode and self.dq_store != "red":  # (so no overlap either: it needs "bulk")
            raise ValueError(
                f"dq_accum={self.dq_accum!r}, deterministic={self.deterministic} take dq_store='red' (per-element "
                f"adds; got {self.dq_store!r})"
            )
        if not isinstance(self.packed, bool):
            raise ValueError(f"packed={self.packed!r} is not a bool")
        if self.packed and (self.dq_mode or self.broadcast_q or self.dv_f16):
            raise ValueError(
                "packed=True needs dq_accum='fp32', deterministic=False, broadcast_q=False and dv_f16=False (one "
                "dO shift per KV head would span every sequence)"
            )
        if self.dq_store not in DQ_STORES:
            raise ValueError(f"dq_store={self.dq_store!r} not in {DQ_STORES}")
        if self.dq_store.startswith("tma") and self.overlap:
            raise ValueError(f"dq_store={self.dq_store!r} needs overlap=0 (got {self.overlap})")
        if self.dq_store in ("tma", "tma_writer") and self.dq_keys != "cta":
            raise ValueError(
                f"dq_store={self.dq_store!r} needs dq_keys='cta' (got {self.dq_keys!r}; 'tma_warp' takes 'own')"
            )
        if self.broadcast_q and self.dq_mode:
            raise ValueError(
                "broadcast_q=True sums dQ over the batch rows with float32 atomics: not with dq_accum='fp16' or "
                "deterministic=True (broadcast_query_attention's backward takes the XLA reference for those)"
            )
        if self.broadcast_q and self.dq_store.startswith("tma"):
            raise ValueError(
                f"broadcast_q=True rebases dq's address per CTA (every batch row into batch 0): not with "
                f"dq_store={self.dq_store!r} (the TMA reductions address dq by tensor-map coordinates)"
            )
        if self.overlap not in (0, 1, 2):
            raise ValueError(f"overlap={self.overlap} not in (0, 1, 2)")
        if self.overlap and self.dq_store != "bulk":
            raise ValueError(f"overlap={self.overlap} needs dq_store='bulk' (got {self.dq_store!r})")
        if not isinstance(self.smem_stats, bool):
            raise ValueError(f"smem_stats={self.smem_stats!r} is not a bool")
        if self.amax_reduce not in ("shfl", "redux"):
            raise ValueError(f"amax_reduce={self.amax_reduce!r} not in ('shfl', 'redux')")
        if not isinstance(self.stats_early, bool):
            raise ValueError(f"stats_early={self.stats_early!r} is not a bool")
        if self.stats_early and (not self.smem_stats or self.overlap):
            raise ValueError("stats_early=True needs smem_stats=True and overlap=0")
        if not isinstance(self.dq_first, bool):
            raise ValueError(f"dq_first={self.dq_first!r} is not a bool")
        if self.dq_first and (self.overlap or self.dq_keys != "cta"):
            raise ValueError("dq_first=True needs overlap=0 and dq_keys='cta'")
        if self.dq_red_width not in (1, 2, 4):
            raise ValueError(f"dq_red_width={self.dq_red_width} not in (1, 2, 4)")
        if self.dq_red_width != 1 and self.dq_store != "red":
            raise ValueError(f"dq_red_width={self.dq_red_width} needs dq_store='red'")
        if self.dq_keys not in ("cta", "own"):
            raise ValueError(f"dq_keys={self.dq_keys!r} not in ('cta', 'own')")
        if self.dq_keys == "own" and self.overlap:
            raise ValueError(f"dq_keys='own' needs overlap=0 (got {self.overlap})")
        if self.dq_keys == "own" and self.dq_store == "bulk" and self.head_dim != 64:
            raise ValueError("dq_keys='own' with dq_store='bulk' is only implemented for head_dim 64 (use 'red')")
        if not isinstance(self.sdp_fp8, bool):
            raise ValueError(f"sdp_fp8={self.sdp_fp8!r} is not a bool")
        if self.sdp_fp8 and (self.dq_mode or self.broadcast_q or self.overlap):
            raise ValueError("sdp_fp8=True needs dq_accum='fp32', deterministic=False, broadcast_q=False, overlap=0")
        if self.next_early not in (0, 1, 2):
            raise ValueError(f"next_early={self.next_early} not in (0, 1, 2)")
        if self.next_early and not self.dq_first:
            raise ValueError(f"next_early={self.next_early} needs dq_first=True (the S^T issue follows dQ's store)")
        if not isinstance(self.dk_ss, bool):
            raise ValueError(f"dk_ss={self.dk_ss!r} is not a bool")
        if not isinstance(self.p_scaled, bool):
            raise ValueError(f"p_scaled={self.p_scaled!r} is not a bool")
        if self.p_scaled and self.dq_mode:
            raise ValueError("p_scaled=True needs dq_accum='fp32', deterministic=False (the dQ modes scale dq apart)")
        if not isinstance(self.dv_f16, bool):
            raise ValueError(f"dv_f16={self.dv_f16!r} is not a bool")
        if self.dv_f16 and not (self.sdp_fp8 and self.p_scaled):
            raise ValueError("dv_f16=True needs sdp_fp8=True and p_scaled=True (dV alone reads the do operand)")
        if not isinstance(self.factors_ahead, bool):
            raise ValueError(f"factors_ahead={self.factors_ahead!r} is not a bool")
        if self.factors_ahead and (not self.sdp_fp8 or self.next_early):
            raise ValueError("factors_ahead=True needs sdp_fp8=True and next_early=0")
        if not 1 <= self.q_stage <= 4:
            raise ValueError(f"q_stage={self.q_stage} not in [1, 4]")

    @property
    def dq_mode(self) -> bool:
        """True for the dQ paths of kernels/sm90/attention_bwd_dq.py (float16 dq or the ordered adds): the
        kernel then takes the dq_sem operand and the dq scale tau 2^e as well."""
        return self.dq_accum != "fp32" or self.deterministic

    @property
    def name(self) -> str:
        base = f"attention_bwd_h{self.head_dim}{'_causal' if self.causal else ''}"
        base += ("_fp16" if self.dq_accum == "fp16" else "") + ("_det" if self.deterministic else "")
        if self.broadcast_q:
            base += "_bcastq"
        if self.p_scale == "block":
            base += "_pblock" + ("_floor" if self.p_rounding == "floor" else "")
        if self.packed:
            base += "_packed"
        return f"{base}_t{self.tune}" if self.tune else base


# Registered: the variants the GPU tests cover (tests/test_attention_bwd_kernel_gpu.py, run on the H200).
# Production (tune 0) per head_dim, PRODUCTION (docs/perf-notes.md "Attention backward (sm90)"): H128 tune 12's
# config (smem_stats, redux amax, LSE early, dQ by red.global.add.v2.f32; session 4 rounds A/B: 349.6 / 307.5
# TFLOP/s non-causal / causal at B4 T4k N16, vs 285.9 / 258.3 for smem_stats alone and 262.6 / 229.1 for v1;
# its H128 GPU test cases passed), H64 dq_store "red" (run 12: 208.5 vs 170.9 for v1's "bulk"; run 14 passed
# every GPU test case). smem_stats alone (the H128 production of rounds A/B) is tune 5 again.
# Alternatives for benchmarks/attention_bwd_kernel.py (non-production; the GPU test checks each against the
# reference and against the first tune run of the same GEMM precision, dk and dv bit for bit: tune 0 for sdp_fp8,
# the first BF16-only tuning for the others). A tuning whose config is the production one
# of a head_dim (tune 12 at H128, tune 1 at H64) is not registered for it (tuning_fields):
#   tune 1: dq_store "red"
#   tune 2: overlap 1 (the next tile's S^T issued before this tile's dQ store)
#   tune 3: overlap 2 (S^T and dP^T)
#   tune 4: overlap 2 + smem_stats (LSE and delta with the Q / dO stage, read from shared memory)
#   tune 5: smem_stats alone (v1's schedule)
#   tune 6: overlap 1 + smem_stats
#   tune 7: smem_stats + amax_reduce "redux" (one redux.sync per dS block amax instead of 5 shuffles, a tree
#           max before it) + stats_early (the LSE loads under the S^T wgmma)
#   tune 8: tune 7 + dq_keys "own" + dq_store "red" (the consumers decoupled: no 256-thread dS barrier,
#           each consumer's dQ over its own 64 keys)
#   tune 9: smem_stats + dq_store "red" (the H64 candidate: tune 1 with tune 5's stats path)
#   tune 10 (H64 only): tune 7 + dq_keys "own" + dq_store "bulk" (a staging tile per consumer)
#   tune 11: tune 8 with dq_red_width 2 (red.global.add.v2.f32)
#   tune 12: tune 7 + dq_store "red" with dq_red_width 2 (dQ over the CTA's keys)
#   tune 14: tune 12 with dq_red_width 4 (red.global.add.v4.f32 after a lane-pair exchange)
#   tune 13: v1 (dq_store "bulk", LSE / delta from global memory): production until 2026-12-01
#   tune 15: tune 7 + dq_store "tma" (the dQ tile staged in swizzled shared memory, one TMA tensor
#            reduce-add per consumer and tile instead of 16 red.v2 per thread)
#   tune 16: tune 7 + dq_store "tma_warp" (one TMA reduce-add per warp of its 16 rows: no dQ barrier)
#   tune 17: tune 16 + dq_first (the dQ store under the dK wgmma)
#   tune 18: tune 12 + dq_first (production's red.v2 store under the dK wgmma)
#   tune 20: production + dq_keys "own" with the "tma_warp" store instead of dq_first over the CTA's keys (the
#            consumers decoupled: no 256-thread dS barrier, each consumer's dQ over its own 64 keys and all
#            head-dim columns, twice the TMA reductions)
#   tune 21: tune 23 + next_early 1 (the next tile's S^T issued after this tile's dQ store, under dK)
#   tune 22: tune 23 + next_early 2 (the next tile's S^T and dP^T)
#   tune 23: production + dk_ss (dK's A operand dS^T from shared memory: SS wgmma)
#   tune 24: tune 23 + p_scaled (P computed as 2^8 P: no multiplies around Pq's FP8 rounding): the H64 production
#            since session 9 (not registered there)
#   tune 25: tune 24 with dq_store "tma_writer" (the dQ reductions issued by a writer warp of the producer
#            warpgroup instead of each consumer warp): the H128 production since session 9 (not registered there)
#   tune 26 (H128 only): tune 25 + dv_f16 (dV on float16 wgmma: Pq's E4M3 values to the A fragment by one
#            cvt per pair, dO in float16 times a power of two per (batch, KV head))
#   tune 27 (H64 only): tune 24 + dv_f16: the H64 production since session 10 (not registered there)
#   tune 28 (H128 only): tune 26 + factors_ahead (the query-block factors loaded a step early): the H128
#            production since session 10 (not registered there)
#   tune 29 (H64 only): tune 27 + factors_ahead (4-5% slower than tune 27's config at H64)
#   tune 19: tune 17 + sdp_fp8 (S^T and dP^T on FP8 wgmma from realigned FP8 copies of Q, K, V, dO): the
#            production config of session 8 (registered again since session 9's production differs)
_T7 = dict(smem_stats=True, amax_reduce="redux", stats_early=True)
_T19 = dict(_T7, dq_store="tma_warp", dq_first=True, sdp_fp8=True)  # the session 8 production
_T24 = dict(_T19, dk_ss=True, p_scaled=True)
PRODUCTION: dict[int, dict] = {
    128: dict(_T24, dq_store="tma_writer", dv_f16=True, factors_ahead=True),
    64: dict(_T24, dv_f16=True),
}
"""Tune 0's fields per head_dim: tune 17's config + sdp_fp8 (session 8, measured as tune 19: +1-5% over tune 17)
+ dk_ss + p_scaled since session 9 (2026-12-02; measured as tune 24, B4 T4k N16, two H200 runs in opposite
orders against the session 8 production: H128 non-causal +1.8 / +0.4%, causal +0.4 / +0.5%, H64 +1.8 / +1.5%;
no spills at H128 (19 before)), and at H128 the dQ writer warp (dq_store "tma_writer", tune 25: against tune
24's config in two runs, H128 +0.9 / +1.3%, causal +2.9 / +1.5%; H64 -0.6 / -0.5%, so H64 keeps "tma_warp");
docs/perf-notes.md "Session 9". Since session 10 (2026-12-03) dv_f16 at both head dims (dV on float16 wgmma, measured
as tunes 26 / 27 against the session 9 production in two H200 runs of opposite order: H128 +2.1 / +0.2%, causal
+1.8 / +1.8%, H64 +3.8 / +5.1%; dk, dv bit-equal; docs/perf-notes.md "Session 10"), so tunes 25 (H128) and 24
(H64) are the session 9 production again; and at H128 factors_ahead (tune 28 against tune 26's config, two runs
of opposite order: +6.6 / +4.9% non-causal, +6.6 / +7.2% causal; H64's tune 29 lost 4-5%, so H64 keeps
tune 27's config). Tune 23 (no p_scaled) keeps the session 8 products (dk, dv bits); tune
17 stays registered: the same schedule on BF16 wgmma only."""
TUNINGS: tuple[tuple[int, dict], ...] = (
    (0, {}),  # production: PRODUCTION[head_dim]
    (1, dict(dq_store="red")),
    (2, dict(overlap=1)),
    (3, dict(overlap=2)),
    (4, dict(overlap=2, smem_stats=True)),
    (5, dict(smem_stats=True)),
    (6, dict(overlap=1, smem_stats=True)),
    (7, dict(_T7)),
    (8, dict(_T7, dq_keys="own", dq_store="red")),
    (9, dict(smem_stats=True, dq_store="red")),
    (10, dict(_T7, dq_keys="own")),
    (11, dict(_T7, dq_keys="own", dq_store="red", dq_red_width=2)),
    (12, dict(_T7, dq_store="red", dq_red_width=2)),
    (13, dict(dq_store="bulk", smem_stats=False)),
    (14, dict(_T7, dq_store="red", dq_red_width=4)),
    (15, dict(_T7, dq_store="tma")),
    (16, dict(_T7, dq_store="tma_warp")),
    (17, dict(_T7, dq_store="tma_warp", dq_first=True)),
    (18, dict(_T7, dq_store="red", dq_red_width=2, dq_first=True)),
    (19, dict(_T19)),
    (20, dict(_T19, dq_keys="own", dq_first=False)),
    (21, dict(_T19, dk_ss=True, next_early=1)),
    (22, dict(_T19, dk_ss=True, next_early=2)),
    (23, dict(_T19, dk_ss=True)),
    (24, dict(_T24)),
    (25, dict(_T24, dq_store="tma_writer")),
    (26, dict(_T24, dq_store="tma_writer", dv_f16=True)),
    (27, dict(_T24, dv_f16=True)),
    (28, dict(_T24, dq_store="tma_writer", dv_f16=True, factors_ahead=True)),
    (29, dict(_T24, dv_f16=True, factors_ahead=True)),
)
BROADCAST_Q: dict[int, dict] = {128: dict(dict(TUNINGS)[12]), 64: dict(dict(TUNINGS)[1])}
"""The broadcast_q variants' fields: the previous production, tune 12 at H128 and tune 1 at H64 (per-element
dQ reductions; a TMA dQ store addresses dq by tensor-map coordinates, which broadcast_q's per-CTA rebase of
dq's address cannot move)."""
TUNING_HEAD_DIMS: dict[int, tuple[int, ...]] = {10: (64,), 26: (128,), 27: (64,), 28: (128,), 29: (64,)}
"""Tunings registered for some head dims only (the others: every head dim)."""


def tuning_fields(tune: int, head_dim: int) -> dict | None:
    """The config fields of tuning `tune` at head_dim (tune 0: PRODUCTION), or None where it is not
    registered: a head dim outside TUNING_HEAD_DIMS, or the same config as that head dim's production."""
    fields = dict(TUNINGS)[tune]
    if tune == 0:
        return dict(PRODUCTION[head_dim])
    if head_dim not in TUNING_HEAD_DIMS.get(tune, (head_dim,)):
        return None
    prod = AttentionBwdConfig(head_dim=head_dim, **PRODUCTION[head_dim])
    if AttentionBwdConfig(head_dim=head_dim, **fields) == prod:
        return None
    return fields


# dQ modes (kernels/sm90/attention_bwd_dq.py; tune 0 of their own key): dq_accum "fp16", deterministic
# "fp32" and "fp16"; per-element adds (dq_store "red"), tune 0's schedule otherwise.
DQ_MODES: tuple[dict, ...] = (
    dict(dq_accum="fp16"),
    dict(deterministic=True),
    dict(dq_accum="fp16", deterministic=True),
)

BLOCK_P: dict[int, dict] = {h: dict(dict(TUNINGS)[23]) for h in (128, 64)}
"""The p_scale="block" variants' fields (scale rule "up": the forward kernel's block variants take only that
rule, so a "floor" call's forward and backward both run the reference): tune 23's schedule, the production one
without p_scaled (whose 2^8 P units would move the block scales of P blocks below 2^-117), dq_store "tma_warp"
and dv on bfloat16 wgmma (dv_f16 needs p_scaled). dk equals tune 23's bit for bit (dS does not read Pq)."""

PACKED: dict[int, dict] = {128: dict(dict(TUNINGS)[25]), 64: dict(dict(TUNINGS)[24])}
"""The packed variants' fields (varlen_attention's backward on the aligned packed layout, p_scale "const"): the
session 9 productions, i.e. production without dv_f16 (H128 also without factors_ahead, measured with dv_f16
only), so dk, dv equal the dense path's on the same sequences bit for bit."""

# broadcast_q (broadcast_query_attention): BROADCAST_Q's schedule only.
ATTENTION_BWD_VARIANTS: tuple[AttentionBwdConfig, ...] = (
    tuple(
        AttentionBwdConfig(head_dim=h, causal=c, tune=tune, **tuning_fields(tune, h))
        for h in (128, 64)
        for c in (False, True)
        for tune, _ in TUNINGS
        if tuning_fields(tune, h) is not None
    )
    + tuple(
        AttentionBwdConfig(head_dim=h, causal=c, dq_store="red", **mode)
        for h in (128, 64)
        for c in (False, True)
        for mode in DQ_MODES
    )
    + tuple(
        AttentionBwdConfig(head_dim=h, causal=c, broadcast_q=True, **BROADCAST_Q[h])
        for h in (128, 64)
        for c in (False, True)
    )
    + tuple(
        AttentionBwdConfig(head_dim=h, causal=c, p_scale="block", **BLOCK_P[h])
        for h in (128, 64)
        for c in (False, True)
    )
    + tuple(
        AttentionBwdConfig(head_dim=h, causal=c, packed=True, **PACKED[h]) for h in (128, 64) for c in (False, True)
    )
)
