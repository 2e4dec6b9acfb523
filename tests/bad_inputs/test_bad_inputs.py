"""Bad-input probe over every public entry point: each bad input raises a ValueError naming the argument,
or gives the documented result (never a crash, a hang, a silent NaN for finite input, or a wrong answer).

The cases are tables keyed by (public name, kind, detail) in bad_inputs_{formats,gemm,attention,flax}_testutil.py;
test_every_public_name_meets_every_kind fails when a public name (a new op included) lacks a case of some
kind without a stated reason (bad_inputs_testutil.NOT_APPLICABLE)."""

import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from tests.bad_inputs import bad_inputs_attention_testutil as attention_cases
from tests.bad_inputs import bad_inputs_flax_testutil as flax_cases
from tests.bad_inputs import bad_inputs_formats_testutil as formats_cases
from tests.bad_inputs import bad_inputs_gemm_testutil as gemm_cases
from tests.bad_inputs.bad_inputs_testutil import KINDS, NOT_APPLICABLE, covered, public_names

MODULES = (formats_cases, gemm_cases, attention_cases, flax_cases)
RAISES = {k: v for m in MODULES for k, v in m.RAISES.items()}
RESULTS = {k: v for m in MODULES for k, v in m.RESULTS.items()}
XFAIL = flax_cases.XFAIL


def _params(table) -> list:
    marks = lambda key: [pytest.mark.xfail(strict=True, reason=XFAIL[key])] if key in XFAIL else []
    return [pytest.param(key, id=" | ".join(key), marks=marks(key)) for key in table]


@pytest.mark.parametrize("key", _params(RAISES))
def test_bad_input_raises_value_error_naming_the_argument(key):
    fn, match = RAISES[key]
    with pytest.raises(ValueError, match=match):
        fn()


@pytest.mark.parametrize("key", _params(RESULTS))
def test_documented_result(key):
    RESULTS[key]()


def test_every_public_name_meets_every_kind():
    names = public_names()
    reached = covered(RAISES, RESULTS)
    assert all(kind in KINDS for _, kind in reached), sorted({k for _, k in reached} - set(KINDS))
    unknown = sorted({n for n, _ in reached} - set(names))
    assert not unknown, f"cases for names that are not public: {unknown}"
    stale = sorted(set(NOT_APPLICABLE) & reached)
    assert not stale, f"listed as not applicable but reached: {stale}"
    missing = [(n, k) for n in names for k in KINDS if (n, k) not in reached and (n, k) not in NOT_APPLICABLE]
    assert not missing, f"public names without a bad-input case of these kinds (add one, or a reason): {missing}"
    assert len(names) >= 30  # jax_mxfp8, its Flax layer, parallel helpers and the vjp / handoff ops


def test_rms_norm_quantize_of_huge_finite_rows():
    """Rows of 1e20 (x * x overflows float32) normalize to +-1, not 0 (flax's nnx.RMSNorm gives 0): the reference
    and the fused kernel scale a row whose sum of squares overflows (tests/rms_norm/test_rms_norm_quantize.py)."""
    x = jnp.full((2, 64), 1e20, jnp.float32).at[1].multiply(-1)
    y, q = mx.rms_norm_quantize(x, jnp.ones((64,), jnp.float32))
    np.testing.assert_allclose(np.asarray(y), np.sign(np.asarray(x)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(mx.dequantize(q)), np.sign(np.asarray(x)), rtol=1e-2)
