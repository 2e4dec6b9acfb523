"""Per-test deterministic seeds: a test's random inputs depend only on the test itself.

`test_seed()` hashes (zlib.crc32, stable across processes, unlike hash() of a str) the node id of the
running pytest test (from PYTEST_CURRENT_TEST, so parametrized cases differ) together with a per-test call
counter, so the k-th draw of a test is the same whether it runs alone, in its file or in the full suite,
and in any order. Outside pytest (a script importing a test helper) the node id is "" and the counter
still makes every call distinct and deterministic.
"""

from __future__ import annotations

import collections
import os
import zlib

import numpy as np

_calls: collections.Counter[str] = collections.Counter()


def current_test_id() -> str:
    """The running test's node id ("tests/test_x.py::test_y[case]"), without pytest's " (call)" suffix."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def test_seed(salt: int = 0) -> int:
    """A 32-bit seed from the current test's node id and how many seeds that test has drawn so far."""
    node = current_test_id()
    n = _calls[node]
    _calls[node] += 1
    return zlib.crc32(f"{node}#{n}#{salt}".encode())


def test_rng(salt: int = 0) -> np.random.Generator:
    """A NumPy generator seeded with test_seed(salt)."""
    return np.random.default_rng(test_seed(salt))


test_seed.__test__ = False  # not a test, despite the name
test_rng.__test__ = False
