"""The MX GEMM kernel path under sharding (8 CPU devices, implementation="emulated": the same
custom_partitioning plumbing as the kernels): row-sharded activations need no gather in the producer pass
or in the forward / dgrad GEMMs, and sharded results equal unsharded ones bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8
from jax_mxfp8.primitives.gemm_operands import gemm_operands
from tests.parallel.sharding_testutil import collectives, mesh, put
from tests.seeding_testutil import test_rng


@pytest.mark.parametrize("shape", [(1, 1024, 256), (2, 1024, 384)], ids=["r1024_c256", "g2_r1024_c384"])
def test_producer_shards_rows_and_columns_in_whole_runs(shape):
    m = mesh((4, 2), ("data", "model"))
    x = jnp.asarray(test_rng().standard_normal(shape), jnp.bfloat16)
    f = lambda x: gemm_operands(x, orientations=("row", "col"), path="emulated")  # noqa: E731
    want = jax.jit(f)(x)
    xs = put(x, m, None, "data", "model")  # R over 4 devices (256 rows each); C over 2 where its 128-runs split evenly
    got = jax.jit(f)(xs)
    for o in ("row", "col"):
        for w, g in zip(want[o], got[o]):
            np.testing.assert_array_equal(np.asarray(w).view(np.uint8), np.asarray(g).view(np.uint8))
    ops = collectives(f, xs)
    if (shape[2] // 128) % 2 == 0:
        assert not ops, ops  # every run is local: no communication at all
    else:  # 3 runs of C do not split over 2 devices: C is gathered, R never
        assert all(op != "all-gather" or "1024" not in s for op, s in ops), ops


def test_row_sharded_activations_take_no_gather_in_the_forward():
    """Data parallelism: x (B, T, D) sharded over B, the weight replicated: the forward's producer pass and
    GEMM run per shard (the weight gradient's contraction over B*T shards K and psums the float32
    partials instead of gathering: tests/parallel/test_gemm_k_sharding.py)."""
    m = mesh((8,), ("data",))
    rng = test_rng()
    x = jnp.asarray(rng.standard_normal((8, 128, 256)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((256, 384)), jnp.bfloat16)
    dn = (((2,), (0,)), ((), ()))
    f = lambda x, w: jax_mxfp8.mx_dot_general(x, w, dn, implementation="emulated")  # noqa: E731
    xs, ws = put(x, m, "data", None, None), put(w, m, None, None)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(xs, ws)), np.asarray(jax.jit(f)(x, w)))
    gathers = [s for op, s in collectives(f, xs, ws) if op == "all-gather"]
    assert not gathers, gathers
