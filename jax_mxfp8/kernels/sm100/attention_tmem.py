"""The tensor-memory (TMEM) maps of the Blackwell attention kernels, with the orderings that make them safe.

  forward_map(head_dim) / backward_map(head_dim) -> OrderedTmemMap     head_dim 64 or 128
  OrderedTmemMap.conflicts(assume_in_order=...)    pairs of live regions that may overlap
  OrderedTmemMap.check()                           raises unless the map is safe
  OrderedTmemMap.as_tmem_map()                     the same regions as kernels/sm100/tmem_map.TmemMap (the
                                                   kernels' common declaration), phases = one linearization

Pure Python (no DSL import): the CPU tests prove the maps, the kernels take their column offsets from here.

Model. TMEM is 128 lanes x 512 columns of 32 bits per SM; a region is a column range (all 128 lanes) live from
one event to another. Events are the kernel's program points (the MMA warp's issues, in program order; the
other warps' loads and stores) and the executions of the asynchronous tcgen05 operations (`X.exec`: an MMA
reads its operands and writes its accumulator, a tcgen05.cp writes its scale factors). Happens-before edges:
  * program order of one warp's events, and `X.issue -> X.exec`;
  * tcgen05.cp -> the tcgen05.mma issued after it by the same thread (PTX: an implicitly pipelined pair);
  * tcgen05.commit after MMA X, observed by an mbarrier wait at event W: `X'.exec -> W` for every MMA and copy
    X' issued before the commit (a commit tracks all prior asynchronous tcgen05 operations of the thread);
  * a warp's wait for another warp's arrive.
Two regions whose columns intersect are safe when one's end happens before the other's start. Some pairs are
safe only if tcgen05.mma operations execute in issue order across different accumulators (a later MMA's
accumulator write after an earlier MMA's TMEM operand read); FlashAttention-4 and LP-FA4 rely on that on B200 /
GB300, the PTX pipelining rules we know state it only for the same accumulator and shape. Those edges are
kept apart (`assumed`): `conflicts(assume_in_order=False)` lists exactly the pairs that depend on them, and the
design note (docs/perf/blackwell-attention.md) names them. Not verified on hardware.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

from jax_mxfp8.kernels.sm100 import tmem_map

TMEM_COLS = tmem_map.MAX_COLUMNS
SF_COLS = 4
"""TMEM columns of one operand's scale factors for one MMA: 128 rows x 4 K blocks of 32 (one 128x4 chunk, the
M / N <= 128, K = 128 tile of these kernels; K = 64 uses half of it)."""
SF_PAIR = 2 * SF_COLS  # an MMA's SFA and SFB side by side
FP8_COLS = 32  # 128 E4M3 values per lane (P or dS of a 128-wide tile)
STEPS = 3  # iterations unrolled: enough for every reuse distance the maps have (at most one iteration)


@dataclasses.dataclass(frozen=True)
class Region:
    """Columns [start, start + cols) of all lanes, live from event `begin` to event `end` (both included)."""

    name: str
    start: int
    cols: int
    begin: str
    end: str

    @property
    def stop(self) -> int:
        return self.start + self.cols


@dataclasses.dataclass(frozen=True)
class OrderedTmemMap:
    """One kernel's regions (instances over STEPS iterations) and its happens-before graph."""

    name: str
    regions: tuple[Region, ...]
    edges: frozenset[tuple[str, str]]
    assumed: frozenset[tuple[str, str]]  # in-order tcgen05.mma execution across accumulators

    def _after(self, assume_in_order: bool) -> dict[str, set[str]]:
        """event -> every event that happens after it (transitive closure)."""
        succ: dict[str, set[str]] = {}
        for a, b in self.edges | (self.assumed if assume_in_order else frozenset()):
            succ.setdefault(a, set()).add(b)
            succ.setdefault(b, set())
        after: dict[str, set[str]] = {}

        def visit(e: str) -> set[str]:
            if e not in after:
                after[e] = set()
                for n in succ.get(e, ()):
                    after[e] |= {n} | visit(n)
            return after[e]

        for e in list(succ):
            visit(e)
        return after

    def conflicts(self, assume_in_order: bool = True) -> list[tuple[str, str]]:
        """Pairs of regions that share columns and are not ordered (one's end before the other's begin)."""
        after = self._after(assume_in_order)
        out = []
        for a, b in itertools.combinations(self.regions, 2):
            if a.start >= b.stop or b.start >= a.stop:
                continue
            if b.begin in after.get(a.end, ()) or a.begin in after.get(b.end, ()):
                continue
            out.append((a.name, b.name))
        return out

    def linearization(self) -> list[str]:
        """The events in one order consistent with every edge (the in-order assumption included); ties by name."""
        edges = self.edges | self.assumed
        preds: dict[str, set[str]] = {e: set() for e in self.events()}
        for a, b in edges:
            preds[b].add(a)
        order: list[str] = []
        ready = sorted(e for e, p in preds.items() if not p)
        done: set[str] = set()
        while ready:
            e = ready.pop(0)
            order.append(e)
            done.add(e)
            for n in sorted(n for n, p in preds.items() if e in p and n not in done):
                if preds[n] <= done and n not in ready:
                    ready.append(n)
            ready.sort()
        if len(order) != len(preds):
            raise ValueError(f"{self.name}: the happens-before graph has a cycle")
        return order

    def as_tmem_map(self) -> tmem_map.TmemMap:
        """The regions as the kernels' common TmemMap declaration: phases = the events of one linearization,
        each region live from its begin event to its end event in it. One interleaving of the many this map
        is proven for (its overlap check passes whenever check() does)."""
        order = self.linearization()
        pos = {e: i for i, e in enumerate(order)}
        regions = tuple(
            tmem_map.region(r.name, r.start, r.cols, *order[pos[r.begin] : pos[r.end] + 1]) for r in self.regions
        )
        return tmem_map.TmemMap(self.name, tuple(order), regions)

    def events(self) -> set[str]:
        return {e for edge in self.edges | self.assumed for e in edge}

    def check(self) -> None:
        """Raises ValueError unless every region fits the allocation, names known events and no two live
        regions overlap (with the in-order assumption, see the module docstring)."""
        known = self.events()
        for r in self.regions:
            if not (0 <= r.start and r.stop <= TMEM_COLS and r.cols > 0):
                raise ValueError(f"{self.name}: {r.name} columns [{r.start}, {r.stop}) outside [0, {TMEM_COLS})")
            if r.begin not in known or r.end not in known:
                raise ValueError(f"{self.name}: {r.name} lives from/to an unknown event ({r.begin}, {r.end})")
        bad = self.conflicts(assume_in_order=True)
        if bad:
            raise ValueError(f"{self.name}: overlapping live regions {bad}")


