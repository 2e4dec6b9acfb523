"""Helpers of the Hopper attention forward kernel's tests (CPU emulation and GPU): inputs and the kernel's
arithmetic on the caller's layout.

`emulated` runs the producer pass (`attention_operands.prepare`) and the kernel's XLA emulation
(`attention_emulation.emulate_fwd`) on BTNH inputs; the tests compare it with the XLA reference, float64
(attention_oracle.py) and, on the GPU, the kernel. Nothing here computes an expected value.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jax_mxfp8 as mx
from jax_mxfp8.primitives import attention_emulation as emulation
from jax_mxfp8.primitives import attention_operands as operands


def square_mx(x_hm, scale_rounding="up"):
    """x (B, N, L, H) head-major -> its 32x32 square-block MXArray over (L, H)."""
    return mx.quantize(x_hm, axis=(-2, -1), block="square", scale_rounding=scale_rounding)


def _zero_past(x, lens, axis):
    if lens is None:
        return x
    pos = jnp.arange(x.shape[axis])
    shape = [1] * x.ndim
    shape[0], shape[axis] = x.shape[0], x.shape[axis]
    return jnp.where((pos[None, :] < lens[:, None]).reshape(shape), x, 0)


def emulated(q, k, v, *, causal, q_len=None, kv_len=None, scale=None, config=None):
    """q (B, T, N, H), k, v (B, S, K, H) bfloat16 -> emulated kernel (o BTNH float32, lse (B, N, T)).

    config: AttentionConfig (default AttentionConfig()); its scale_rounding (operands and block P) and
    p_scale are used."""
    config = config or mx.AttentionConfig()
    h = q.shape[-1]
    scale = h**-0.5 if scale is None else scale
    qh = _zero_past(q.transpose(0, 2, 1, 3), q_len, 2)
    kh = _zero_past(k.transpose(0, 2, 1, 3), kv_len, 2)
    vh = _zero_past(v.transpose(0, 2, 1, 3), kv_len, 2)
    mxs = (square_mx(x, config.scale_rounding) for x in (qh, kh, vh))
    ops = operands.prepare(*mxs, scale=scale, q_len=q_len, kv_len=kv_len)
    o, lse = emulation.emulate_fwd(
        ops, causal=causal, t=q.shape[1], p_scale=config.p_scale, p_rounding=config.scale_rounding
    )
    return o.transpose(0, 2, 1, 3), lse


def kernel_inputs(rng, b, t, s, n, n_kv, h, outlier_channels=False):
    """q (B, T, N, H), k, v (B, S, K, H) bfloat16, N(0, 1); outlier_channels: every 32nd head-dim channel
    that many times larger (blocks along H get different scales)."""
    q = rng.standard_normal((b, t, n, h)).astype(np.float32)
    k = rng.standard_normal((b, s, n_kv, h)).astype(np.float32)
    v = rng.standard_normal((b, s, n_kv, h)).astype(np.float32)
    if outlier_channels:
        for x in (q, k, v):
            x[..., ::32] *= float(outlier_channels)
    return tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))


def case_id(case: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in case.items())


def case_inputs(case: dict, rng):
    """(q, k, v, shape dict, causal, lengths) for one case dict (b, t, s, n, n_kv, h, causal[, lengths,
    outlier_channels])."""
    shape = {k: case[k] for k in ("b", "t", "s", "n", "n_kv", "h")}
    q, k, v = kernel_inputs(rng, **shape, outlier_channels=case.get("outlier_channels", False))
    return q, k, v, shape, case["causal"], case.get("lengths", False)


def sink_inputs(rng, s: int):
    """One query tile attending to a long sequence whose key 0 is an 'attention sink': every query's logit
    for it is 13 nats above the others (channel 0: q = 8, k_0 = 13, both exact in E4M3 at their block
    scales; the other keys have k = 0 there and the other channels give ~0.3 nats of noise). The other keys'
    P~ ~ 2^-18.8 is below half the constant scale's smallest subnormal (2^-18), yet they hold ~7% of the
    mass, and V has a nonzero mean, so dropping them moves O."""
    t, h = 128, 64
    q = rng.standard_normal((1, t, 1, h)).astype(np.float32) * 0.3
    k = rng.standard_normal((1, s, 1, h)).astype(np.float32)
    v = (rng.standard_normal((1, s, 1, h)) + 2.0).astype(np.float32)
    q[..., 0] = 8.0
    k[..., 0] = 0.0
    k[:, 0, :, 0] = 13.0
    return tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
