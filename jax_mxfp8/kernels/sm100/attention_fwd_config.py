"""Compile-time configuration of the Blackwell MXFP8 attention forward (kernels/sm100/attention_fwd.py). Pure
Python (no DSL): the variant list, the operand interface a handler checks, and every resource that can be
known without compiling (shared memory of the storage struct, TMEM columns from the declared map, register
budgets per warp role, TMA transaction bytes).

What a variant computes is primitives/attention_sm100_emulation.emulate_fwd_sm100 (dense, broadcast query) and
primitives/attention_sm100_packed.emulate_packed_fwd_sm100 (packed jagged sequences), domain "log2":
block-scaled S = Q K^T and O += P V (tcgen05.mma kind::mxf8f6f4 block_scale, UTCQMMA) with S and O in tensor
memory, keys in ascending 128-key tiles, the exact running max, P quantized online (p_scale "const": E4M3(2^8
P~) with byte 0x77; "block": per 32 keys, rule "up"), O / l in bfloat16 and LSE in float32.

The TMEM columns come from kernels/sm100/attention_tmem.forward_map (the map the CPU test proves free of
live overlaps); tools/check_sm100_attention_fwd.py compares the compiled cubin's tcgen05.alloc, scale copies and
MMA operands with it. No variant has run on a Blackwell GPU (none exists on this project's machines).
"""

from __future__ import annotations

import dataclasses
import itertools

from jax_mxfp8.kernels.registry.base import P_SCALE_CODE, P_SCALES
from jax_mxfp8.kernels.sm100 import attention_tmem
from jax_mxfp8.kernels.sm100.attention_geometry import HEAD_DIMS, REGISTER_FILE, SCALE_CHUNK, SMEM_LIMIT, TILE
from jax_mxfp8.kernels.sm100.tmem_map import TmemMap

TILE_M = TILE
"""Query rows per Q tile (the MMA's M, one TMEM lane per row); a CTA work item is two Q tiles."""
Q_STAGES = 2
"""Q tiles per work item (FA4's two softmax warpgroups, one per tile)."""
ITEM_ROWS = TILE_M * Q_STAGES
TILE_N = TILE
"""Keys per KV tile (the contract's kv_tile default)."""
MMA_K = 32

SOFTMAX_WARPS = (0, 1, 2, 3, 4, 5, 6, 7)
"""Softmax warpgroup s = warps 4 s .. 4 s + 3: Q tile s, one thread per row (TMEM lane 32 (w % 4) + lane)."""
CORRECTION_WARPS = (8, 9, 10, 11)
"""O rescale and the epilogue's TMEM -> registers -> shared memory pass (both Q tiles, one row per thread)."""
MMA_WARP = 12
EPILOGUE_WARP = 13
"""TMA store of O from shared memory."""
LOAD_WARP = 14
IDLE_WARP = 15
REGISTERS = {"softmax": 168, "correction": 80, "other": 96}
"""setmaxnreg budget per thread of each role (FA4's split): softmax holds a 128-column row of S; 8 softmax,
4 correction and 4 other warps use exactly the 64 K registers of the SM."""
KV_STAGES = {64: 8, 128: 6}
"""K / V ring stages (K and V tiles take one stage each): as many as fit next to Q, O and the scales."""

