"""Declared tensor-memory (TMEM) maps of the Blackwell kernels, and their checker. Pure Python (no DSL).

TMEM is 128 lanes x 512 columns of 32-bit cells per SM. A kernel allocates a power-of-two number of columns
(>= 32) with tcgen05.alloc and places its accumulators, scale factors and operands in column ranges of that
allocation. Every sm100 kernel declares its placement as a TmemMap: named regions (first column, width) and
the pipeline phases in which each holds live data. The kernel reads its column offsets from the map (so the
map is what the kernel does, not a description next to it), and `problems()` finds what would corrupt data
on the hardware: two regions that overlap in columns while both are live in some phase, a region outside
the allocation, an allocation over the 512 columns. Regions may share columns when their phases are
disjoint (FlashAttention-4's P written over the S it was computed from is one such alias).

  TmemRegion(name, start, cols, phases)   columns [start, start + cols), live in `phases`
  TmemMap(kernel, phases, regions)        .alloc_columns, .problems(), .check(), .region(name), .table()
"""

from __future__ import annotations

import dataclasses

MAX_COLUMNS = 512
"""Columns of TMEM per SM (sm_100 / sm_103)."""
MIN_ALLOC = 32
"""The smallest tcgen05.alloc (columns); allocations are powers of two."""
LANES = 128


@dataclasses.dataclass(frozen=True)
class TmemRegion:
    """Columns [start, start + cols) of every lane, holding live data during `phases`."""

    name: str
    start: int
    cols: int
    phases: frozenset[str]

    @property
    def end(self) -> int:
        return self.start + self.cols

    def overlaps(self, other: TmemRegion) -> bool:
        """True when the column ranges intersect (whatever the phases)."""
        return self.start < other.end and other.start < self.end


def region(name: str, start: int, cols: int, *phases: str) -> TmemRegion:
    """A TmemRegion with its phases given as arguments."""
    return TmemRegion(name, start, cols, frozenset(phases))


@dataclasses.dataclass(frozen=True)
class TmemMap:
    """The TMEM placement of one kernel.

    Attributes:
      kernel: the kernel (variant) name, for messages.
      phases: every pipeline phase a region may name (e.g. "mma", "epilogue").
      regions: the regions, in column order or not.
    """

    kernel: str
    phases: tuple[str, ...]
    regions: tuple[TmemRegion, ...]

    @property
    def used_columns(self) -> int:
        """One past the last column any region uses."""
        return max((r.end for r in self.regions), default=0)

    @property
    def alloc_columns(self) -> int:
        """What the kernel passes to tcgen05.alloc: the smallest power of two >= used_columns and >= 32."""
        n = MIN_ALLOC
        while n < self.used_columns:
            n *= 2
        return n

    def region(self, name: str) -> TmemRegion:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(f"{self.kernel}: no TMEM region {name!r} (has {[r.name for r in self.regions]})")

    def problems(self) -> list[str]:
        """Every violation, as readable sentences (empty when the map is sound)."""
        out = []
        names = [r.name for r in self.regions]
        for name in sorted({n for n in names if names.count(n) > 1}):
            out.append(f"region name {name!r} is used twice")
        for r in self.regions:
            if r.cols <= 0 or r.start < 0:
                out.append(f"{r.name}: start {r.start}, {r.cols} columns (needs start >= 0 and cols > 0)")
            unknown = sorted(r.phases - set(self.phases))
            if unknown or not r.phases:
                out.append(f"{r.name}: phases {sorted(r.phases)} (declared: {list(self.phases)})")
        for i, a in enumerate(self.regions):
            for b in self.regions[i + 1 :]:
                both = sorted(a.phases & b.phases)
                if a.overlaps(b) and both:
                    out.append(
                        f"{a.name} [{a.start}, {a.end}) and {b.name} [{b.start}, {b.end}) overlap while both "
                        f"are live in {both}"
                    )
        if self.alloc_columns > MAX_COLUMNS:
            out.append(f"needs {self.used_columns} columns (allocation {self.alloc_columns}) > {MAX_COLUMNS}")
        return out

    def check(self) -> TmemMap:
        """self, or ValueError listing every problem."""
        found = self.problems()
        if found:
            raise ValueError(f"TMEM map of {self.kernel}: " + "; ".join(found))
        return self

    def table(self) -> str:
        """A Markdown table of the regions (docs, tool output)."""
        rows = ["| region | columns | live in |", "| --- | --- | --- |"]
        for r in sorted(self.regions, key=lambda r: (r.start, r.name)):
            rows.append(f"| {r.name} | [{r.start}, {r.end}) | {', '.join(p for p in self.phases if p in r.phases)} |")
        return "\n".join(rows)
