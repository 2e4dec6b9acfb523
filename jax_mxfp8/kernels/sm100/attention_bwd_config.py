"""Compile-time configuration of the Blackwell MXFP8 attention backward (kernels/sm100/attention_bwd.py) and
its dO / Delta pre-pass (kernels/sm100/attention_bwd_prepass.py). Pure Python (no DSL import).

  AttentionBwdSm100Config          one compiled backward variant (frozen, named fields)
  ATTENTION_BWD_SM100_VARIANTS     production for the feature set, plus the comparison schedule(s)
  AttentionBwdPrepassConfig        one compiled pre-pass variant; ATTENTION_BWD_PREPASS_VARIANTS
  tmem_columns(head_dim)           the backward's TMEM columns, read from the declared map
                                   (kernels/sm100/attention_tmem.backward_map)

The arithmetic of every variant is primitives/attention_bwd_sm100_emulation.py's (packed:
attention_sm100_packed.py); the design is docs/perf/blackwell-attention.md "Backward". None of these kernels
has run on a GPU: they are compiled for sm_100f and checked statically (tools/check_sm100_attention_bwd.py).

Operand order of the backward (the host function's arguments, 2-D views: docs/interfaces.md "sm100 attention";
a future FFI handler passes them in this order and checks the shapes and the key fields below):
  q, q_sf_hd, q_sf_seq, k, k_sf_hd, k_sf_seq, v, v_sf_hd, do, do_sf_hd, do_sf_seq,   (Sm100Operand parts)
  lse, delta, lens (dense: (2, B) query / key lengths) or seqs, key_tiles (packed: the tables of
  primitives/attention_sm100_packed.packed_tables), [dq_sem (deterministic)], dq, then dk, dv (dkv "float32")
  or dk_row, dk_row_scale, dk_col, dk_col_scale, dv_row, dv_row_scale, dv_col, dv_col_scale (dkv "mx"), then
  the scalars scale (tau), scale_log2 and dq_scale (tau 2^e for dq_accum "fp16", tau otherwise), and the
  stream.
"""

from __future__ import annotations

import dataclasses

from jax_mxfp8.kernels.registry.attention_bwd import DQ_ACCUM_CODE, DQ_ACCUMS
from jax_mxfp8.kernels.registry.base import P_SCALE_CODE, P_SCALES
from jax_mxfp8.kernels.sm100.attention_geometry import BLOCK, HEAD_DIMS, SCALE_CHUNK, SMEM_LIMIT, TILE
from jax_mxfp8.kernels.sm100.attention_tmem import SF_COLS, backward_map
from jax_mxfp8.kernels.sm100.tmem_map import TmemMap

DKV_OUTPUTS = ("float32", "mx")

# Warp roles (16 warps, 512 threads; one CTA per (128-key tile, KV head, batch row or sequence)).
REDUCE_WARPS = (0, 1, 2, 3)
"""dQ: TMEM -> registers -> x dq_scale -> global (bulk reduce-add or the deterministic ordered adds)."""
COMPUTE_WARPS = tuple(range(4, 12))
"""P and dS (two warpgroups: warps 4-7 take queries 0-63 of a step, 8-11 queries 64-127; each thread one key
row = TMEM lane 32 (w % 4) + lane), then the dK / dV epilogue."""
MMA_WARP = 12
LOAD_WARP = 13
IDLE_WARPS = (14, 15)
"""Warpgroup 3 (MMA, load, two idle warps) shares one register budget: setmaxnreg is per warpgroup."""
REGISTERS = {"reduce": 64, "compute": 168, "other": 112}
"""setmaxnreg per warpgroup: 128 (120 + 56) + 256 * 168 = 65536, the register file. The kernel launches
with 128 per thread (512 threads) and moves registers from warpgroups 0 and 3 to the compute warpgroups."""

# Named barriers (0 is __syncthreads).
BAR_TMEM_ALLOC = 1
BAR_REDUCE = 2
BAR_COMPUTE_PAIR = 3
"""3 .. 6: the two compute warps w and w + 4 (the same TMEM lane quarter): "S drained" / "dP drained" before
P^T / dS^T overwrite the accumulator columns the other warp may still be loading."""
BAR_COMPUTE = 7
"""All 256 compute threads (epilogue)."""


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def tmem_columns(head_dim: int) -> dict[str, int]:
    """First TMEM column of each region of the backward (step-0 instances of kernels/sm100/attention_tmem's
    backward_map): S^T, P^T, dP^T, dS^T, dQ, dV, dK and the scale slots SF_S, SF_dP, SF_dV, SF_dK, SF_dQ (each
    SFA at the slot, SFB at slot + SF_COLS)."""
    cols = {}
    for r in backward_map(head_dim).regions:
        name = r.name.split("@")[0]
        cols.setdefault(name, r.start)
    return cols


