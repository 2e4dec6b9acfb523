"""Blackwell MX GEMM variants (kernels/sm100/mx_gemm.py): block-scaled tcgen05 MMAs, sm_100f. Pure Python (no DSL).

The kernel computes, per batch g, from E4M3 operands with E8M0 scales in the 128x4 blocked layout
(formats/blocked_scales.py):

  acc[m, n] = sum over 32-blocks kb, ascending, in float32 of
              2^(sa[m, kb] - 127) * 2^(sb[n, kb] - 127) * sum_{k in kb} a[m, k] * b[n, k]
  y = acc (+ bias[n])                                   float32
  plain:   c = y rounded once to out_dtype
  row:     (q, s) = quantize(act(y), axis=-1)           E4M3 + E8M0 blocks of 32 along N (scales blocked)
  col:     (qc, sc) = quantize(act(y), axis=-2), transposed: qc (N, M), blocks of 32 along M (scales blocked)
  rowcol:  both from one read of the accumulator;  store_pre: also c = bf16/f32(y)
with act the identity or GELU (tanh form). The arithmetic model is primitives/mx_gemm_sm100_emulation.py.

This module holds MXGemmSm100Config (frozen, named fields; a registry KernelConfig of op "mx_gemm_sm100"), the
variant list MX_GEMM_SM100_VARIANTS (the registry's), and what can be known without compiling: shared memory
of the storage struct, the TMEM map, the problems a variant covers. The FFI handler is csrc/mx_gemm_sm100.cc,
the primitive primitives/mx_gemm_sm100.py. None of this has run on a Blackwell GPU: it is compiled and
statically checked (tools/check_sm100.py).
"""

from __future__ import annotations

import dataclasses
import itertools

from jax_mxfp8.kernels.registry.base import DTYPE_CODE, KernelConfig
from jax_mxfp8.kernels.sm100.tmem_map import TmemMap, region

ARCH = "sm_100f"
"""The one target of every sm100 variant: the family target, whose cubin loads on cc 10.0 (B200, GB200) and
10.3 (B300, GB300) (docs/perf/blackwell.md, "Arch")."""
MMA_K = 32
"""K of one block-scaled MMA instruction (kind::mxf8f6f4): one E8M0 scale per row and operand."""
K_TILE = 128
"""K per shared-memory stage: 4 MMAs; the scales of a stage are one 128x4 blocked tile per 128 rows."""
CTA_ROWS = 128
"""Accumulator rows per CTA: the 128 TMEM lanes (the 2-CTA MMA's 256 rows are 128 per CTA of the pair)."""
EPILOGUE_WARPS = 4
"""Warps 0-3 read the accumulator (warp w reaches TMEM lanes 32 w .. 32 w + 31); warp 4 issues the MMAs,
warp 5 the TMA loads."""
THREADS = 32 * (EPILOGUE_WARPS + 2)
SMEM_LIMIT = 227 * 1024
"""Dynamic shared memory per CTA: 228 KB per SM less the 1 KB the driver reserves per CTA."""
BLOCK = 32
SCALE_TILE_BYTES = 512
TRANSPOSE_PITCH = BLOCK + 1
"""float32 words per row of an epilogue warp's 32 x 32 transpose tile (column_amax "transpose"): the odd
pitch puts a row's and a column's 32 words in 32 distinct banks."""
COL_PITCH = 48
"""Bytes per column of an epilogue warp's E4M3 staging tile (column_amax "redux"): 32 rows + 16, so that
the 16-byte reads of 8 lanes (8 columns) fall in distinct banks."""
COL_SCALES = BLOCK * COL_PITCH
COLUMN_SMEM_PER_WARP = {"transpose": BLOCK * TRANSPOSE_PITCH * 4, "redux": COL_SCALES + 128}
"""Shared memory per epilogue warp for the column orientation (the redux tile: E4M3 bytes, then the 32
column scale bytes; 128 keeps the next warp's tile aligned)."""
COLUMN_AMAX = ("transpose", "redux")

