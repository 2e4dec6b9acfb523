"""Test inputs depend only on the test that draws them (tests/seeding_testutil.py), so a failure reruns alone."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import zlib

import numpy as np

from tests.attention.attention_testutil import fresh_rng
from tests.seeding_testutil import current_test_id, test_seed

TESTS = pathlib.Path(__file__).resolve().parents[1]  # tests/


def test_fresh_rng_depends_only_on_the_test_node_and_draw_count():
    node = current_test_id()
    assert node.endswith("test_seeding.py::test_fresh_rng_depends_only_on_the_test_node_and_draw_count")
    for n in range(2):  # the n-th draw of this test, whatever ran before it in the session
        want = np.random.default_rng(zlib.crc32(f"{node}#{n}#0".encode())).standard_normal(4)
        np.testing.assert_array_equal(fresh_rng().standard_normal(4), want)


def test_seeds_are_stable_across_processes():
    code = "from tests.seeding_testutil import test_seed; print(test_seed())"
    outs = set()
    for hashseed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTEST_CURRENT_TEST="tests/t.py::test_x[a-b] (call)")
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent), env.get("PYTHONPATH", "")])
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        outs.add(run.stdout)
    assert len(outs) == 1
    assert int(outs.pop()) == zlib.crc32(b"tests/t.py::test_x[a-b]#0#0")


def test_no_test_seeds_from_hash_or_a_session_counter():
    bad = re.compile(r"default_rng\([^)]*hash\(|_normal\(hash\(|itertools\.count\(")
    offenders = [p.name for p in TESTS.rglob("*.py") if p.name != "test_seeding.py" and bad.search(p.read_text())]
    assert not offenders, offenders


def test_seed_counter_advances_per_call():
    assert test_seed() != test_seed()
