"""The persistent tile schedule of the MX GEMMs (kernels/sm90/mx_gemm.py, kernels/sm100/mx_gemm.py), arch-neutral.

GemmTileScheduler: grid min(tiles, CTAs) CTAs (a multiple of the cluster size), CTA x runs work items x,
x + grid, ... of the G * ceil(M / tile_m) * ceil(N / tile_n) output tiles, rasterized in bands of group_m M
tiles (L2 reuse of the B strips). The Hopper GEMM bounds the grid at compile time (max_ctas: the H200's 132
SMs); the Blackwell GEMM takes the device's SM count at launch (grid_for). Plain Python, traced inline.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
from cutlass import Int32


class GemmTile(NamedTuple):
    """One output tile of a batched GEMM (DSL Int32 values)."""

    g: Int32  # batch
    m_tile: Int32  # tile_m-row tile
    n_tile: Int32  # tile_n-column tile


class GemmTileScheduler:
    """Persistent schedule over G x ceil(M / tile_m) x ceil(N / tile_n) tiles (see the module docstring).

    With cluster_m > 1 a work item is a cluster tile: cluster_m consecutive M tiles of one N tile, one per
    CTA of a cluster (rank r takes M tile cluster_m * i + r; a tile past M computes zeros and stores
    nothing); clusters run items c, c + clusters, ... Work item t -> batch g = t // (Mt * Nt); inside a
    batch, bands of group_m (cluster) M tiles: within a band the M tile varies fastest, so the CTAs that
    run at once share a few A and B strips in L2."""

    def __init__(self, tile_m: int, tile_n: int, group_m: int, max_ctas: int | None, cluster_m: int = 1):
        """max_ctas: the compile-time grid bound of grid(); None for a kernel that takes it at run time
        (grid_for)."""
        self.tile_m, self.tile_n, self.group_m = tile_m, tile_n, group_m
        self.max_ctas, self.cluster_m = max_ctas, cluster_m

    def tile_counts(self, m: Int32, n: Int32, g: Int32) -> tuple[Int32, Int32, Int32]:
        """(cluster M tiles, N tiles, total work items)."""
        span = self.tile_m * self.cluster_m
        mt = (m + span - 1) // span
        nt = (n + self.tile_n - 1) // self.tile_n
        return mt, nt, mt * nt * g

    def grid(self, total: Int32) -> Int32:
        """Persistent grid size in CTAs: one CTA per SM (max_ctas), fewer when there are fewer work items;
        a multiple of cluster_m."""
        return cutlass.min(total, Int32(self.max_ctas // self.cluster_m)) * self.cluster_m

    def work_tile(self, t: Int32, m_tiles: Int32, n_tiles: Int32, rank: Int32 | int = 0) -> GemmTile:
        """Work item t (of tile_counts' total) for CTA rank `rank` of its cluster."""
        per_batch = m_tiles * n_tiles
        g = t // per_batch
        r = t - g * per_batch
        band = self.group_m * n_tiles
        first_m = (r // band) * self.group_m
        rows = cutlass.min(m_tiles - first_m, Int32(self.group_m))
        r = r - (r // band) * band
        return GemmTile(g, (first_m + r % rows) * self.cluster_m + rank, r // rows)

    def grid_for(self, total: Int32, ctas: Int32) -> Int32:
        """grid() with the CTA bound `ctas` given at run time (the device's SM count): min(total, ctas /
        cluster_m) clusters, in CTAs."""
        return cutlass.min(total, ctas // self.cluster_m) * self.cluster_m