ELEM_DTYPES = ("float8_e4m3fn",)
"""The operand element dtypes built so far (the MMA also takes E5M2; the emulation models E4M3 limbs)."""
OUT_DTYPES = ("bfloat16", "float32")
EPILOGUES = ("plain", "row", "col", "rowcol")
ACTIVATIONS = ("", "gelu")
EPILOGUE_CODE = {"plain": 0, "row": 1, "col": 2, "rowcol": 3}
ACTIVATION_CODE = {"": 0, "gelu": 1}
SHORT = {"bfloat16": "bf16", "float32": "f32", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclasses.dataclass(frozen=True)
class MXGemmSm100Config(KernelConfig):
    """One compiled Blackwell MX GEMM.

    Attributes:
      a_dtype, b_dtype: element dtypes of A (M, K) and B (N, K), both K-major.
      cta_group: 1 (a 128-row tile per CTA, tcgen05 cta_group::1) or 2 (a 256-row tile per pair of CTAs of
        a cluster, cta_group::2: each CTA loads its 128 rows of A and half of B's tile_n rows; the pair's
        MMA reads both halves).
      tile_n: accumulator columns per tile (128: two accumulator buffers plus the scales fit TMEM's 512
        columns).
      stages: depth of the shared-memory ring (A, B, SFA, SFB of one 128-K tile per stage).
      acc_stages: accumulator buffers in TMEM (2: one tile's epilogue overlaps the next tile's mainloop).
      epilogue: "plain" (c in out_dtype), "row" (E4M3 blocks of 32 along N), "col" (blocks of 32 along M,
        written transposed (N, M)) or "rowcol" (both, from one TMEM read).
      out_dtype: dtype of c: the output of "plain", the pre-activation of the others (store_pre).
      store_pre: quantized epilogues: also write c = y in out_dtype (GELU's residual, or the
        high-precision output a later backward needs).
      has_bias: y = acc + bias[n] (float32 (N,)) before anything else.
      activation: "" or "gelu" (tanh form, float32), applied to y before quantizing (quantized epilogues).
      column_amax: how the column orientation finds a block's amax (col / rowcol): "transpose" (each
        epilogue warp transposes its 32 x 32 float32 block through shared memory, so that lane j owns
        column j and quantizes it like a row block: production) or "redux" (every lane keeps its row; per
        column one warp-wide REDUX.MAX.U32 and the scale arithmetic, bytes transposed through shared
        memory afterwards: about 3x the instructions, kept as the comparison schedule).
      group_m: tile rasterization: consecutive work tiles walk group_m M tiles before the next N tile.
      tune: 0 for the production variant of its key; > 0 for comparison schedules.
    The persistent grid is one CTA per SM: the handler passes the device's SM count at launch (148 on a
    B200, 160 on a GB300).
    """

    op = "mx_gemm_sm100"
    kernels = {ARCH: "jax_mxfp8.kernels.sm100.mx_gemm:make_kernel"}
    key_fields = ("a_dtype", "b_dtype", "cta_group", "epilogue", "out_dtype", "store_pre", "has_bias", "activation")
    codes = {
        "a_dtype": DTYPE_CODE,
        "b_dtype": DTYPE_CODE,
        "out_dtype": DTYPE_CODE,
        "epilogue": EPILOGUE_CODE,
        "activation": ACTIVATION_CODE,
    }

    a_dtype: str = "float8_e4m3fn"
    b_dtype: str = "float8_e4m3fn"
    cta_group: int = 2
    tile_n: int = 128
    stages: int = 8
    acc_stages: int = 2
    epilogue: str = "plain"
    out_dtype: str = "bfloat16"
    store_pre: bool = False
    has_bias: bool = False
    activation: str = ""
    column_amax: str = "transpose"
    group_m: int = 8
    tune: int = 0

    def __post_init__(self):
        for field in ("a_dtype", "b_dtype"):
            if getattr(self, field) not in ELEM_DTYPES:
                raise ValueError(f"{field}={getattr(self, field)!r} not in {ELEM_DTYPES}")
        if self.cta_group not in (1, 2):
            raise ValueError(f"cta_group={self.cta_group} not in (1, 2)")
        if self.tile_n != 128:
            raise ValueError(f"tile_n={self.tile_n}: only 128 (two accumulator buffers + scales in 512 columns)")
        if self.acc_stages not in (1, 2):
            raise ValueError(f"acc_stages={self.acc_stages} not in (1, 2)")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue={self.epilogue!r} not in {EPILOGUES}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"out_dtype={self.out_dtype!r} not in {OUT_DTYPES}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} not in {ACTIVATIONS}")
        if self.column_amax not in COLUMN_AMAX:
            raise ValueError(f"column_amax={self.column_amax!r} not in {COLUMN_AMAX}")
        if self.epilogue == "plain" and (self.activation or self.store_pre):
            raise ValueError("the plain epilogue takes no activation and no store_pre (c is its output)")
        if self.group_m < 1:
            raise ValueError(f"group_m={self.group_m} must be >= 1")
        if self.stages < 2 or self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"stages={self.stages}: needs >= 2 and {self.smem_bytes} <= {SMEM_LIMIT} B of smem")
        self.tmem_map().check()

    # -------------------------------------------------------------------------------------------- shapes
    @property
    def tile_m(self) -> int:
        """Rows of one MMA tile (both CTAs of a pair together)."""
        return CTA_ROWS * self.cta_group

    @property
    def b_rows_per_cta(self) -> int:
        """Rows of B's tile each CTA loads (the pair splits the tile_n rows)."""
        return self.tile_n // self.cta_group

    @property
    def sfb_rows(self) -> int:
        """Rows of B's scales in shared memory and TMEM: tile_n rounded up to the 128-row scale tile."""
        return _round_up(self.tile_n, CTA_ROWS)

    @property
    def quantized(self) -> bool:
        return self.epilogue != "plain"

    @property
    def writes_c(self) -> bool:
        return self.epilogue == "plain" or self.store_pre

    @property
    def outputs(self) -> tuple[str, ...]:
        """The output buffers, in argument order: c, q, s, qc, sc (those the epilogue writes)."""
        out = ("c",) if self.writes_c else ()
        out += ("q", "s") if self.epilogue in ("row", "rowcol") else ()
        return out + (("qc", "sc") if self.epilogue in ("col", "rowcol") else ())

    # ----------------------------------------------------------------------------------------- resources
    @property
    def stage_bytes(self) -> dict[str, int]:
        """Bytes of one ring stage per CTA: A, B, SFA, SFB (elements and scales are 1 byte)."""
        return {
            "a": CTA_ROWS * K_TILE,
            "b": self.b_rows_per_cta * K_TILE,
            "sfa": CTA_ROWS * K_TILE // BLOCK,
            "sfb": self.sfb_rows * K_TILE // BLOCK,
        }

    @property
    def tx_bytes(self) -> int:
        """Bytes the TMA loads of one stage bring into one CTA (the mbarrier transaction count)."""
        return sum(self.stage_bytes.values())

    @property
    def smem_bytes(self) -> int:
        """The storage struct of kernels/sm100/mx_gemm.py: the mbarriers (ring full/empty, accumulator
        full/empty, TMEM dealloc) and the TMEM address word, then sA and sB (1024-byte aligned for the 128B
        swizzle), sSFA and sSFB (128-byte aligned), and for the column orientation the epilogue warps'
        staging tiles (128-byte aligned). tools/check_sm100.py compares it with the struct's size."""
        size = 8 * (2 * self.stages + 2 * self.acc_stages + 1) + 4
        sb = self.stage_bytes
        for name, align in (("a", 1024), ("b", 1024), ("sfa", 128), ("sfb", 128)):
            size = _round_up(size, align) + self.stages * sb[name]
        if self.epilogue in ("col", "rowcol"):
            size = _round_up(size, 128) + EPILOGUE_WARPS * COLUMN_SMEM_PER_WARP[self.column_amax]
        return _round_up(size, 1024)

    @property
    def sfa_tmem_columns(self) -> int:
        """TMEM columns of A's scales for one K tile: tcgen05.cp 32x128b.warpx4 puts a 128x4 scale tile's
        16-byte lines (rows r, r + 32, r + 64, r + 96 of K blocks 0..3) in 4 columns of lane r, broadcast
        to the 4 lane quarters: 4 columns per 128 rows and 4 MMAs (the DSL's layout spans the same,
        tools/check_sm100.py compares)."""
        return (CTA_ROWS // BLOCK) * (K_TILE // MMA_K) // 4

    @property
    def sfb_tmem_columns(self) -> int:
        return (self.sfb_rows // BLOCK) * (K_TILE // MMA_K) // 4

    def tmem_map(self) -> TmemMap:
        """acc0 .. acc{acc_stages - 1}: float32 accumulators, tile_n columns each, written by the MMA warp
        (phase "mma") and read by the epilogue ("epilogue"); both phases run at once on different buffers,
        so each buffer is declared live in both. sfa, sfb: the current K tile's scales, copied from shared
        memory by tcgen05.cp and read by the MMAs ("mma" only)."""
        regions = [region(f"acc{s}", s * self.tile_n, self.tile_n, "mma", "epilogue") for s in range(self.acc_stages)]
        end = self.acc_stages * self.tile_n
        regions.append(region("sfa", end, self.sfa_tmem_columns, "mma"))
        regions.append(region("sfb", end + self.sfa_tmem_columns, self.sfb_tmem_columns, "mma"))
        return TmemMap(self.name, ("mma", "epilogue"), tuple(regions))

    def unsupported(self, g: int, m: int, n: int, k: int) -> str | None:
        """Why the variant cannot take a (G, M, K) x (G, N, K) problem (None = it can): K a positive multiple
        of 32 (MX blocks; also TMA's 16-byte row pitch), N a multiple of 32 (the epilogue's 32-column
        chunks and blocks along N), M a multiple of 32 for the column blocks, 32-bit element offsets."""
        if min(g, m, n, k) <= 0:
            return f"G, M, N, K = {g}, {m}, {n}, {k} must all be positive"
        if k % BLOCK:
            return f"K = {k} must be a multiple of {BLOCK} (MX blocks along K)"
        if n % BLOCK:
            return f"N = {n} must be a multiple of {BLOCK} (the epilogue's 32-column chunks)"
        if self.epilogue in ("col", "rowcol") and m % BLOCK:
            return f"M = {m} must be a multiple of {BLOCK} (the column orientation's blocks along M)"
        if max(g * m * k, g * n * k, g * m * n) >= 2**31:
            return "operands or outputs of 2^31 elements or more (the kernel's 32-bit offsets)"
        return None

    # ------------------------------------------------------------------------------------------- naming
    @property
    def name(self) -> str:
        base = f"mx_gemm_sm100_{self.cta_group}cta_{SHORT[self.a_dtype]}_{SHORT[self.b_dtype]}"
        if self.epilogue == "plain":
            base += f"_{SHORT[self.out_dtype]}"
        else:
            base += f"_mx{self.epilogue}"
        base += "_bias" if self.has_bias else ""
        base += f"_{self.activation}" if self.activation else ""
        base += f"_pre{SHORT[self.out_dtype]}" if self.store_pre else ""
        return f"{base}_t{self.tune}" if self.tune else base


_STAGES = {1: 6, 2: 8}
"""Ring depth per cta_group: as many 128-K stages as fit beside the barriers (33 KB each on one CTA, 25 KB
per CTA on a pair)."""


def _variants(cta_group: int) -> tuple[MXGemmSm100Config, ...]:
    common = dict(cta_group=cta_group, stages=_STAGES[cta_group])
    plain = tuple(
        MXGemmSm100Config(out_dtype=o, has_bias=b, **common) for o, b in itertools.product(OUT_DTYPES, (False, True))
    )
    if cta_group == 1:
        return plain
    row = tuple(
        MXGemmSm100Config(epilogue="row", has_bias=b, activation=a, store_pre=True, **common)
        for b, a in itertools.product((False, True), ACTIVATIONS)
    )
    rowcol = tuple(
        MXGemmSm100Config(epilogue="rowcol", has_bias=b, activation=a, store_pre=True, **common)
        for b, a in itertools.product((False, True), ACTIVATIONS)
    )
    return plain + row + rowcol


MX_GEMM_SM100_VARIANTS: tuple[MXGemmSm100Config, ...] = (
    _variants(2)
    + _variants(1)
    + (
        MXGemmSm100Config(
            epilogue="rowcol", has_bias=True, activation="gelu", store_pre=True, column_amax="redux", tune=1
        ),
    )
)
"""The registered variants: what a dispatch path runs. 2-CTA (256-row tiles, production): plain {bf16, f32} x
{bias} (mx_dot_general's forward, dgrad and wgrad GEMMs), row + pre and rowcol + pre {bias} x {gelu}
(mx_dot_general_quantized's epilogue, one or both orientations; the kernel path always keeps the
high-precision output). 1-CTA (128-row tiles): plain {bf16, f32} x {bias}, for M <= 128 (a 256-row tile would
leave half of every pair idle). Then the comparison schedule t1 (built with --with-tunes): the 2-CTA rowcol +
bias + GELU with column_amax "redux" (warp-wide REDUX amaxes instead of the shared-memory transpose). The
kernel also compiles row without pre, col alone and the 1-CTA quantized epilogues; no dispatch path takes
them, so they are not registered (docs/perf/blackwell.md)."""
