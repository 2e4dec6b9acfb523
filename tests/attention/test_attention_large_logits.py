"""Large but finite logits: |S| from ~1e7 to ~1e30 on every attention implementation.

At such logits softmax is one-hot at each row's largest logit, so the answer is known exactly: O is the
V row of that key, LSE is the largest logit, dV is the sum of the (quantized) output cotangents of the rows
that pick each key. What it catches: a running max and an exponent that see differently rounded S (XLA
contracting the scale multiply into exp's subtraction as an FMA; the kernel's FFMA) give the reference NaN
rows (P~ > 1, an unsaturated cast of 256 P~ to E4M3) and, past ~1e9, rows of zeros with LSE -inf; the
emulation and the kernel (which saturate P) rows of zeros or rows scaled down.

The oracle is float64 NumPy on the dequantized square-block operands Q^, K^, V^ (what every implementation
starts from); the kernel path (emulated, cuda) re-encodes them to one exponent per sub-tile first
(docs/numerics.md "Hopper attention kernel"), which moves V by up to 2^-4 of its tile's largest element
and can flip a near-tied argmax: those paths are held to that tolerance on all but a few rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.primitives import attention_fwd as afwd
from jax_mxfp8.primitives import library
from tests.attention.attention_testutil import fresh_rng

B, N = 1, 2
# (p_scale, sequence length): one 128-key tile (XLA unrolls the scan and fuses differently: before the fix
# each implementation failed there) and two (the running max moves between tiles)
CASES = [("const", 128), ("const", 256), ("block", 128)]
H_KERNEL, H_REFERENCE = 64, 32  # the reference at H = 32 (the kernel covers 64 and 128)
SCALES = (3e3, 1e5, 1e10, 1e15)  # logits ~ SCALE^2 (tau = H^-1/2): 1e7 .. 1e30
CONFIGS = {"const": mx.AttentionConfig(), "block": mx.AttentionConfig(p_scale="block")}


def _inputs(rng, scale, dtype, t, h):
    q = jnp.asarray(rng.standard_normal((B, t, N, h)) * scale, dtype)
    k = jnp.asarray(rng.standard_normal((B, t, N, h)) * scale, dtype)
    v = jnp.asarray(rng.standard_normal((B, t, N, h)), dtype)
    do = jnp.asarray(rng.standard_normal((B, t, N, h)), dtype)
    return q, k, v, do


def _dequant(x):
    """Square-block Q^ / K^ / V^ / dO^ over (sequence, head_dim) of a (B, L, N, H) array, float64.

    The oracle's quantization is the reference's by choice (implementation="xla"): the kernels do not cover
    blocks over axes (-3, -1), and implementation=None would warn about that on the GPU."""
    q = mx.quantize(x, axis=(-3, -1), block="square", implementation="xla")
    return np.asarray(mx.dequantize(q, jnp.float32, implementation="xla"), np.float64)


def _one_hot_oracle(q, k, v, do):
    """float64: whether each row's argmax is decisive, the expected O, LSE and dV, and the keys whose dV
    an undecided row can touch (its top two)."""
    qd, kd, vd, dod = (_dequant(x) for x in (q, k, v, do))
    s = np.einsum("btnh,bsnh->bnts", qd, kd) * q.shape[-1] ** -0.5
    order = np.argsort(s, axis=-1)[..., -2:]
    top2 = np.take_along_axis(s, order, axis=-1)
    arg = order[..., 1]  # (B, N, T)
    # decisive: the runner-up is >= 100 below (exp(-100) vanishes) and float32 rounding cannot swap them
    decisive = top2[..., 1] - top2[..., 0] > np.maximum(100.0, 1e-5 * np.abs(top2[..., 1]))
    o = np.take_along_axis(vd.transpose(0, 2, 1, 3), arg[..., None], axis=2).transpose(0, 2, 1, 3)  # BTNH
    dv = np.zeros_like(vd)
    touched = np.zeros(vd.shape[:3], bool)  # (B, S, N)
    for bi, ni, ti in np.ndindex(*arg.shape):
        dv[bi, arg[bi, ni, ti], ni] += dod[bi, ti, ni]
        if not decisive[bi, ni, ti]:
            touched[bi, order[bi, ni, ti], ni] = True
    return decisive, o, top2[..., 1], dv, touched


@functools.cache
def _fns(impl: str, p_scale: str):
    config = CONFIGS[p_scale]

    def fwd(q, k, v):
        return mx.dot_product_attention(q, k, v, implementation=impl, config=config, return_residual="lse")

    def loss(q, k, v, do):
        o = mx.dot_product_attention(q, k, v, implementation=impl, config=config)
        return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32))

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _check(impl: str, p_scale: str, t: int, with_grad: bool):
    fwd, grad = _fns(impl, p_scale)
    kernel_path = impl != "xla"
    for scale in SCALES:
        # the kernel path takes bfloat16 (its output dtype); the reference also float32
        dtype, h = (jnp.bfloat16, H_KERNEL) if kernel_path else (jnp.float32, H_REFERENCE)
        q, k, v, do = _inputs(fresh_rng(), scale, dtype, t, h)
        decisive, o_x, lse_x, dv_x, touched = _one_hot_oracle(q, k, v, do)
        assert decisive.mean() > 0.9, "test inputs: too many near-tied rows"
        o, lse = (np.asarray(x, np.float64) for x in fwd(q, k, v))
        where = f"{impl} {p_scale} at |S| ~ {scale**2:.0e}"
        assert np.isfinite(o).all() and np.isfinite(lse).all(), f"{where}: non-finite output or LSE"
        assert (np.abs(o).max(-1) > 0).all(), f"{where}: rows of zeros"
        rows = decisive.transpose(0, 2, 1)  # (B, T, N) like o's rows
        err = np.abs(o - o_x).max(-1)[rows]
        lse_err = (np.abs(lse - lse_x) / np.abs(lse_x))[decisive]
        if kernel_path:
            bound = 2.0**-4 * np.abs(_dequant(v)).max()
            assert np.mean(err <= bound) >= 0.95, f"{where}: O off the one-hot answer ({np.mean(err <= bound):.3f})"
            assert np.quantile(lse_err, 0.95) <= 0.05, f"{where}: LSE off the largest logit"
        else:
            np.testing.assert_allclose(err, 0.0, atol=2e-6, err_msg=where)
            np.testing.assert_allclose(lse_err, 0.0, atol=1e-6, err_msg=where)
        if with_grad:
            dq, dk, dv = (np.asarray(x, np.float64) for x in grad(q, k, v, do))
            for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
                assert np.isfinite(g).all(), f"{where}: non-finite {name}"
            if not kernel_path:
                # dV = quant(P)^T dO^ with one-hot P: a sum of dO^ rows (float32 output)
                np.testing.assert_allclose(dv[~touched], dv_x[~touched], rtol=1e-5, atol=1e-5, err_msg=where)


@pytest.mark.parametrize("p_scale,t", CASES)
def test_reference_large_logits(p_scale, t):
    _check("xla", p_scale, t, with_grad=p_scale == "const")


@pytest.mark.parametrize("p_scale,t", CASES)
def test_emulated_large_logits(p_scale, t):
    _check("emulated", p_scale, t, with_grad=p_scale == "const")


@pytest.mark.gpu
@pytest.mark.parametrize("p_scale,t", CASES)
def test_kernel_large_logits(p_scale, t):
    ok, why = library.kernels_runnable(afwd.ARCHS)
    if not ok:
        pytest.skip(why)
    _check("cuda", p_scale, t, with_grad=p_scale == "const")
