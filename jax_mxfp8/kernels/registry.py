"""The ahead-of-time kernel variants: one frozen config per compiled kernel.

Pure Python (no CuTe DSL import), so the primitives layer, the build tool and the tests all read the
same list. `tools/build_kernels.py` compiles every variant in `VARIANTS` for every arch in `ARCHS`;
`csrc/` looks a variant up by the fields below (the generated table `kernels_table.inc` carries them as
integers, see `*_code` properties), so adding a variant here is the only change needed to ship it.

Supported by the kernels (everything else goes to the XLA reference):
  quantize: 2-D (M, K) row-major bfloat16 / float32 input, M and K multiples of 32;
            modes "rowcol" (row blocks along K AND column blocks along M, one pass), "row", "col",
            "square" (32x32); elements float8_e4m3fn / float8_e5m2; scale_rounding "up" / "floor";
            round-to-nearest-even only (no stochastic rounding).
  dequantize: 2-D (M, K) float8_e4m3fn / float8_e5m2 data with "row" (along K), "col" (along M) or
            "square" scales, to bfloat16 / float32.
  rms_norm_quantize: 2-D (M, D) row-major bfloat16 / float32 input, float32 weight (D,), float32 eps;
            y = x * rsqrt(mean(x^2) + eps) * w in x's dtype AND quantize(y) in row blocks along D;
            D a multiple of 32 and at most max_threads * chunks * (16 / sizeof(x)) (32768 for bf16,
            16384 for f32); elements float8_e4m3fn / float8_e5m2; scale_rounding "up" / "floor".
"""

from __future__ import annotations

import dataclasses
import itertools
import math

ARCHS = ("sm_90a", "sm_100a")
"""Targets every variant is compiled for. Blackwell (sm_100a) cubins are built and inspected, not run."""

ARCH_MAJOR = {"sm_90a": 9, "sm_100a": 10}

IN_DTYPES = ("bfloat16", "float32")
ELEM_DTYPES = ("float8_e4m3fn", "float8_e5m2")
SCALE_ROUNDINGS = ("up", "floor")
QUANTIZE_MODES = ("rowcol", "row", "col", "square")
DEQUANTIZE_BLOCKS = ("row", "col", "square")

# Integer codes shared with csrc/common.h (keep in sync; the build writes them into the table).
DTYPE_CODE = {"bfloat16": 0, "float32": 1, "float8_e4m3fn": 2, "float8_e5m2": 3}
MODE_CODE = {"rowcol": 0, "row": 1, "col": 2, "square": 3}
OP_CODE = {"quantize": 0, "dequantize": 1, "rms_norm_quantize": 2, "attention_fwd": 3, "attention_realign": 4}
ROUNDING_CODE = {"up": 0, "floor": 1}
P_SCALES = ("const", "block")
P_SCALE_CODE = {"const": 0, "block": 1}

