"""Hopper attention variants: the forward kernel (kernels/sm90/attention_fwd.py) and its producer's realign
kernel (kernels/sm90/attention_realign.py), both sm_90a only (wgmma), plus the numerics constants they share with
the primitives layer.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from jax_mxfp8.kernels.registry.base import (
    P_SCALE_CODE,
    P_SCALES,
    ROUNDING_CODE,
    SCALE_ROUNDINGS,
    KernelConfig,
)


@dataclasses.dataclass(frozen=True)
class AttentionFwdConfig(KernelConfig):
    """MXFP8 attention forward (kernels/sm90/attention_fwd.py): one variant per head_dim x causal.

    Attributes:
      head_dim: 64 or 128.
      causal: top-left causal masking (query i sees keys j <= i).
      kv_stage: K/V tiles in flight in shared memory (K and V take one stage each).
      overlap: issue the next tile's Q K^T wgmma before the current tile's P V and run its softmax while
        P V is in flight (FA3's intra-warpgroup overlap). False: strictly sequential per warpgroup.
      p_scale: the contract's AttentionConfig.p_scale. "const": P~ stored as E4M3(256 P~). "block": one
        power-of-two scale per (query row, 128-key tile), the one the contract's block rule gives for the
        row-tile's amax (docs/numerics.md "Hopper attention kernel").
      p_rounding: with p_scale="block", the scale rule: "up" (AttentionConfig.scale_rounding default) or
        "floor" (implemented, not registered: see ATTENTION_FWD_VARIANTS). Must be "up" (unused) for "const".
      pv_fp32: each KV tile's O += P V runs on a fresh wgmma accumulator, added to acc_O by float32 FADDs,
        instead of chaining every tile's wgmma onto acc_O: Hopper's FP8 wgmma accumulates with fewer bits
        than float32 (DeepSeek-V3 measured ~14), which loses long sums of small addends next to a large one
        (an attention sink; docs/numerics.md). Costs 64 FADDs (H128) and H/2 registers per thread and tile.
      packed: packed jagged sequences (varlen): one batch row holds every sequence, each starting on a
        128-row tile, and the grid runs a work list of (sequence, query tile) items instead of the padded
        (B, Tp) grid.
      broadcast_q: one query sequence for every batch row (broadcast_query_attention): q and qs hold batch 1
        and every CTA reads its head's Q tile and Q scales at batch 0; O and LSE stay per batch row.
      tune: 0 for the production variant; > 0 for the comparison schedules (benchmarks only).
    """

    op = "attention_fwd"
    kernels = {"sm_90a": "jax_mxfp8.kernels.sm90.attention_fwd:make_kernel"}  # wgmma: Hopper only
    key_fields = ("head_dim", "causal", "p_scale", "p_rounding", "packed", "broadcast_q")
    codes = {"p_scale": P_SCALE_CODE, "p_rounding": ROUNDING_CODE}

    head_dim: int = 128
    causal: bool = False
    kv_stage: int = 4
    overlap: bool = False
    p_scale: str = "const"
    p_rounding: str = "up"
    pv_fp32: bool = True
    packed: bool = False
    broadcast_q: bool = False
    tune: int = 0

    def __post_init__(self):
        if self.head_dim not in (64, 128):
            raise ValueError(f"head_dim={self.head_dim} not in (64, 128)")
        if self.broadcast_q and self.packed:
            raise ValueError("broadcast_q is a dense-batch variant (packed=False)")
        if not 2 <= self.kv_stage <= 12 or self.kv_stage % 2:
            raise ValueError(f"kv_stage={self.kv_stage} must be even in [2, 12]")
        if self.p_scale not in P_SCALES:
            raise ValueError(f"p_scale={self.p_scale!r} not in {P_SCALES}")
        if self.p_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"p_rounding={self.p_rounding!r} not in {SCALE_ROUNDINGS}")
        if self.p_scale == "const" and self.p_rounding != "up":
            raise ValueError("p_rounding only applies to p_scale='block' (leave it 'up' for 'const')")

    @property
    def name(self) -> str:
        base = f"attention_fwd_h{self.head_dim}{'_causal' if self.causal else ''}"
        if self.p_scale == "block":
            base += "_pblock" if self.p_rounding == "up" else f"_pblock_{self.p_rounding}"
        if self.packed:
            base += "_packed"
        if self.broadcast_q:
            base += "_bcastq"
        if self.pv_fp32 != (self.head_dim == 64):  # not the production accumulation (see _pv_fp32)
            base += "_pvfp32" if self.pv_fp32 else "_pvchain"
        return f"{base}_t{self.tune}" if self.tune else base


@dataclasses.dataclass(frozen=True)
class AttentionRealignConfig(KernelConfig):
    """The attention producer's re-encode + transpose (kernels/sm90/attention_realign.py).

    Attributes:
      head_dim: 64 or 128.
      operand: "rows" (Q, K: sequence-major (B, L, N, H) -> head-major (B, N, Lp, H)) or "v" (V ->
        V'^T (B, K, H, Lp) with the keys of every 32 in pv_permutation order).
    """

    op = "attention_realign"
    kernels = {"sm_90a": "jax_mxfp8.kernels.sm90.attention_realign:make_kernel"}  # the Hopper kernel's producer
    key_fields = ("head_dim", "operand")
    codes = {"operand": {"rows": 0, "v": 1}}

    head_dim: int = 128
    operand: str = "rows"

    def __post_init__(self):
        if self.head_dim not in (64, 128):
            raise ValueError(f"head_dim={self.head_dim} not in (64, 128)")
        if self.operand not in ("rows", "v"):
            raise ValueError(f"operand={self.operand!r} not in ('rows', 'v')")

    @property
    def name(self) -> str:
        return f"attention_realign_{self.operand}_h{self.head_dim}"


def _pv_fp32(head_dim: int) -> bool:
    """Production P V accumulation: float32 on the CUDA cores at H64; chained on the wgmma accumulator at
    H128, where the extra 64 registers per thread spill (98 STL/LDL in the consumer;
    docs/perf/journal/perf-notes.md)."""
    return head_dim == 64


def _const(h: int, c: bool, tune: int, overlap: bool = True, pv_fp32: bool | None = None) -> AttentionFwdConfig:
    """A p_scale "const" dense variant: production's K / V stages (8 at H64, 4 at H128) and P V accumulation
    unless pv_fp32 is given."""
    pv = _pv_fp32(h) if pv_fp32 is None else pv_fp32
    kv_stage = 8 if h == 64 else 4
    return AttentionFwdConfig(head_dim=h, causal=c, kv_stage=kv_stage, overlap=overlap, pv_fp32=pv, tune=tune)


# Production (tune 0): the intra-warpgroup overlap. The two comparison schedules (benchmarks/attention.py; built
# with tools/build_library.py --with-tunes): tune 1, serial per warpgroup (what the overlap buys); tune 6, the
# other P V accumulation (what float32 accumulation costs at H64, and its spills at H128). Measurements, and the
# schedules no longer built: docs/perf/removed-variants.md.
_ATTENTION_FWD_CONST: tuple[AttentionFwdConfig, ...] = tuple(
    _const(h, c, tune, **kw)
    for h, c in itertools.product((64, 128), (False, True))
    for tune, kw in ((0, {}), (1, dict(overlap=False)), (6, dict(pv_fp32=not _pv_fp32(h))))
)
# p_scale="block": the production scheduling of each (head_dim, causal) only (the tunings reorder when work
# is issued, not the arithmetic), P scale rule "up" only. The kernel implements "floor" too, but one scale
# per row-tile cannot reproduce that rule's saturation of P elements (a 32-key block whose amax has a
# mantissa >= 1.75 clips it to 448 * 2^(floor(log2 amax) - 8)): 36.8-40.5 dB from the reference, below the
# 40 dB gate (docs/numerics.md), so "floor" takes the XLA path.
# Packed sequences (varlen_attention): the production scheduling with either P scale. One query sequence
# broadcast over the batch (broadcast_query_attention): the production dense scheduling with either P scale.
ATTENTION_FWD_VARIANTS: tuple[AttentionFwdConfig, ...] = _ATTENTION_FWD_CONST + tuple(
    dataclasses.replace(v, p_scale=p_scale, packed=packed, broadcast_q=bcast)
    for v in _ATTENTION_FWD_CONST
    if v.tune == 0
    for p_scale, packed, bcast in (
        ("block", False, False),
        ("const", True, False),
        ("block", True, False),
        ("const", False, True),
        ("block", False, True),
    )
)
ATTENTION_REALIGN_VARIANTS: tuple[AttentionRealignConfig, ...] = tuple(
    AttentionRealignConfig(head_dim=h, operand=o) for h, o in itertools.product((64, 128), ("rows", "v"))
)


P_CONST_OFFSET = 8
"""The attention kernel's P units: p_scale="const" stores E4M3(P~ * 2^8); l is always kept in 2^-8 units."""
P_OFFSET_MAX = 24
"""p_scale="block": the largest per-(row, tile) P offset (P~ stored as E4M3(P~ * 2^offset)). acc_O is kept in
the current tile's P units, so its bound grows with 2^offset: 2^24 keeps it below 2^24 * S * 448 * 2^V_SPREAD
(< 2^128 for S < 2^31); tiles whose max lies below 2^-15 of the row's max get this offset instead of their
own (their elements below 2^-30 of the row max become E4M3 subnormals; docs/numerics.md)."""
LOG2_E4M3_MAX = math.log2(448.0)
"""log2 of E4M3's largest value: the "up" rule's scale for a tile whose max is 2^-d is 2^ceil(-d - log2 448)."""


def pv_permutation() -> tuple[int, ...]:
    """The attention kernel's key order for O += P V: k-slot a = 16h + 4q + i of the 8-bit wgmma A fragment
    holds key 16h + 8(i // 2) + 2q + (i % 2) of its 32-key chunk (the S accumulator's order, so P needs no
    shuffles). The producer pass stores V'^T with its keys in this order (kernels/sm90/attention_fwd.py)."""
    perm = []
    for a in range(32):
        h, q, i = a // 16, (a % 16) // 4, a % 4
        perm.append(16 * h + 8 * (i // 2) + 2 * q + (i % 2))
    return tuple(perm)
