"""The Blackwell attention forward's synchronization protocol, run as a model on CPU.

kernels/sm100/attention_fwd*.py cannot run here (no Blackwell GPU), so this test transcribes each warp role's
loop over work items -- which mbarrier or named barrier it waits on with which phase, what it arrives on,
what the MMA warp commits -- into a Python generator, and runs the roles under many random interleavings
with asynchronous TMA loads and in-order asynchronous MMA completions (a tcgen05.commit arrives when every
MMA issued before it has completed). It checks, for item lists with n_kv = 0, 1 and many and with padding
items (packed work lists), that

  * every role finishes (no deadlock), and no barrier is waited on after it completed two phases past the
    waiter's (an mbarrier parity wait would then block forever or pass on the wrong phase), and no named
    barrier mixes two generations of arrivals;
  * every buffer handed over is read with the contents of the step it belongs to: alpha and the final row
    statistics in shared memory (softmax -> correction), P and its scale bytes (softmax -> the PV MMA, read
    when the MMA executes), the O tile in shared memory (correction -> epilogue warp), Q and K/V ring stages
    (TMA -> MMA), O in TMEM (PV writes, correction rescales / reads it out).

The model's role code mirrors the kernel's line by line (same loops, same phase arithmetic); a deliberately
broken protocol (the softmax not waiting for the final-statistics buffer) is caught.
"""

from __future__ import annotations

import random

import pytest


class Deadlock(AssertionError):
    pass


class Model:
    def __init__(self, rng: random.Random, stages: int, tma_rate: float):
        self.rng = rng
        self.stages = stages  # K/V ring stages
        self.tma_rate = tma_rate  # probability per step that a pending TMA load lands
        self.mbar: dict[str, list[int]] = {}  # name -> [arrivals in the current phase, completed phases]
        self.count: dict[str, int] = {}
        self.named: dict[str, list[int]] = {}  # name -> [arrivals of the open generation, generations done]
        self.pending_tma: list[tuple[str, object]] = []
        self.mma_queue: list[tuple[str, object]] = []  # in issue order: ("mma", fn) or ("commit", bar)
        self.mem: dict[object, object] = {}

    # ---- mbarriers
    def init(self, name: str, count: int) -> None:
        self.mbar[name] = [0, 0]
        self.count[name] = count

    def arrive(self, name: str, n: int = 1) -> None:
        b = self.mbar[name]
        b[0] += n
        assert b[0] <= self.count[name], f"{name}: more arrivals than its count in one phase"
        if b[0] == self.count[name]:
            b[0], b[1] = 0, b[1] + 1

    def passes(self, name: str, parity: int, expected: int) -> bool:
        """A parity wait for completion number `expected` (0-based): passes once that phase completed; the
        barrier must never be two phases ahead (the wait would then see the wrong parity)."""
        done = self.mbar[name][1]
        assert parity == expected % 2, f"{name}: parity {parity} for completion {expected}"
        if done > expected + 1:
            raise AssertionError(f"{name}: completed {done} phases, a waiter still expects completion {expected}")
        return done > expected

    # ---- named barriers (bar.arrive by one side, bar.sync by the other)
    def named_arrive(self, name: str) -> None:
        g = self.named.setdefault(name, [0, 0])
        assert g[0] == 0, f"named barrier {name}: a second generation of arrivals before the first was consumed"
        g[0] = 1

    def named_sync_ready(self, name: str) -> bool:
        return self.named.setdefault(name, [0, 0])[0] == 1

    def named_consume(self, name: str) -> None:
        self.named[name] = [0, self.named[name][1] + 1]

    # ---- asynchronous engines
    def step_async(self) -> bool:
        moved = False
        if self.pending_tma and self.rng.random() < self.tma_rate:
            i = self.rng.randrange(len(self.pending_tma))
            bar, (key, value) = self.pending_tma.pop(i)
            self.mem[key] = value
            self.arrive(bar)
            moved = True
        if self.mma_queue and self.rng.random() < 0.5:
            kind, what = self.mma_queue.pop(0)  # in issue order
            if kind == "mma":
                what()
            else:
                self.arrive(what)
            moved = True
        return moved


def wait(m: Model, name: str, parity: int, expected: int):
    while not m.passes(name, parity, expected):
        yield