@dataclasses.dataclass(frozen=True)
class AttentionBwdSm100Config:
    """One compiled sm100 attention backward.

    Attributes:
      head_dim: 64 or 128.
      causal: top-left causal masking; key tiles skip the query tiles above their diagonal.
      p_scale: dV's P operand, "const" (E4M3(2^8 P) with the scale byte 0x77) or "block" (one E8M0 byte per
        32 queries of a key, rule "up", from the thread's own 32 values).
      dq_accum: "fp32" (float32 dq, bulk reduce-adds) or "fp16" (float16 dq holding dQ 2^e, e the call's
        dq_scale_log2: the kernel gets tau 2^e as dq_scale).
      deterministic: dQ's adds in ascending key-tile order (a per-query-tile semaphore, dq_sem), bit-identical
        across runs; False: reduce-adds in any order.
      packed: packed jagged sequences (batch 1, compact rows, the packed_tables encoding; ragged TMA boxes bounded at
        each sequence's end). dq_accum "fp32", not deterministic, dkv "float32".
      dkv: "float32" (dk, dv (B, S, K, H)) or "mx" (MXGradient of bfloat16(dk), bfloat16(dv) written by the
        epilogue: row blocks of 32 features and column blocks of 32 tokens, scale rule "up"; dense only,
        S % 32 == 0).
      stages: Q / dO / LSE+Delta ring depth in shared memory.
      tune: 0 for the production variant of its key; > 0 for comparison schedules.
    """

    head_dim: int = 128
    causal: bool = False
    p_scale: str = "const"
    dq_accum: str = "fp32"
    deterministic: bool = False
    packed: bool = False
    dkv: str = "float32"
    stages: int = 2
    tune: int = 0

    key_fields = ("head_dim", "causal", "p_scale", "dq_accum", "deterministic", "packed", "dkv")
    """The fields that with `tune` identify a variant (a future handler checks them as named integers)."""
    codes = {"p_scale": P_SCALE_CODE, "dq_accum": DQ_ACCUM_CODE, "dkv": {"float32": 0, "mx": 1}}

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim={self.head_dim} not in {HEAD_DIMS}")
        for name in ("causal", "deterministic", "packed"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} is not a bool")
        if self.p_scale not in P_SCALES:
            raise ValueError(f"p_scale={self.p_scale!r} not in {P_SCALES}")
        if self.dq_accum not in DQ_ACCUMS:
            raise ValueError(f"dq_accum={self.dq_accum!r} not in {DQ_ACCUMS}")
        if self.dkv not in DKV_OUTPUTS:
            raise ValueError(f"dkv={self.dkv!r} not in {DKV_OUTPUTS}")
        if self.packed and (self.dq_accum != "fp32" or self.deterministic or self.dkv != "float32"):
            raise ValueError("packed=True needs dq_accum='fp32', deterministic=False and dkv='float32'")
        if self.stages not in (2, 3):
            raise ValueError(f"stages={self.stages} not in (2, 3)")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"{self.name}: {self.smem_bytes} B of shared memory > {SMEM_LIMIT}")
        self.tmem_map().check()

    # ------------------------------------------------------------------------------------------ naming
    @property
    def name(self) -> str:
        base = f"attention_bwd_sm100_h{self.head_dim}" + ("_causal" if self.causal else "")
        base += "_pblock" if self.p_scale == "block" else ""
        base += "_fp16" if self.dq_accum == "fp16" else ""
        base += "_det" if self.deterministic else ""
        base += "_packed" if self.packed else ""
        base += "_mxdkv" if self.dkv == "mx" else ""
        return f"{base}_t{self.tune}" if self.tune else base

    def key(self) -> dict[str, int]:
        """The key fields as named integers (bools as 0 / 1, strings by `codes`)."""
        out = {}
        for f in self.key_fields:
            v = getattr(self, f)
            out[f] = self.codes[f][v] if f in self.codes else int(v)
        return {**out, "tune": self.tune}

    # ------------------------------------------------------------------------------------- operands
    @property
    def inputs(self) -> tuple[str, ...]:
        tables = ("seqs", "key_tiles") if self.packed else ("lens",)
        return ("q", "q_sf_hd", "q_sf_seq", "k", "k_sf_hd", "k_sf_seq", "v", "v_sf_hd", "do", "do_sf_hd",
                "do_sf_seq", "lse", "delta", *tables)  # fmt: skip

    @property
    def outputs(self) -> tuple[str, ...]:
        sem = ("dq_sem",) if self.deterministic else ()
        if self.dkv == "mx":
            mx = tuple(f"{t}_{o}{s}" for t in ("dk", "dv") for o in ("row", "col") for s in ("", "_scale"))
            return (*sem, "dq", *mx)
        return (*sem, "dq", "dk", "dv")

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return self.inputs + self.outputs

    # ------------------------------------------------------------------------------------ resources
    @property
    def tile_bytes(self) -> int:
        """One 128-row E4M3 tile of Q, K, V or dO (128 x head_dim bytes)."""
        return TILE * self.head_dim

    @property
    def q_stage_tx(self) -> int:
        """Bytes the Q stage's loads bring in: the tile and its two scale chunks ("hd" and "seq")."""
        return self.tile_bytes + 2 * SCALE_CHUNK

    @property
    def kv_tx(self) -> int:
        """Bytes of the once-per-CTA loads: K and V tiles, K "hd" and "seq" chunks, V "hd" chunk."""
        return 2 * self.tile_bytes + 3 * SCALE_CHUNK

    @property
    def dq_row_bytes(self) -> int:
        """Bytes one reduce thread stages of its dQ row per step: float16 for the float16 bulk reduce-add,
        float32 otherwise (the deterministic float16 mode adds the float32 partial itself)."""
        return self.head_dim * (2 if self.dq_accum == "fp16" and not self.deterministic else 4)

    MBARRIERS = (
        ("kv_full", 1), ("q_full", "stages"), ("q_empty", "stages"), ("do_full", "stages"),
        ("do_empty", "stages"), ("stats_full", "stages"), ("stats_empty", "stages"), ("s_full", 1),
        ("s_drained", 1), ("p_full", 1), ("dp_full", 1), ("dp_drained", 1), ("ds_full", 1), ("dq_full", 1),
        ("dq_drained", 1), ("dkv_full", 1),
    )  # fmt: skip
    """The storage struct's mbarriers, in order (count or "stages")."""

    @property
    def mbarrier_count(self) -> int:
        return sum(self.stages if n == "stages" else n for _, n in self.MBARRIERS)

    @property
    def smem_regions(self) -> tuple[tuple[str, int, int], ...]:
        """(name, bytes, alignment) of the storage struct after the mbarriers and the TMEM address word, in
        order: sK, sV (once), sQ, sdO (stages), sdS (the dS tile for dQ), the scale chunks (K "hd", K "seq",
        V "hd"; per stage Q "hd", Q "seq", dO "hd", dO "seq"; P's, dS^T's (rows = keys) and dS's (rows =
        queries) written by the compute warps), LSE and Delta per stage, the dQ staging rows (one per reduce
        thread)."""
        t, st = self.tile_bytes, self.stages
        return (
            ("sK", t, 1024),
            ("sV", t, 1024),
            ("sQ", st * t, 1024),
            ("sdO", st * t, 1024),
            ("sdS", TILE * TILE, 1024),
            ("sSF_kv", 3 * SCALE_CHUNK, 128),
            ("sSF_q", st * 2 * SCALE_CHUNK, 128),
            ("sSF_do", st * 2 * SCALE_CHUNK, 128),
            ("sSF_c", 3 * SCALE_CHUNK, 128),
            ("sStats", st * 2 * TILE * 4, 128),
            ("sdQ", len(REDUCE_WARPS) * 32 * self.dq_row_bytes, 128),
        )

    @property
    def smem_bytes(self) -> int:
        """The storage struct's size (tools/check_sm100_attention_bwd.py compares it with the traced struct)."""
        size = 8 * self.mbarrier_count + 4
        for _, nbytes, align in self.smem_regions:
            size = _round_up(size, align) + nbytes
        return _round_up(size, 1024)

    def tmem_map(self) -> TmemMap:
        """The declared TMEM map (kernels/sm100/attention_tmem.backward_map as the common TmemMap)."""
        return backward_map(self.head_dim).as_tmem_map()

    @property
    def tmem(self) -> dict[str, int]:
        return tmem_columns(self.head_dim)

    def unsupported(self, b: int, t: int, s: int, n: int, n_kv: int, bq: int) -> str | None:
        """Why the variant cannot take a problem (None = it can): batch b (q batch bq: b, or 1 for
        broadcast_query_attention), T queries, S keys, N query heads over n_kv KV heads."""
        if min(b, t, s, n, n_kv, bq) <= 0:
            return f"B, T, S, N, K, Bq = {b}, {t}, {s}, {n}, {n_kv}, {bq} must all be positive"
        if n % n_kv:
            return f"N = {n} query heads must be a multiple of K = {n_kv} KV heads"
        if bq not in (1, b):
            return f"q's batch {bq} must be 1 or B = {b}"
        if bq != b and (self.dq_accum != "fp32" or self.deterministic or self.packed):
            return "broadcast q (q batch 1) needs dq_accum 'fp32', deterministic False, not packed"
        if self.packed and b != 1:
            return f"packed operands have batch 1 (got {b})"
        tiles = -(-s // TILE) if not self.packed else None
        if tiles is not None and tiles > 65535:
            return f"S = {s}: more than 65535 key tiles (the grid's z dimension)"
        if self.dkv == "mx" and s % BLOCK:
            return f"dkv 'mx' blocks tokens in 32s per batch row: S = {s} must be a multiple of 32"
        if max(b * t * n, b * s * n_kv) * self.head_dim >= 2**31:
            return "operands of 2^31 elements or more (the kernel's 32-bit offsets)"
        return None


def _production(head_dim: int, causal: bool) -> tuple[AttentionBwdSm100Config, ...]:
    c = dict(head_dim=head_dim, causal=causal)
    return (
        AttentionBwdSm100Config(**c),
        AttentionBwdSm100Config(**c, p_scale="block"),
        AttentionBwdSm100Config(**c, dq_accum="fp16"),
        AttentionBwdSm100Config(**c, deterministic=True),
        AttentionBwdSm100Config(**c, dq_accum="fp16", deterministic=True),
        AttentionBwdSm100Config(**c, packed=True),
        AttentionBwdSm100Config(**c, dkv="mx"),
    )


ATTENTION_BWD_SM100_VARIANTS: tuple[AttentionBwdSm100Config, ...] = tuple(
    v for h in HEAD_DIMS for c in (False, True) for v in _production(h, c)
) + (AttentionBwdSm100Config(head_dim=128, stages=3, tune=1),)
"""Per head_dim x causal: the default (p const, float32 dQ), block P, float16 dQ, deterministic float32 and
float16 dQ, packed jagged sequences, MX dK / dV; and the comparison schedule t1 (H128, a 3-deep Q / dO ring).
Other combinations (e.g. block P with float16 dQ) are not built: a handler takes the reference for them."""


@dataclasses.dataclass(frozen=True)
class AttentionBwdPrepassConfig:
    """The backward's pre-pass (kernels/sm100/attention_bwd_prepass.py): one read of dO and O per (row tile,
    head) gives dO's square-block E4M3 operand with both blocked scale orientations and Delta =
    rowsum(dO O) - dLSE (primitives/attention_bwd_sm100_emulation.bwd_prepass).

    Attributes:
      head_dim: 64 or 128.
      in_dtype: dO's and O's dtype, "bfloat16" or "float32".
      packed: packed jagged rows (batch 1; the square blocks and scale chunks restart at each sequence).
    """

    head_dim: int = 128
    in_dtype: str = "bfloat16"
    packed: bool = False

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim={self.head_dim} not in {HEAD_DIMS}")
        if self.in_dtype not in ("bfloat16", "float32"):
            raise ValueError(f"in_dtype={self.in_dtype!r} not in ('bfloat16', 'float32')")
        if not isinstance(self.packed, bool):
            raise ValueError(f"packed={self.packed!r} is not a bool")

    @property
    def name(self) -> str:
        short = {"bfloat16": "bf16", "float32": "f32"}[self.in_dtype]
        return f"attention_bwd_prepass_sm100_h{self.head_dim}_{short}" + ("_packed" if self.packed else "")

    @property
    def tensor_names(self) -> tuple[str, ...]:
        tables = ("seqs", "query_tiles") if self.packed else ("lens",)
        return ("do", "o", "dlse", *tables, "do_q", "do_sf_hd", "do_sf_seq", "delta")


ATTENTION_BWD_PREPASS_VARIANTS: tuple[AttentionBwdPrepassConfig, ...] = tuple(
    AttentionBwdPrepassConfig(head_dim=h, in_dtype=d, packed=p)
    for h in HEAD_DIMS
    for d in ("bfloat16", "float32")
    for p in (False, True)
)


def sf_slot(head_dim: int, gemm: str) -> tuple[int, int]:
    """(SFA column, SFB column) of one GEMM's scale slot ("S", "dP", "dV", "dK", "dQ")."""
    col = tmem_columns(head_dim)[f"SF_{gemm}"]
    return col, col + SF_COLS