class _Graph:
    """Builder: program-ordered event chains, commits, waits, and regions, over STEPS iterations."""

    def __init__(self):
        self.edges: set[tuple[str, str]] = set()
        self.assumed: set[tuple[str, str]] = set()
        self.regions: list[Region] = []
        self.mma_order: list[str] = []  # the MMA warp's issues (MMAs and copies), in program order

    def chain(self, events: Iterable[str]) -> None:
        evs = list(events)
        self.edges.update(zip(evs, evs[1:], strict=False))

    def issue(self, op: str, mma: bool) -> None:
        """The MMA warp issues `op` (an MMA, or the scale-factor copy `cp_*` that feeds the next MMA)."""
        if self.mma_order:
            self.edges.add((self.mma_order[-1], f"{op}.issue"))
        self.edges.add((f"{op}.issue", f"{op}.exec"))
        if mma:
            prev_mmas = [e for e in self.mma_order if not e.split(".")[0].startswith("cp_")]
            if prev_mmas:  # the assumption: MMAs execute in issue order
                self.assumed.add((prev_mmas[-1].replace(".issue", ".exec"), f"{op}.exec"))
            for cp in self.mma_order:  # tcgen05.cp -> a later tcgen05.mma: an implicitly pipelined pair
                if cp.split(".")[0].startswith("cp_"):
                    self.edges.add((cp.replace(".issue", ".exec"), f"{op}.exec"))
        self.mma_order.append(f"{op}.issue")

    def commit(self, name: str) -> None:
        """tcgen05.commit to mbarrier `name` after everything issued so far: each of their .exec -> name."""
        for e in self.mma_order:
            self.edges.add((e.replace(".issue", ".exec"), name))
        self.edges.add((self.mma_order[-1], name))

    def wait(self, before: str, op: str) -> None:
        """The MMA warp waits for event `before` before issuing `op`."""
        self.edges.add((before, f"{op}.issue"))

    def scaled_mma(self, op: str, sf_name: str, sf_start: int, waits: Iterable[str] = (), commit: str = "") -> None:
        """The MMA warp waits for `waits`, copies the MMA's scale factors (SFA, SFB) to columns
        [sf_start, sf_start + SF_PAIR) (region `sf_name`, live until the MMA executes), issues MMA `op`, and
        optionally commits to mbarrier `commit`."""
        cp = f"cp_{op}"
        for w in waits:
            self.wait(w, cp)
        self.issue(cp, mma=False)
        self.issue(op, mma=True)
        if commit:
            self.commit(commit)
        self.region(sf_name, sf_start, SF_PAIR, f"{cp}.exec", f"{op}.exec")

    def region(self, name: str, start: int, cols: int, begin: str, end: str) -> None:
        self.regions.append(Region(name, start, cols, begin, end))

    def build(self, name: str) -> OrderedTmemMap:
        return OrderedTmemMap(name, tuple(self.regions), frozenset(self.edges), frozenset(self.assumed - self.edges))


