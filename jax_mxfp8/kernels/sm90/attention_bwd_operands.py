"""The operand structs of the Hopper attention backward kernel (kernels/sm90/attention_bwd.py).

BwdOperands is everything the kernel reads, built once by the host side (`_launch`) and passed to the kernel
as its one argument (frozen NamedTuples: the DSL flattens their dynamic members into the kernel's parameters
in field order, None members taking none); BwdSmem holds the kernel's shared-memory tensors. Shapes and
dtypes of the operands: attention_bwd.py's module docstring and docs/interfaces.md.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass.cute as cute
from cutlass import Float32, Int32


class TmaTile(NamedTuple):
    """A TMA copy atom and the (rows, H, heads) tensor it loads from (or reduces into)."""

    atom: cute.CopyAtom
    tensor: cute.Tensor


class Fp8Operands(NamedTuple):
    """sdp_fp8: the FP8 copies of Q, dO, K, V (one exponent per 32 rows) and their row factors (B*heads, L/32)."""

    q8: TmaTile
    do8: TmaTile
    k8: TmaTile
    v8: TmaTile
    qs: cute.Tensor  # tau log2(e) 2^eQ
    ks: cute.Tensor
    vs: cute.Tensor
    dos: cute.Tensor


class DqModeOperands(NamedTuple):
    """The dQ modes' extra operands: dq_sem (B*N, Tp/32) int32 and the dq scale tau 2^e."""

    sem: cute.Tensor
    scale: Float32


class Mmas(NamedTuple):
    """The tiled MMAs the consumers' fragments come from: S^T / dP^T, dV / dK, dQ."""

    sdp: cute.TiledMma
    dkv: cute.TiledMma
    dq: cute.TiledMma


class SmemLayouts(NamedTuple):
    """Shared-memory layouts: Q / dO stages, K / V, the dS tile; the TMA dQ staging tile, the FP8 Q / dO
    stages and K / V (None where unused)."""

    q: cute.ComposedLayout
    k: cute.ComposedLayout
    ds: cute.ComposedLayout
    dq: cute.ComposedLayout | None
    q8: cute.ComposedLayout | None
    k8: cute.ComposedLayout | None


class BwdOperands(NamedTuple):
    """Everything the kernel reads (one frozen struct; its dynamic members become the kernel's parameters
    in this order). Tensors are the (rows, H, heads) views of the 2-D operands; lse, delta, lens as given."""

    mma: Mmas
    q: TmaTile
    do: TmaTile
    k: TmaTile
    v: TmaTile  # (sdp_fp8: a view of k, not read)
    lse: cute.Tensor
    delta: cute.Tensor
    lens: cute.Tensor  # (2, B) lengths; packed: the seqs table (4, S)
    work: cute.Tensor | None  # packed: the key-tile work list (2, Sp / 128) (None dense)
    dq: cute.Tensor
    dk: cute.Tensor
    dv: cute.Tensor
    scale: Float32  # tau
    dq_mode: DqModeOperands | None
    dq_tma: TmaTile | None  # the TMA dQ stores' reduce-add atom on dq
    fp8: Fp8Operands | None
    smem: SmemLayouts


class BwdSmem(NamedTuple):
    """The kernel's shared-memory tensors and addresses."""

    q: cute.Tensor  # (64, H, q_stage) Q stages
    do: cute.Tensor
    k: cute.Tensor  # (128, H, 1)
    v: cute.Tensor  # (sdp_fp8: sK, not read)
    ds: cute.Tensor  # (64 queries, 128 keys, 2) dS tile
    amax: cute.Tensor  # the dS block amax exchange (parity, warp, query block)
    stats: cute.Tensor  # smem_stats: (query column, LSE / delta, stage); else amax (unused)
    stats_base: Int32  # its shared address (smem_stats)
    dq_base: Int32  # the dQ staging tile's shared address
    dq: cute.Tensor | None  # the TMA dQ stores' staging tile
    fp8: tuple | None  # sdp_fp8: (Q8, dO8, K8, V8) stages
