"""The Blackwell kernels on a Blackwell GPU (compute capability 10.0 / 10.3): marked gpu and blackwell, skipped on
anything else. NONE OF THESE HAS RUN YET: no machine of this project has such a GPU; they are written for the
first run on a B200 / GB300 (pytest -m blackwell -s prints the self-test report and the timings).

  self-test       every family's first-use self-test passes (primitives/sm100_self_tests.py)
  exact           on small integers with per-block power-of-two scales (every product and partial sum exact
                  in float32) the GEMM equals its emulation bit for bit for every registered variant but the
                  GELU ones (tanh.approx), over ragged shapes, two batches and more tiles than SMs
  random          on random E4M3 data the plain outputs are within float32 accumulation of the emulation
                  (SQNR), the quantized outputs equal the emulation's except where the two float32
                  accumulators round a value across an FP8 step
  written         every output element and every scale byte is written (NaN-poisoned _into buffers)
  producers       the blocked-scale operand producer and RMSNorm equal their emulation bit for bit
  mx_dot_general  forward, dgrad and wgrad take the sm100 path and match the reference
  timing          ours vs cuDNN's block-scaled GEMM and cuBLAS bf16 (benchmarks/mx_gemm_sm100.py, printed)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.formats import to_blocked_scales
from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library, self_test
from jax_mxfp8.primitives import mx_gemm_sm100 as sm100
from jax_mxfp8.primitives.gemm_operands import gemm_operands
from jax_mxfp8.primitives.gemm_operands import reference as operands_reference
from jax_mxfp8.primitives.mx_gemm_sm100_emulation import emulate_mx_gemm_sm100

pytestmark = [pytest.mark.gpu, pytest.mark.blackwell]

SHAPES = ((1, 256, 256, 256), (2, 224, 160, 224), (1, 4096, 4224, 512))
"""(G, M, N, K): whole tiles; ragged M, N, K with two batches; more tiles than SMs (a persistent lap)."""


@pytest.fixture(scope="module", autouse=True)
def _blackwell():
    ok, why = library.kernels_runnable(registry.MXGemmSm100Config.archs)
    if not ok:
        pytest.skip(why)


def _emulated(*args, config):
    with jax.default_device(jax.devices("cpu")[0]):
        return emulate_mx_gemm_sm100(*(None if a is None else jax.device_put(a, jax.devices("cpu")[0]) for a in args),
                                     config)  # fmt: skip


def _operands(shape, integers: bool, seed: int = 0):
    g, m, n, k = shape
    rng = np.random.default_rng(seed)
    if integers:
        a, b = rng.integers(-2, 3, (g, m, k)), rng.integers(-2, 3, (g, n, k))
        ea = (np.arange(m)[None, :, None] * 37 + np.arange(k // 32)[None, None, :] * 11) % 7 - 3
        eb = (np.arange(n)[None, :, None] * 13 + np.arange(k // 32)[None, None, :] * 5) % 7 - 3
        sa, sb = np.broadcast_to(127 + ea, (g, m, k // 32)), np.broadcast_to(127 + eb, (g, n, k // 32))
        bias = rng.integers(-4, 5, n)
    else:
        a, b = rng.standard_normal((g, m, k)) * 8, rng.standard_normal((g, n, k)) * 8
        sa, sb = rng.integers(120, 135, (g, m, k // 32)), rng.integers(120, 135, (g, n, k // 32))
        bias = rng.standard_normal(n)
    e4m3 = jnp.float8_e4m3fn
    return (
        jnp.asarray(a, jnp.float32).astype(e4m3),
        jnp.asarray(b, jnp.float32).astype(e4m3),
        to_blocked_scales(jnp.asarray(sa, jnp.uint8)),
        to_blocked_scales(jnp.asarray(sb, jnp.uint8)),
        jnp.asarray(bias, jnp.float32),
    )


def _run(variant, a, b, sa, sb, bias, out=None):
    bias = bias if variant.has_bias else None
    return sm100.mx_gemm_sm100(
        a, b, sa, sb, bias, out_dtype=variant.out_dtype, epilogue=variant.epilogue, activation=variant.activation,
        path="cuda", cta_group=variant.cta_group, out=out,
    )  # fmt: skip


PRODUCTION = [v for v in registry.MX_GEMM_SM100_VARIANTS if v.tune == 0]


def test_every_self_test_passes_on_this_gpu():
    self_test.reset()
    reports = self_test.run_all()
    print(self_test.report_text(reports))
    assert all(r.status == "passed" for r in reports), self_test.report_text(reports)


@pytest.mark.parametrize("variant", [v for v in PRODUCTION if not v.activation], ids=lambda v: v.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_exact_on_small_integers(variant, shape):
    if variant.epilogue == "rowcol" and shape[1] % 32:
        pytest.skip("the column orientation needs M % 32 == 0")
    ops = _operands(shape, integers=True)
    got = _run(variant, *ops)
    want = _emulated(*ops[:4], ops[4] if variant.has_bias else None, config=variant)
    for name, g in zip(variant.outputs, got, strict=True):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(want[name]).view(np.uint8), name)


@pytest.mark.parametrize("variant", PRODUCTION, ids=lambda v: v.name)
def test_random_operands_match_the_emulation(variant):
    ops = _operands((2, 224, 160, 448), integers=False, seed=1)
    got = dict(zip(variant.outputs, _run(variant, *ops), strict=True))
    want = _emulated(*ops[:4], ops[4] if variant.has_bias else None, config=variant)
    c, c_want = np.asarray(got["c"], np.float64), np.asarray(want["c"], np.float64)
    print(variant.name, f"c SQNR {sqnr_db(c_want, c):.1f} dB")
    assert sqnr_db(c_want, c) > 45  # bf16 outputs: ~52 dB of rounding; a layout bug: < 10 dB
    for q, s in (("q", "s"), ("qc", "sc")):
        if q in got:  # ties of the two accumulators' roundings move a few elements by one FP8 step
            same = np.mean(np.asarray(got[q]).view(np.uint8) == np.asarray(want[q]).view(np.uint8))
            assert same > 0.97 if variant.activation else same > 0.995, (q, same)
            assert np.mean(np.asarray(got[s]) == np.asarray(want[s])) > 0.99, s


@pytest.mark.parametrize("variant", PRODUCTION, ids=lambda v: v.name)
def test_every_output_is_written(variant):
    """The _into targets with NaN-filled outputs (0xFF-filled scale buffers): every element and every scale byte
    (padding included, which must be 0) is written."""
    ops = _operands((2, 224, 160, 224), integers=True)
    avals = sm100._outputs(sm100.MXGemmSm100Call(variant), ops[0], ops[1])
    poisoned = tuple(
        jnp.full(a.shape, 0xFF, a.dtype) if a.dtype == jnp.uint8 else jnp.full(a.shape, jnp.nan, a.dtype) for a in avals
    )
    got = _run(variant, *ops, out=poisoned)
    want = _emulated(*ops[:4], ops[4] if variant.has_bias else None, config=variant)
    for name, g in zip(variant.outputs, got, strict=True):
        if not variant.activation:
            np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(want[name]).view(np.uint8), name)
        else:
            assert not np.any(np.isnan(np.asarray(g, np.float32))) if g.dtype != jnp.uint8 else True, name


@pytest.mark.parametrize("in_dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("orientations", [("row",), ("col",), ("row", "col")])
def test_the_blocked_producer_equals_its_emulation(in_dtype, orientations):
    x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 352, 416)) * 50, in_dtype)
    got = gemm_operands(x, orientations=orientations, path="cuda", layout="blocked")
    for o in orientations:
        want = operands_reference(x, jnp.dtype(jnp.float8_e4m3fn), "up", o, "blocked")
        for g, w in zip(got[o], want, strict=True):
            np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8), o)


def test_rms_norm_quantize_with_blocked_scales_is_quantize_of_its_output():
    x = jnp.asarray(np.random.default_rng(3).standard_normal((3, 200, 320)), jnp.bfloat16)
    y, q = mx.rms_norm_quantize(x, jnp.ones((320,)), implementation="cuda", scale_layout="blocked")
    want = mx.quantize(y, implementation="xla", scale_layout="blocked")
    np.testing.assert_array_equal(np.asarray(q.data).view(np.uint8), np.asarray(want.data).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(q.scale), np.asarray(want.scale))


def test_mx_dot_general_takes_the_sm100_path_and_matches_the_reference():
    x = jnp.asarray(np.random.default_rng(4).standard_normal((4, 256, 1024)), jnp.bfloat16)
    w = jnp.asarray(np.random.default_rng(5).standard_normal((1024, 768)) / 32, jnp.float32)
    dn = (((2,), (0,)), ((), ()))

    def grads(implementation):
        f = lambda x, w: jnp.sum(mx.mx_dot_general(x, w, dn, implementation=implementation).astype(jnp.float32) ** 2)  # noqa: E731
        return jax.jit(jax.value_and_grad(f, (0, 1)))(x, w)

    with impl.record() as decisions:
        got = grads(None)
    assert [d.path for d in decisions if d.op == "mx_dot_general"] == ["cuda"]
    hlo = jax.jit(lambda a, b: mx.mx_dot_general(a, b, dn)).lower(x, w).as_text()
    assert "jax_mxfp8_mx_gemm_sm100" in hlo and "jax_mxfp8_blocked_operands" in hlo
    want = grads("xla")
    assert sqnr_db(np.asarray(want[0]), np.asarray(got[0])) > 60
    for g, r in zip(got[1], want[1], strict=True):
        assert sqnr_db(np.asarray(r, np.float64), np.asarray(g, np.float64)) > 40


def test_timing_against_cudnn_and_cublas(tmp_path):
    """Prints TFLOP/s of ours, cuDNN's block-scaled GEMM and cuBLAS bf16 (benchmarks/mx_gemm_sm100.py)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import mx_gemm_sm100 as bench

    assert bench.main(["--out", str(tmp_path / "t.json"), "--time-budget", "120"]) == 0