def _check_head_dim(head_dim: int) -> None:
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim={head_dim} not in (64, 128)")


def forward_map(head_dim: int) -> OrderedTmemMap:
    """The forward (two 128-row Q tiles per CTA, stages s = 0, 1; 128-key tiles j):

    MMA warp, per key tile j >= 0 (after the prologue QK_0(0), QK_1(0)), for s = 0, 1:
      [wait P_s(j) full, O_s rescaled] cp SF_PV_s; PV_s(j) = P_s V_j into O_s
      [wait S_{1-s} drained (s = 0: of tile j; s = 1: of tile j + 1)] cp SF_QK_s; QK_s(j + 1) into S_s; commit S_s full
    softmax_s: [wait S_s(j) full] tcgen05.ld S_s (S_s drained) ... tcgen05.st P_s (P_s full).
    H128: S_0 | S_1 | O_0 | O_1 fill the 512 columns; P_s and SF_PV_s sit in S_s's drained columns, SF_QK_s in
    the other stage's drained tail. H64: O_s are 64 columns, P_s and every scale slot get their own columns."""
    _check_head_dim(head_dim)
    g = _Graph()
    s_col, o_col = (0, 128), (256, 256 + head_dim)
    if head_dim == 128:
        p_col = (32, 160)
        sf_pv = (64, 192)
        sf_qk = (224, 96)  # SF_QK_0 in S_1's tail, SF_QK_1 in S_0's tail
    else:
        p_col = (384, 416)
        sf_pv = (448, 456)
        sf_qk = (464, 472)
    for s in (0, 1):
        g.region(f"O_{s}", o_col[s], head_dim, "start", "end")
    g.edges.add(("start", "cp_qk0@0.issue"))
    for j in range(STEPS + 1):
        for s in (0, 1):
            if j > 0:  # PV_s(j - 1), then QK_s(j)
                i = j - 1
                g.scaled_mma(f"pv{s}@{i}", f"SF_PV_{s}@{i}", sf_pv[s], [f"p_full{s}@{i}"])
                g.region(f"P_{s}@{i}", p_col[s], FP8_COLS, f"p_store{s}@{i}", f"pv{s}@{i}.exec")
            if j == STEPS:
                continue
            # QK_s's scales go to the other stage's S columns once its softmax has loaded them (S_1 of tile
            # j - 1 for s = 0; S_0 of tile j, just computed, for s = 1); at j = 0, S_1 was never written
            waits = [f"s_drained1@{j - 1}"] if s == 0 and j > 0 else ([f"s_drained0@{j}"] if s == 1 else [])
            g.scaled_mma(f"qk{s}@{j}", f"SF_QK_{s}@{j}", sf_qk[s], waits, commit=f"s_full{s}@{j}")
            g.region(f"S_{s}@{j}", s_col[s], 128, f"qk{s}@{j}.exec", f"s_drained{s}@{j}")
            g.chain([f"s_full{s}@{j}", f"s_drained{s}@{j}", f"p_store{s}@{j}", f"p_full{s}@{j}"])
            if j > 0:  # the softmax warps take the tiles in order
                g.edges.add((f"p_full{s}@{j - 1}", f"s_drained{s}@{j}"))
    g.edges.add((g.mma_order[-1], "end"))
    return g.build(f"attention forward H{head_dim}")