# ------------------------------------------------------------------------------------- the roles (kernel)
def load_role(m: Model, items):
    pos, q_items = 0, 0

    def load_kv(p, what):
        yield from wait(m, f"kv_empty{p % m.stages}", ((p // m.stages) % 2) ^ 1, p // m.stages - 1)
        m.pending_tma.append((f"kv_full{p % m.stages}", (("kv", p % m.stages), what)))

    for i, (live, n) in enumerate(items):
        if live and n > 0:
            for s in range(2):
                yield from wait(m, f"q_empty{s}", (q_items % 2) ^ 1, q_items - 1)
                m.pending_tma.append((f"q_full{s}", (("q", s), (i, s))))
                if s == 0:
                    yield from load_kv(pos, ("K", i, 0))
                else:
                    yield from load_kv(pos + 1, ("V", i, 0))
            for j in range(1, n):
                yield from load_kv(pos + 2 * j, ("K", i, j))
                yield from load_kv(pos + 2 * j + 1, ("V", i, j))
            pos += 2 * n
            q_items += 1
    for k in range(m.stages):  # producer_tail
        p = pos + k
        yield from wait(m, f"kv_empty{p % m.stages}", ((p // m.stages) % 2) ^ 1, p // m.stages - 1)


def mma_role(m: Model, items):
    state = {"pos": 0, "tiles": 0}

    def expect(key, value):
        def check():
            assert m.mem.get(key) == value, f"MMA read {key} = {m.mem.get(key)}, want {value}"

        return check

    def kv_wait(p):
        yield from wait(m, f"kv_full{p % m.stages}", (p // m.stages) % 2, p // m.stages)

    def release(bar):
        m.mma_queue.append(("commit", bar))

    def qk(s, i, j, k_pos):
        m.mma_queue.append(("mma", expect(("q", s), (i, s))))
        m.mma_queue.append(("mma", expect(("kv", k_pos % m.stages), ("K", i, j))))
        release(f"s_full{s}")

    def pv(s, i, j, v_pos, first):
        t = state["tiles"]
        yield from wait(m, f"p_ready{s}", t % 2, t)
        m.mma_queue.append(("mma", expect(("P", s), (i, j))))
        m.mma_queue.append(("mma", expect(("kv", v_pos % m.stages), ("V", i, j))))
        o = ("O", s)

        def accumulate():
            assert m.mem.get(("O_free", s)) == (i, j), f"PV_{s} {(i, j)} onto O not released for it"
            m.mem[o] = (i, j)

        m.mma_queue.append(("mma", accumulate))
        if s == 1:
            release(f"kv_empty{v_pos % m.stages}")

    def drained(s):
        while not m.named_sync_ready(f"s_drained{s}"):
            yield
        m.named_consume(f"s_drained{s}")

    q_items = 0
    pending, first_qk = None, True
    for i, (live, n) in enumerate(items):
        if not (live and n > 0):
            continue
        pos = state["pos"]
        yield from kv_wait(pos)
        for s in range(2):
            if pending is not None:
                pi, pn, pv_pos = pending
                if s == 0:
                    yield from kv_wait(pv_pos)
                yield from pv(s, pi, pn - 1, pv_pos, pn == 1)
                release(f"o_full{s}")
            yield from wait(m, f"q_full{s}", q_items % 2, q_items)
            if s == 0:
                if not first_qk:
                    yield from drained(1)
            else:
                yield from drained(0)
            qk(s, i, 0, pos)
        if pending is not None:
            state["tiles"] += 1
        release(f"kv_empty{pos % m.stages}")
        first_qk = False
        for j in range(n - 1):
            v_pos, k_pos = pos + 2 * j + 1, pos + 2 * j + 2
            yield from kv_wait(v_pos)
            for s in range(2):
                yield from pv(s, i, j, v_pos, j == 0)
                if s == 0:
                    yield from kv_wait(k_pos)
                yield from drained(1 - s)
                qk(s, i, j + 1, k_pos)
            release(f"kv_empty{k_pos % m.stages}")
            state["tiles"] += 1
        for s in range(2):
            release(f"q_empty{s}")
        pending = (i, n, pos + 2 * n - 1)
        state["pos"] = pos + 2 * n
        q_items += 1
    if pending is not None:
        pi, pn, pv_pos = pending
        yield from kv_wait(pv_pos)
        for s in range(2):
            yield from pv(s, pi, pn - 1, pv_pos, pn == 1)
            release(f"o_full{s}")
        yield from drained(1)


def softmax_role(m: Model, items, s: int, wait_final_empty: bool = True):
    tiles, done = 0, 0
    for i, (live, n) in enumerate(items):
        if not (live and n > 0):
            continue
        for j in range(n):
            yield from wait(m, f"s_full{s}", tiles % 2, tiles)
            m.named_arrive(f"s_drained{s}")
            m.mem[("alpha", s)] = (i, j)
            m.arrive(f"stats{s}", 128)
            m.mem[("P", s)] = (i, j)
            m.arrive(f"p_ready{s}", 128)
            tiles += 1
        if wait_final_empty:
            yield from wait(m, f"final_empty{s}", (done % 2) ^ 1, done - 1)
        m.mem[("final", s)] = i
        m.arrive(f"final_full{s}", 128)
        done += 1


def correction_role(m: Model, items):
    tiles, mma_items, epi_items = 0, 0, 0
    for i, (live, n) in enumerate(items):
        if not live:
            continue
        if n > 0:
            for j in range(n):
                for s in range(2):
                    yield from wait(m, f"stats{s}", tiles % 2, tiles)
                    assert m.mem[("alpha", s)] == (i, j), f"alpha_{s} read {m.mem[('alpha', s)]}, want {(i, j)}"
                    if j > 0:
                        assert m.mem.get(("O", s)) == (i, j - 1), f"rescale of O_{s} before PV {(i, j - 1)}"
                    m.mem[("O_free", s)] = (i, j)
                    m.arrive(f"p_ready{s}", 128)
                tiles += 1
            for s in range(2):
                yield from wait(m, f"o_full{s}", mma_items % 2, mma_items)
                assert m.mem.get(("O", s)) == (i, n - 1), f"O_{s} read out before its last PV"
                yield from wait(m, f"final_full{s}", mma_items % 2, mma_items)
                assert m.mem[("final", s)] == i, f"final stats of stage {s} overwritten"
                m.arrive(f"final_empty{s}", 128)
                yield from store_tile(m, s, i, epi_items)
            mma_items += 1
        else:
            for s in range(2):
                yield from store_tile(m, s, i, epi_items)
        epi_items += 1


def store_tile(m: Model, s: int, i: int, epi_items: int):
    yield from wait(m, f"epi_empty{s}", (epi_items % 2) ^ 1, epi_items - 1)
    m.mem[("sO", s)] = i
    m.arrive(f"epi_full{s}", 128)


def epilogue_role(m: Model, items):
    epi_items = 0
    for i, (live, _) in enumerate(items):
        if not live:
            continue
        for s in range(2):
            yield from wait(m, f"epi_full{s}", epi_items % 2, epi_items)
            assert m.mem[("sO", s)] == i, f"sO_{s} holds item {m.mem[('sO', s)]}, want {i}"
        for s in range(2):
            m.arrive(f"epi_empty{s}", 32)
        epi_items += 1
        m.mem["stored"] = m.mem.get("stored", 0) + 1


COUNTS = {"s_full": 1, "p_ready": 256, "o_full": 1, "stats": 128, "final_full": 128, "final_empty": 128,
          "epi_full": 128, "epi_empty": 32, "q_full": 1, "q_empty": 1}  # fmt: skip


def run(items, seed: int, wait_final_empty: bool = True, stages: int = 2, tma_rate: float = 0.5) -> None:
    rng = random.Random(seed)
    m = Model(rng, stages, tma_rate)
    for name, count in COUNTS.items():
        for s in range(2):
            m.init(f"{name}{s}", count)
    for k in range(stages):
        m.init(f"kv_full{k}", 1)
        m.init(f"kv_empty{k}", 1)
    roles = [
        load_role(m, items),
        mma_role(m, items),
        softmax_role(m, items, 0, wait_final_empty),
        softmax_role(m, items, 1, wait_final_empty),
        correction_role(m, items),
        epilogue_role(m, items),
    ]
    alive = list(roles)
    stalled = 0
    while alive or m.pending_tma or m.mma_queue:
        moved = m.step_async()
        if alive:
            role = rng.choice(alive)
            try:
                before = (len(m.pending_tma), len(m.mma_queue), str(m.mbar), str(m.named), str(m.mem))
                next(role)
                moved = moved or before != (
                    len(m.pending_tma), len(m.mma_queue), str(m.mbar), str(m.named), str(m.mem)
                )  # fmt: skip
            except StopIteration:
                alive.remove(role)
                moved = True
        stalled = 0 if moved else stalled + 1
        if stalled > 5000:
            raise Deadlock(f"no progress: {len(alive)} roles blocked, barriers {m.mbar}")
    assert m.mem.get("stored", 0) == sum(live for live, _ in items)  # every live item's O stored
    mma_tiles = sum(n for live, n in items if live)
    assert all(m.mbar[f"p_ready{s}"][1] == mma_tiles for s in range(2))  # every PV fed


ITEM_LISTS = {
    "one_item_one_tile": [(True, 1)],
    "long_items": [(True, 5), (True, 7)],
    "single_tiles": [(True, 1)] * 5,
    "mixed_with_empty": [(True, 3), (True, 0), (True, 1), (True, 0), (True, 4), (True, 1)],
    "packed_padding": [(True, 6), (True, 2), (True, 1), (False, 0), (False, 0)],
    "all_empty": [(True, 0), (True, 0)],
}


@pytest.mark.parametrize("name", list(ITEM_LISTS))
@pytest.mark.parametrize(("stages", "tma_rate"), [(2, 0.5), (2, 0.1), (4, 0.3)])
def test_protocol_completes_and_hands_over_every_buffer(name, stages, tma_rate):
    for seed in range(6):
        run(ITEM_LISTS[name], seed, stages=stages, tma_rate=tma_rate)


def test_a_missing_wait_is_caught():
    """Without the softmax's wait for the final-statistics buffer, some interleaving overwrites it before
    the correction warps read it (or its mbarrier runs two phases ahead)."""
    failures = []
    for seed in range(40):
        try:
            run([(True, 1)] * 6, seed, wait_final_empty=False)
        except AssertionError as e:
            failures.append(str(e))
    assert failures and all("final" in f for f in failures), failures[:3]