SHORT = {"const": "", "block": "_pblock"}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclasses.dataclass(frozen=True)
class AttentionFwdSm100Config:
    """One compiled Blackwell attention forward.

    Attributes:
      head_dim: 64 or 128 (Q, K, V and O).
      causal: top-left causal masking (query i sees keys j <= i, counted from its sequence's start).
      p_scale: "const" (P~ stored as E4M3(2^8 P~), scale byte 0x77) or "block" (one E8M0 byte per 32 keys of a
        row, rule "up", from the block's max P~; applied by the PV MMA itself).
      packed: packed jagged sequences in one batch row (varlen): data compact, scale chunks per sequence
        (split addressing), a work list of (sequence, Q tile pair) items.
      broadcast_q: one query sequence (batch 1) against every batch row's keys and values.
      kv_stages: K / V ring stages in shared memory (0: KV_STAGES[head_dim]).
      tune: 0 for the production variant; > 0 for comparison schedules (none are built yet).
    """

    head_dim: int = 128
    causal: bool = False
    p_scale: str = "const"
    packed: bool = False
    broadcast_q: bool = False
    kv_stages: int = 0
    tune: int = 0

    op = "attention_fwd_sm100"
    key_fields = ("head_dim", "causal", "p_scale", "packed", "broadcast_q")

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim={self.head_dim} not in {HEAD_DIMS}")
        if self.p_scale not in P_SCALES:
            raise ValueError(f"p_scale={self.p_scale!r} not in {P_SCALES}")
        if self.packed and self.broadcast_q:
            raise ValueError("broadcast_q is a dense-batch variant (packed=False)")
        if not self.kv_stages:
            object.__setattr__(self, "kv_stages", KV_STAGES[self.head_dim])
        if self.kv_stages < 2 or self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"kv_stages={self.kv_stages}: needs >= 2 and {self.smem_bytes} <= {SMEM_LIMIT} B")
        self.tmem_map().check()
        used = sum(REGISTERS[r] * n for r, n in (("softmax", 8), ("correction", 4), ("other", 4))) * 32
        assert used <= REGISTER_FILE, used

    # ---------------------------------------------------------------------------------------------- naming
    @property
    def name(self) -> str:
        base = f"attention_fwd_sm100_h{self.head_dim}{'_causal' if self.causal else ''}{SHORT[self.p_scale]}"
        base += "_packed" if self.packed else ""
        base += "_bcastq" if self.broadcast_q else ""
        return f"{base}_t{self.tune}" if self.tune else base

    @property
    def key(self) -> dict[str, int]:
        """The named integer parameters a handler checks (the kernel table's convention,
        kernels/registry/base.KernelConfig.key): the key fields (p_scale by P_SCALE_CODE) and tune."""
        out = {f: int(getattr(self, f)) for f in self.key_fields if f != "p_scale"}
        out["p_scale"] = P_SCALE_CODE[self.p_scale]
        out["tune"] = self.tune
        return {f: out[f] for f in (*self.key_fields, "tune")}

    # ------------------------------------------------------------------------------------ the operands
    @property
    def tensor_names(self) -> tuple[str, ...]:
        """The host function's tensors, in argument order (then the float scale_log2, then the stream):
        q, q_sf_hd, k, k_sf_hd, v, v_sf_seq, then lens (dense) or seqs, work (packed), then the outputs o, lse."""
        tables = ("seqs", "work") if self.packed else ("lens",)
        return ("q", "q_sf_hd", "k", "k_sf_hd", "v", "v_sf_seq", *tables, "o", "lse")

    def unsupported(self, *, batch: int, q_batch: int, t: int, s: int, heads: int, kv_heads: int) -> str | None:
        """Why the variant cannot take a problem (None = it can); dense / broadcast shapes: q (q_batch, t, heads,
        H), k and v (batch, s, kv_heads, H). Packed: batch = q_batch = 1, t and s the packed row counts."""
        if min(batch, q_batch, heads, kv_heads) <= 0 or t < 0 or s < 0:
            return f"batch={batch}, q_batch={q_batch}, heads={heads}, kv_heads={kv_heads} must be positive"
        if heads % kv_heads:
            return f"heads={heads} must be a multiple of kv_heads={kv_heads} (GQA / MQA)"
        if q_batch != (1 if (self.broadcast_q or self.packed) else batch):
            return f"q_batch={q_batch} must be {1 if (self.broadcast_q or self.packed) else batch}"
        if self.packed and batch != 1:
            return "packed operands hold one batch row"
        rows = max(batch * t, batch * s)
        if rows >= 2**30 or max(batch * t * heads, batch * s * kv_heads) * self.head_dim >= 2**31:
            return "operands or O of 2^31 elements or 2^30 rows or more (32-bit offsets, ragged TMA coordinates)"
        return None

    # ------------------------------------------------------------------------------------------ resources
    @property
    def tile_bytes(self) -> int:
        """E4M3 bytes of one Q, K or V tile (128 rows x head_dim; V as head_dim x 128)."""
        return TILE_M * self.head_dim

    @property
    def tx_bytes(self) -> dict[str, int]:
        """TMA transaction bytes of one stage: a Q tile or a K / V tile with its 512-byte scale chunk (H 64
        loads the whole chunk: the MMA's K = 64 uses its first two K blocks)."""
        return {"q": self.tile_bytes + SCALE_CHUNK, "kv": self.tile_bytes + SCALE_CHUNK}

    @property
    def o_tile_bytes(self) -> int:
        """One Q tile of O in bfloat16 in shared memory (the TMA store's source)."""
        return TILE_M * self.head_dim * 2

    @property
    def smem_bytes(self) -> int:
        """The storage struct of kernels/sm100/attention_fwd.py, in declaration order: mbarriers (Q full /
        empty 2 + 2, KV ring 2 x stages, then 2 each of S full, P ready, O full, softmax stats, final stats
        full / empty, epilogue full / empty), the TMEM address word, softmax statistics (alpha, row sum,
        row max: 3 x 2 x 128 float32), then sO (1024-aligned, 2 tiles of bfloat16), sQ (2 tiles), sKV
        (stages tiles), then 128-aligned scale buffers: sSFQ (2 chunks), sSFK, sSFV (stages chunks each),
        sSFP (2 chunks: P's scale bytes)."""
        barriers = 2 * Q_STAGES + 2 * self.kv_stages + 8 * Q_STAGES
        size = 8 * barriers + 4
        size = _round_up(size, 4) + 3 * Q_STAGES * TILE_M * 4
        size = _round_up(size, 1024) + Q_STAGES * self.o_tile_bytes
        size = _round_up(size, 1024) + Q_STAGES * self.tile_bytes
        size = _round_up(size, 1024) + self.kv_stages * self.tile_bytes
        for chunks in (Q_STAGES, self.kv_stages, self.kv_stages, Q_STAGES):
            size = _round_up(size, 128) + chunks * SCALE_CHUNK
        return _round_up(size, 1024)

    def ordered_tmem_map(self) -> attention_tmem.OrderedTmemMap:
        """The forward's TMEM map with its happens-before proof (kernels/sm100/attention_tmem.py)."""
        return attention_tmem.forward_map(self.head_dim)

    def tmem_map(self) -> TmemMap:
        """The same regions as the kernels' common declaration (one linearization of the order)."""
        return self.ordered_tmem_map().as_tmem_map()

    @property
    def tmem_columns(self) -> dict[str, int]:
        """First column of each region kind (S_0, S_1, P_0, P_1, O_0, O_1, SF_QK_0, SF_QK_1, SF_PV_0, SF_PV_1):
        the kernel's TMEM offsets, read from the declared map. A scale slot holds the MMA's SFA in its first
        attention_tmem.SF_COLS columns and SFB in the next."""
        cols: dict[str, int] = {}
        for r in self.ordered_tmem_map().regions:
            kind = r.name.split("@")[0]
            if cols.setdefault(kind, r.start) != r.start:
                raise ValueError(f"{self.name}: region kind {kind} moves between iterations")
        return cols

    @property
    def tmem_alloc_columns(self) -> int:
        """Columns the kernel allocates (tcgen05.alloc): the declared map's allocation."""
        return self.tmem_map().alloc_columns

    @property
    def scale_copy_columns(self) -> tuple[int, ...]:
        """TMEM columns of every tcgen05.cp destination the kernel issues (SFA, SFB of both QK and PV slots)."""
        c = self.tmem_columns
        step = attention_tmem.SF_COLS
        return tuple(sorted(c[k] + i * step for k in ("SF_QK_0", "SF_QK_1", "SF_PV_0", "SF_PV_1") for i in (0, 1)))


_PRODUCTION = tuple(
    AttentionFwdSm100Config(head_dim=h, causal=c, p_scale=p, packed=packed, broadcast_q=bq)
    for h, c, p in itertools.product(HEAD_DIMS, (False, True), P_SCALES)
    for packed, bq in ((False, False), (True, False), (False, True))
)
ATTENTION_FWD_SM100_VARIANTS: tuple[AttentionFwdSm100Config, ...] = _PRODUCTION
"""Every compiled variant: head_dim {64, 128} x causal x p_scale {const, block} x {dense, packed, broadcast_q}
(24), all production (tune 0). No comparison schedule is built: none can be timed without a Blackwell GPU."""


def find_variant(**key) -> AttentionFwdSm100Config:
    """The production variant with these key fields (ValueError naming the fields when none matches)."""
    for v in ATTENTION_FWD_SM100_VARIANTS:
        if v.tune == 0 and all(getattr(v, f) == value for f, value in key.items()):
            return v
    raise ValueError(f"no sm100 attention forward variant with {key}")