def backward_map(head_dim: int) -> OrderedTmemMap:
    """The backward (one 128-key tile per CTA in the lanes, 128-query steps m; dV and dK accumulate in TMEM):

    MMA warp, per step m (after the prologue S^T(0)):
      [wait dQ(m-1) drained, S^T(m) drained] cp SF_dP; dP^T(m) = V dO^T; commit dP full
      [wait P^T(m) full]                      cp SF_dV; dV += P^T dO
      [wait dP^T(m) drained]                  cp SF_S;  S^T(m+1) = K Q^T; commit S full
      [wait dS(m) full]                       cp SF_dK; dK += dS^T Q
      [wait S^T(m+1) drained]                 cp SF_dQ; dQ(m) = dS K; commit dQ full
    compute warps: S^T drained -> P^T full -> dP^T drained -> dS full; reduce warps: dQ full -> dQ drained.
    H128: S^T | dV | dP^T | dK fill the 512 columns; P^T and the dP / dV / dQ scales in S^T's drained columns,
    dS^T and the S / dK scales in dP^T's, dQ(m) in dP^T's region. H64: dQ and the scales get their own."""
    _check_head_dim(head_dim)
    g = _Graph()
    if head_dim == 128:
        rs, rdv, rp, rdk = 0, 128, 256, 384
        rq = rp
        sf = {"dP": rs + 48, "dV": rs + 56, "dQ": rs + 64, "S": rp + 48, "dK": rp + 56}
    else:
        rs, rp, rdv, rdk, rq = 0, 128, 256, 320, 384
        sf = {"dP": 448, "dV": 456, "dQ": 464, "S": 472, "dK": 480}
    g.region("dV", rdv, head_dim, "start", "end")
    g.region("dK", rdk, head_dim, "start", "end")
    g.edges.add(("start", "cp_S@0.issue"))
    g.scaled_mma("S@0", "SF_S@0", sf["S"], commit="s_full@0")
    for m in range(STEPS):
        n = m + 1
        g.region(f"S^T@{m}", rs, 128, f"S@{m}.exec", f"s_drained@{m}")
        g.region(f"P^T@{m}", rs, FP8_COLS, f"p_store@{m}", f"dV@{m}.exec")
        g.region(f"dP^T@{m}", rp, 128, f"dP@{m}.exec", f"dp_drained@{m}")
        g.region(f"dS^T@{m}", rp, FP8_COLS, f"ds_store@{m}", f"dK@{m}.exec")
        g.region(f"dQ@{m}", rq, head_dim, f"dQ@{m}.exec", f"dq_drained@{m}")
        # compute warps (in step order), reduce warps
        g.chain([f"s_full@{m}", f"s_drained@{m}", f"p_store@{m}", f"p_full@{m}"])
        g.chain([f"p_full@{m}", f"dp_drained@{m}", f"ds_store@{m}", f"ds_full@{m}"])
        g.edges.add((f"dp_full@{m}", f"dp_drained@{m}"))
        g.chain([f"dq_full@{m}", f"dq_drained@{m}"])
        if m > 0:
            g.edges.add((f"ds_full@{m - 1}", f"s_drained@{m}"))
        # the MMA warp
        dq_free = [f"dq_drained@{m - 1}"] if m > 0 else []
        g.scaled_mma(f"dP@{m}", f"SF_dP@{m}", sf["dP"], [f"s_drained@{m}", *dq_free], commit=f"dp_full@{m}")
        g.scaled_mma(f"dV@{m}", f"SF_dV@{m}", sf["dV"], [f"p_full@{m}"])
        g.scaled_mma(f"S@{n}", f"SF_S@{n}", sf["S"], [f"dp_drained@{m}"], commit=f"s_full@{n}")
        g.scaled_mma(f"dK@{m}", f"SF_dK@{m}", sf["dK"], [f"ds_full@{m}"])
        g.scaled_mma(f"dQ@{m}", f"SF_dQ@{m}", sf["dQ"], [f"s_drained@{n}"], commit=f"dq_full@{m}")
    g.chain([f"s_full@{STEPS}", f"s_drained@{STEPS}"])
    g.edges.add((g.mma_order[-1], "end"))
    return g.build(f"attention backward H{head_dim}")