_SHORT = {"bfloat16": "bf16", "float32": "f32", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """One-pass MX quantize of a 2-D (M, K) array.

    Attributes:
      in_dtype: "bfloat16" or "float32".
      mode: "rowcol" (both orientations from one read), "row" (blocks along K), "col" (blocks along M)
        or "square" (32x32 blocks).
      elem_dtype: "float8_e4m3fn" or "float8_e5m2".
      scale_rounding: "up" (cvt.rp ue8m0 rule, default) or "floor" (OCP v1.0).
      warps_per_cta: warps per CTA; each warp owns a 32-row x (rows_per_thread * 16/sizeof(in)) tile.
      rows_per_thread: rows each lane holds (16: two half-warps split the 32 rows of a tile; 8: four
        quarter-warps); smaller means fewer registers and shorter contiguous row segments.
      l2_prefetch: 0, or 128 / 256 for the loads' L2::<n>B prefetch hint.
      row_scale_store: "byte" (v1: each lane stores single scale bytes of the rows it is responsible
        for, so each 32-byte sector of the row-scale array is written in 4-byte pieces by 8 warps),
        "transpose" (the scale bytes of a row are gathered into one lane by shuffles and stored as one
        word: R/4 x nb shuffles instead of R byte stores per lane), or "smem" (v2, production for
        "rowcol" and "row": a CTA owns a strip of 32 rows x warps_per_cta * tiles_per_warp tiles along
        K, stages the strip's row-scale bytes in shared memory and stores them as whole 8-byte words
        after a barrier: strip_bytes = warps * tiles_per_warp * tile_cols / 32 per row, 32 = one
        whole sector for the production variants).
      tiles_per_warp: with row_scale_store="smem", tiles per warp in the CTA's strip (at step i the
        warps take adjacent tiles). Otherwise 1: each warp quantizes one tile and exits (v1); > 1:
        each warp quantizes this many tiles (interleaved with the CTA's other warps), overlapping the
        next tiles' loads as `pipeline` says.
      pipeline: with tiles_per_warp > 1, how the next tiles' loads overlap the current tile's work:
        "registers" (tile i + 1 is loaded into a second register set before tile i is processed) or
        "l2" (each lane issues cp.async.bulk.prefetch.L2 for its row of tile i + prefetch_distance,
        then tile i is loaded and processed as in v1: no extra registers).
      prefetch_distance: tiles ahead for pipeline="l2".
      min_ctas_per_sm: 0, or the CTAs per SM that ptxas must fit (a register cap of
        65536 / (min_ctas_per_sm * 32 * warps_per_cta) per thread).
      diagnostic: "" for real kernels; benchmark-only variants that skip work and produce WRONG outputs,
        to locate where time goes: "no_row_scale" (row-scale stores skipped).
      tune: 0 for the production variant of these parameters; > 0 for alternative tunings built only
        for benchmarks (selected through the FFI attribute `tune`).
    """

    in_dtype: str = "bfloat16"
    mode: str = "rowcol"
    elem_dtype: str = "float8_e4m3fn"
    scale_rounding: str = "up"
    warps_per_cta: int = 4
    rows_per_thread: int = 16
    l2_prefetch: int = 0
    row_scale_store: str = "byte"
    tiles_per_warp: int = 1
    pipeline: str = "registers"
    prefetch_distance: int = 1
    min_ctas_per_sm: int = 0
    diagnostic: str = ""
    tune: int = 0

    def __post_init__(self):
        if self.pipeline not in ("registers", "l2"):
            raise ValueError(f"pipeline={self.pipeline!r} not in ('registers', 'l2')")
        if self.tiles_per_warp < 1:
            raise ValueError(f"tiles_per_warp={self.tiles_per_warp} must be >= 1")
        if self.diagnostic not in ("", "no_row_scale"):
            raise ValueError(f"diagnostic={self.diagnostic!r} not in ('', 'no_row_scale')")
        if self.rows_per_thread not in (8, 16):
            raise ValueError(f"rows_per_thread={self.rows_per_thread} not in (8, 16)")
        if self.row_scale_store not in ("byte", "transpose", "smem"):
            raise ValueError(f"row_scale_store={self.row_scale_store!r} not in ('byte', 'transpose', 'smem')")
        if self.row_scale_store == "smem":
            strip = self.warps_per_cta * self.tiles_per_warp * self.rows_per_thread * (16 // self.in_bytes) // 32
            if strip % 8 or self.mode not in ("rowcol", "row") or self.diagnostic:
                raise ValueError(f"row_scale_store='smem' needs mode rowcol/row and 8 | strip bytes, got {self}")
        if self.l2_prefetch not in (0, 128, 256):
            raise ValueError(f"l2_prefetch={self.l2_prefetch} not in (0, 128, 256)")
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype={self.in_dtype!r} not in {IN_DTYPES}")
        if self.mode not in QUANTIZE_MODES:
            raise ValueError(f"mode={self.mode!r} not in {QUANTIZE_MODES}")
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding={self.scale_rounding!r} not in {SCALE_ROUNDINGS}")

    @property
    def in_bytes(self) -> int:
        return 2 if self.in_dtype == "bfloat16" else 4

    @property
    def name(self) -> str:
        base = f"quantize_{self.mode}_{_SHORT[self.in_dtype]}_{_SHORT[self.elem_dtype]}_{self.scale_rounding}"
        return f"{base}_t{self.tune}" if self.tune else base

    @property
    def op(self) -> str:
        return "quantize"


@dataclasses.dataclass(frozen=True)
class DequantizeConfig:
    """MX dequantize of 2-D (M, K) FP8 data with row / col / square E8M0 scales.

    Attributes:
      elem_dtype: "float8_e4m3fn" or "float8_e5m2".
      block: "row" (scale (M, K/32)), "col" (scale (M/32, K)) or "square" (scale (M/32, K/32)).
      out_dtype: "bfloat16" or "float32".
      threads_per_cta: threads per CTA; each thread converts 16 consecutive elements of one row.
    """

    elem_dtype: str = "float8_e4m3fn"
    block: str = "row"
    out_dtype: str = "bfloat16"
    threads_per_cta: int = 256

    def __post_init__(self):
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.block not in DEQUANTIZE_BLOCKS:
            raise ValueError(f"block={self.block!r} not in {DEQUANTIZE_BLOCKS}")
        if self.out_dtype not in IN_DTYPES:
            raise ValueError(f"out_dtype={self.out_dtype!r} not in {IN_DTYPES}")

    @property
    def name(self) -> str:
        return f"dequantize_{self.block}_{_SHORT[self.elem_dtype]}_{_SHORT[self.out_dtype]}"

    @property
    def op(self) -> str:
        return "dequantize"


@dataclasses.dataclass(frozen=True)
class RMSNormQuantizeConfig:
    """Fused RMSNorm + MX quantize of a 2-D (M, D) array (row blocks along D).

    Attributes:
      in_dtype: "bfloat16" or "float32" (x and y); the weight is always float32 (the primitive casts it,
        exactly, as the reference's weight.astype(float32) does).
      elem_dtype: "float8_e4m3fn" or "float8_e5m2".
      scale_rounding: "up" or "floor".
      chunks: 16-byte vectors of x each thread holds in registers (compile-time bound); one CTA per row
        with T = roundup32(ceil(D / (V * chunks))) threads, V = 16 / sizeof(x).
      max_threads: the CTA size bound (the largest supported D is max_threads * chunks * V).
    """

    in_dtype: str = "bfloat16"
    elem_dtype: str = "float8_e4m3fn"
    scale_rounding: str = "up"
    chunks: int = 8
    max_threads: int = 512
    tune: int = 0

    def __post_init__(self):
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype={self.in_dtype!r} not in {IN_DTYPES}")
        if self.elem_dtype not in ELEM_DTYPES:
            raise ValueError(f"elem_dtype={self.elem_dtype!r} not in {ELEM_DTYPES}")
        if self.scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding={self.scale_rounding!r} not in {SCALE_ROUNDINGS}")
        if self.max_threads % 32 or not 32 <= self.max_threads <= 1024:
            raise ValueError(f"max_threads={self.max_threads} must be a multiple of 32 in [32, 1024]")

    @property
    def vec(self) -> int:
        return 8 if self.in_dtype == "bfloat16" else 4

    @property
    def max_d(self) -> int:
        return self.max_threads * self.chunks * self.vec

    @property
    def name(self) -> str:
        base = f"rms_norm_quantize_{_SHORT[self.in_dtype]}_{_SHORT[self.elem_dtype]}_{self.scale_rounding}"
        return f"{base}_t{self.tune}" if self.tune else base

    @property
    def op(self) -> str:
        return "rms_norm_quantize"


@dataclasses.dataclass(frozen=True)
class AttentionFwdConfig:
    """MXFP8 attention forward (kernels/sm90/attention_fwd.py): one variant per head_dim x causal.

    Attributes:
      head_dim: 64 or 128.
      causal: top-left causal masking (query i sees keys j <= i).
      kv_stage: K/V tiles in flight in shared memory (K and V take one stage each).
      overlap: issue the next tile's Q K^T wgmma before the current tile's P V and run its softmax while
        P V is in flight (FA3's intra-warpgroup overlap). False: strictly sequential per warpgroup.
      pingpong: with overlap, the two consumer warpgroups take turns issuing their wgmmas (named barriers),
        so that one warpgroup's softmax runs while the other's GEMMs occupy the tensor cores (FA3).
      p_scale: the contract's AttentionConfig.p_scale. "const": P~ stored as E4M3(256 P~). "block": one
        power-of-two scale per (query row, 128-key tile), the one the contract's block rule gives for the
        row-tile's amax (docs/numerics.md "Hopper attention kernel").
      p_rounding: with p_scale="block", the scale rule: "up" (AttentionConfig.scale_rounding default) or
        "floor" (implemented, not registered: see ATTENTION_FWD_VARIANTS). Must be "up" (unused) for "const".
      pv_fp32: each KV tile's O += P V runs on a fresh wgmma accumulator, added to acc_O by float32 FADDs,
        instead of chaining every tile's wgmma onto acc_O: Hopper's FP8 wgmma accumulates with fewer bits
        than float32 (DeepSeek-V3 measured ~14), which loses long sums of small addends next to a large one
        (an attention sink; docs/numerics.md). Costs 64 FADDs (H128) and H/2 registers per thread and tile.
      poly_exp2: of every 16 softmax exponentials, how many are computed by a degree-3 polynomial on the
        FMA pipe instead of MUFU.EX2 (FA4's trick: MUFU runs 16 per clock per SM, as many exps per tile as
        the FP8 wgmmas take clocks); 0 = all on MUFU. Relative error <= 7.8e-5 (E4M3 keeps 2^-4).
      packed: packed jagged sequences (varlen): one batch row holds every sequence, each starting on a
        128-row tile, and the grid runs a work list of (sequence, query tile) items instead of the padded
        (B, Tp) grid.
      tune: 0 for the production variant; > 0 for alternatives built only for benchmarks.
    """

    head_dim: int = 128
    causal: bool = False
    kv_stage: int = 4
    overlap: bool = False
    pingpong: bool = False
    p_scale: str = "const"
    p_rounding: str = "up"
    pv_fp32: bool = True
    poly_exp2: int = 0
    packed: bool = False
    tune: int = 0

    def __post_init__(self):
        if self.head_dim not in (64, 128):
            raise ValueError(f"head_dim={self.head_dim} not in (64, 128)")
        if not 2 <= self.kv_stage <= 12 or self.kv_stage % 2:
            raise ValueError(f"kv_stage={self.kv_stage} must be even in [2, 12]")
        if self.pingpong and not self.overlap:
            raise ValueError("pingpong needs overlap")
        if not 0 <= self.poly_exp2 <= 16:
            raise ValueError(f"poly_exp2={self.poly_exp2} not in [0, 16]")
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
        if self.pv_fp32 != (self.head_dim == 64):  # not the production accumulation (see _pv_fp32)
            base += "_pvfp32" if self.pv_fp32 else "_pvchain"
        return f"{base}_t{self.tune}" if self.tune else base

    @property
    def p_scale_code(self) -> int:
        """The table's and the FFI attribute's integer for p_scale (P_SCALE_CODE)."""
        return P_SCALE_CODE[self.p_scale]

    @property
    def p_rounding_code(self) -> int:
        """The table's and the FFI attribute's integer for p_rounding (ROUNDING_CODE; 0 for "const")."""
        return ROUNDING_CODE[self.p_rounding]

    @property
    def p_code(self) -> int:
        """The kernel table's key for the P scale: 2 * p_scale_code + p_rounding_code (csrc/attention_fwd.cc)."""
        return 2 * self.p_scale_code + self.p_rounding_code

    @property
    def op(self) -> str:
        return "attention_fwd"


@dataclasses.dataclass(frozen=True)
class AttentionRealignConfig:
    """The attention producer's re-encode + transpose (kernels/sm90/attention_realign.py).

    Attributes:
      head_dim: 64 or 128.
      operand: "rows" (Q, K: sequence-major (B, L, N, H) -> head-major (B, N, Lp, H)) or "v" (V ->
        V'^T (B, K, H, Lp) with the keys of every 32 in pv_permutation order).
    """

    head_dim: int = 128
    operand: str = "rows"

    def __post_init__(self):
        if self.head_dim not in (64, 128):
            raise ValueError(f"head_dim={self.head_dim} not in (64, 128)")
        if self.operand not in ("rows", "v"):
            raise ValueError(f"operand={self.operand!r} not in ('rows', 'v')")

    @property
    def tune(self) -> int:
        return 0

    @property
    def name(self) -> str:
        return f"attention_realign_{self.operand}_h{self.head_dim}"

    @property
    def op(self) -> str:
        return "attention_realign"


def _production_quantize(in_dtype: str, mode: str, elem_dtype: str, scale_rounding: str) -> QuantizeConfig:
    """v2 for the modes with row blocks along K: row scales staged in shared memory, stored as whole
    32-byte sectors (2 tiles per warp for bf16, 4 for f32, 4 warps; the bf16 row+col kernel capped at
    168 registers like v1); v1 otherwise."""
    kw = {}
    if mode in ("rowcol", "row"):
        kw = dict(row_scale_store="smem", tiles_per_warp=2 if in_dtype == "bfloat16" else 4)
        if (in_dtype, mode) == ("bfloat16", "rowcol"):
            kw["min_ctas_per_sm"] = 3  # keep v1's 3 CTAs (12 warps) per SM: <= 168 registers
    return QuantizeConfig(in_dtype=in_dtype, mode=mode, elem_dtype=elem_dtype, scale_rounding=scale_rounding, **kw)


QUANTIZE_VARIANTS: tuple[QuantizeConfig, ...] = tuple(
    _production_quantize(i, m, e, r)
    for i, m, e, r in itertools.product(IN_DTYPES, QUANTIZE_MODES, ELEM_DTYPES, SCALE_ROUNDINGS)
)
# Alternative tunings of the bf16 row+col kernel, built for benchmarks/quantize.py (tune > 0): v1 (the
# production kernel before row-scale staging) and two other strip widths, plus one diagnostic that
# skips the row-scale stores (WRONG output on purpose: it measures what those stores cost). Tunings
# measured slower in earlier runs (transposed row-scale store, 8 warps per CTA, register double
# buffering, L2 prefetch of the next tiles; docs/perf-notes.md) are no longer built.
TUNING_VARIANTS: tuple[QuantizeConfig, ...] = (
    QuantizeConfig(tune=1),
    QuantizeConfig(row_scale_store="smem", tiles_per_warp=1, min_ctas_per_sm=3, tune=2),
    QuantizeConfig(row_scale_store="smem", tiles_per_warp=4, min_ctas_per_sm=3, tune=3),
    QuantizeConfig(diagnostic="no_row_scale", tune=4),
)
DEQUANTIZE_VARIANTS: tuple[DequantizeConfig, ...] = tuple(
    DequantizeConfig(elem_dtype=e, block=b, out_dtype=o)
    for e, b, o in itertools.product(ELEM_DTYPES, DEQUANTIZE_BLOCKS, IN_DTYPES)
)
RMS_NORM_QUANTIZE_VARIANTS: tuple[RMSNormQuantizeConfig, ...] = tuple(
    RMSNormQuantizeConfig(in_dtype=i, elem_dtype=e, scale_rounding=r)
    for i, e, r in itertools.product(IN_DTYPES, ELEM_DTYPES, SCALE_ROUNDINGS)
)


# Production (tune 0): intra-warpgroup overlap (measured 0.79 vs 0.89 ms serial at B4 T4k N16 H128 on the H200,
# docs/perf-notes.md). Tunings built for benchmarks/attention.py: 1 = serial (no overlap), 2 = overlap +
# pingpong between the consumer warpgroups, 3 = pingpong with twice the K/V stages, 4 and 5 = polynomial exp2,
# 6 = the other P V accumulation (pv_fp32).
def _pv_fp32(head_dim: int) -> bool:
    """Production P V accumulation: float32 on the CUDA cores at H64; chained on the wgmma accumulator at
    H128, where the extra 64 registers per thread spill (98 STL/LDL in the consumer; docs/perf-notes.md)."""
    return head_dim == 64


_ATTENTION_FWD_CONST: tuple[AttentionFwdConfig, ...] = (
    tuple(
        AttentionFwdConfig(
            head_dim=h,
            causal=c,
            kv_stage=stages * mult,
            overlap=ov,
            pingpong=pp,
            pv_fp32=_pv_fp32(h),
            tune=tune,
        )
        for h, c in itertools.product((64, 128), (False, True))
        for stages in (8 if h == 64 else 4,)
        for tune, ov, pp, mult in ((0, True, False, 1), (1, False, False, 1), (2, True, True, 1), (3, True, True, 2))
        if stages * mult <= 12
    )
    + tuple(  # 4, 5: production + 2 / 4 of every 16 softmax exps on the FMA pipe (benchmark only)
        AttentionFwdConfig(
            head_dim=h, causal=c, kv_stage=8 if h == 64 else 4, overlap=True, pv_fp32=_pv_fp32(h), poly_exp2=k, tune=t
        )
        for h, c in itertools.product((64, 128), (False, True))
        for t, k in ((4, 2), (5, 4))
    )
    + tuple(  # 6: production with the other P V accumulation (benchmark only)
        AttentionFwdConfig(
            head_dim=h, causal=c, kv_stage=8 if h == 64 else 4, overlap=True, pv_fp32=not _pv_fp32(h), tune=6
        )
        for h, c in itertools.product((64, 128), (False, True))
    )
)
# p_scale="block": the production scheduling of each (head_dim, causal) only (the tunings reorder when work
# is issued, not the arithmetic), P scale rule "up" only. The kernel implements "floor" too, but one scale
# per row-tile cannot reproduce that rule's saturation of P elements (a 32-key block whose amax has a
# mantissa >= 1.75 clips it to 448 * 2^(floor(log2 amax) - 8)): 36.8-40.5 dB from the reference, below the
# 40 dB gate (docs/numerics.md), so "floor" takes the XLA path.
# Packed sequences (varlen_attention): the production scheduling with either P scale.
ATTENTION_FWD_VARIANTS: tuple[AttentionFwdConfig, ...] = _ATTENTION_FWD_CONST + tuple(
    dataclasses.replace(v, p_scale=p_scale, packed=packed)
    for v in _ATTENTION_FWD_CONST
    if v.tune == 0
    for p_scale, packed in (("block", False), ("const", True), ("block", True))
)
ATTENTION_REALIGN_VARIANTS: tuple[AttentionRealignConfig, ...] = tuple(
    AttentionRealignConfig(head_dim=h, operand=o) for h, o in itertools.product((64, 128), ("rows", "v"))
)
VARIANTS = (
    QUANTIZE_VARIANTS
    + TUNING_VARIANTS
    + DEQUANTIZE_VARIANTS
    + RMS_NORM_QUANTIZE_VARIANTS
    + ATTENTION_FWD_VARIANTS
    + ATTENTION_REALIGN_VARIANTS
)


def find_quantize(in_dtype: str, mode: str, elem_dtype: str, scale_rounding: str) -> QuantizeConfig | None:
    """The registered (production) quantize variant for these parameters, or None when no kernel covers them."""
    for v in QUANTIZE_VARIANTS:
        if (v.in_dtype, v.mode, v.elem_dtype, v.scale_rounding) == (in_dtype, mode, elem_dtype, scale_rounding):
            return v
    return None


def find_rms_norm_quantize(in_dtype: str, elem_dtype: str, scale_rounding: str) -> RMSNormQuantizeConfig | None:
    """The registered fused RMSNorm + quantize variant for these parameters, or None."""
    for v in RMS_NORM_QUANTIZE_VARIANTS:
        if (v.in_dtype, v.elem_dtype, v.scale_rounding) == (in_dtype, elem_dtype, scale_rounding):
            return v
    return None


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


def variant_archs(config) -> tuple[str, ...]:
    """The archs a variant is compiled for: the Hopper attention kernel (wgmma) and its producer exist for
    sm_90a only."""
    return ("sm_90a",) if isinstance(config, (AttentionFwdConfig, AttentionRealignConfig)) else ARCHS


def find_attention_fwd(
    head_dim: int, causal: bool, p_scale: str = "const", p_rounding: str = "up", packed: bool = False
) -> AttentionFwdConfig | None:
    """The production attention forward variant for these parameters, or None when no kernel covers them.

    p_rounding is ignored for p_scale="const" (one scale, no rule)."""
    if p_scale == "const":
        p_rounding = "up"
    want = (head_dim, causal, p_scale, p_rounding, packed, 0)
    for v in ATTENTION_FWD_VARIANTS:
        if (v.head_dim, v.causal, v.p_scale, v.p_rounding, v.packed, v.tune) == want:
            return v
    return None


def find_dequantize(elem_dtype: str, block: str, out_dtype: str) -> DequantizeConfig | None:
    """The registered dequantize variant for these parameters, or None."""
    for v in DEQUANTIZE_VARIANTS:
        if (v.elem_dtype, v.block, v.out_dtype) == (elem_dtype, block, out_dtype):
            return v
    return None


# TEMP-SHIM (replaced by the kernel-table branch): generic lookup and per-config archs.
def find(config_cls, **fields):
    tune = fields.pop("tune", 0)
    for v in VARIANTS:
        if type(v) is not config_cls or getattr(v, "tune", 0) != tune:
            continue
        if all(getattr(v, k) == val for k, val in fields.items()):
            return v
    return None


for _cls in (QuantizeConfig, DequantizeConfig, RMSNormQuantizeConfig, AttentionFwdConfig, AttentionRealignConfig):
    _cls.archs = property(variant_archs)
