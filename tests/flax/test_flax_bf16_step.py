"""The BF16 policy's train step has the stock block's GEMMs: the step benchmarks/train_step.py times, lowered.

Why (docs/perf/journal/perf-notes.md, "BF16 policy vs stock block"): when every BF16 linear asked its GEMMs for float32
results (forward and dx GEMMs over (B, T, features), dkernel over the parameters) and converted them to
bfloat16 afterwards, the step moved ~2.4 GB more than the stock Flax block (nnx.Linear(dtype=bf16), whose
GEMMs write bfloat16) and was 8% slower on the H200. A GEMM's output is always written to memory, unlike
an elementwise float32 intermediate, which XLA fuses; so the dtypes of the lowered dot_generals pin it.
"""

from __future__ import annotations

import collections
import importlib.util
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
DOT = re.compile(
    r"stablehlo.dot_general [^:]*: \(tensor<([^>]*)x(\w+)>, tensor<[^>]*x(\w+)>\) -> tensor<([^>]*)x(\w+)>"
)
SMALL = dict(d=128, heads=4, t=64, b=2)


@pytest.fixture(scope="module")
def train_step():
    """benchmarks/train_step.py as a module (its folder on sys.path for its `timing` import)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("train_step_bench", BENCH / "train_step.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def _lowered_dots(train_step, variant: str) -> list[tuple[str, str, str, str]]:
    """(result shape, lhs dtype, rhs dtype, result dtype) of every dot_general in the lowered step."""
    step, params = train_step.make_step(train_step.build(variant, SMALL["d"], SMALL["heads"]))
    x = jax.ShapeDtypeStruct((SMALL["b"], SMALL["t"], SMALL["d"]), jnp.bfloat16)
    txt = step.lower(params, x, x).as_text()
    return [(out_shape, lhs, rhs, out) for _, lhs, rhs, out_shape, out in DOT.findall(txt)]


def test_bf16_policy_step_has_the_stock_blocks_gemm_dtypes(train_step):
    ours, stock = _lowered_dots(train_step, "bf16_policy"), _lowered_dots(train_step, "stock")
    types = lambda dots: collections.Counter(d[1:] for d in dots)  # noqa: E731
    # 12 linear GEMMs (4 layers x forward, dx, dkernel) + the attention's (XLA's path on CPU, cuDNN on GPU)
    assert len(ours) == len(stock) >= 12
    assert types(ours) == types(stock), (types(ours), types(stock))


def test_bf16_policy_step_writes_no_float32_activation_or_weight_gradient_gemm(train_step):
    b, t, d = SMALL["b"], SMALL["t"], SMALL["d"]
    # the linear GEMMs' results: (B, T, n*d) activations / input gradients and (d, n*d) / (n*d, d) kernels
    linear = {f"{b}x{t}x{n * d}" for n in (1, 3, 4)} | {f"{d}x{n * d}" for n in (1, 3, 4)} | {f"{4 * d}x{d}"}
    ours = [dot for dot in _lowered_dots(train_step, "bf16_policy") if dot[0] in linear]
    assert len(ours) == 12, ours
    assert all(dot[1:] == ("bf16", "bf16", "bf16") for dot in ours), [dot for dot in ours if dot[3] != "bf16"]
