"""The attention producer's realign kernel (kernels/sm90/attention_realign.py) on the GPU.

Against its XLA emulation (primitives.attention_fwd._realign_emulated, itself checked against `prepare` on
CPU by test_attention_kernel_path_cpu.py): every byte equal, on random bytes (every E4M3 pattern, NaN
included: both sides must give NaN there) and random shifts (including the flushing ones below -126), for
lengths that are and are not multiples of 128 (the zero padding rows are compared too). Then the whole
producer on the GPU against `prepare` in XLA on the head-major transposes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.primitives import attention_operands as operands
from jax_mxfp8.primitives import attention_realign as realign_call
from tests.attention.attention_testutil import fresh_rng

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90_attention_fwd")]


def _assert_bytes_equal(got, want):
    """Bytes equal except where both are E4M3 NaN (0x7F / 0xFF: the sign of a NaN is not part of the contract)."""
    g, w = np.asarray(got.view(jnp.uint8)), np.asarray(want.view(jnp.uint8))
    nan_g, nan_w = (g & 0x7F) == 0x7F, (w & 0x7F) == 0x7F
    np.testing.assert_array_equal(nan_g, nan_w)
    np.testing.assert_array_equal(np.where(nan_g, 0, g), np.where(nan_w, 0, w))


@pytest.mark.parametrize("operand", ["rows", "v"])
@pytest.mark.parametrize("b,length,n,h", [(2, 256, 3, 128), (1, 160, 2, 64), (3, 96, 1, 128), (1, 4096, 2, 64)])
def test_realign_kernel_matches_emulation(operand, b, length, n, h):
    rng = fresh_rng()
    data = jnp.asarray(rng.integers(0, 256, size=(b, length, n, h), dtype=np.uint8)).view(jnp.float8_e4m3fn)
    shift = rng.integers(-12, 1, size=(b, length // 32, n, h // 32))
    shift[rng.random(shift.shape) < 0.1] = -127  # flushed blocks
    shift[rng.random(shift.shape) < 0.05] = -126  # the smallest normal factor
    shift = jnp.asarray(shift, jnp.int8)
    got = jax.jit(lambda d, s: realign_call.realign(d, s, operand, "cuda"))(data, shift)
    want = jax.jit(lambda d, s: realign_call.realign(d, s, operand, "emulated"))(data, shift)
    assert got.shape == want.shape and got.dtype == want.dtype
    _assert_bytes_equal(got, want)


def test_producer_on_gpu_matches_prepare():
    """prepare_sequence_major (realign kernel) == prepare (XLA) on the head-major transposes, every field."""
    rng = fresh_rng()
    b, t, s, n, n_kv, h = 2, 320, 200 // 32 * 32, 4, 2, 128

    def mxa(shape):
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, size=(*shape[:-1], 1)))
        x[..., ::32] *= 40.0  # blocks along H with different scales: nonzero shifts
        return mx.quantize(jnp.asarray(x, jnp.bfloat16), axis=(-3, -1), block="square")

    q, k, v = mxa((b, t, n, h)), mxa((b, s, n_kv, h)), mxa((b, s, n_kv, h))
    lens = (jnp.asarray([t, 100], jnp.int32), jnp.asarray([s, 33], jnp.int32))

    def zero_past(a, length):
        pos = jnp.arange(a.data.shape[1])
        data = jnp.where((pos[None, :] < length[:, None])[:, :, None, None], a.data, jnp.zeros((), a.data.dtype))
        blk = jnp.arange(a.scale.shape[1]) * 32
        scale = jnp.where((blk[None, :] < length[:, None])[:, :, None, None], a.scale, 0)
        return MXArray(data, scale, a.axes, a.block)

    q, k, v = zero_past(q, lens[0]), zero_past(k, lens[1]), zero_past(v, lens[1])
    got = jax.jit(lambda q, k, v: operands.prepare_sequence_major(q, k, v, scale=0.088, q_len=lens[0], kv_len=lens[1]))(
        q, k, v
    )

    def hm(a):
        return MXArray(a.data.transpose(0, 2, 1, 3), a.scale.transpose(0, 2, 1, 3), (-2, -1), "square")

    want = jax.jit(lambda q, k, v: operands.prepare(hm(q), hm(k), hm(v), scale=0.088, q_len=lens[0], kv_len=lens[1]))(
        q, k, v
    )
    for field in ("q", "k", "vt"):
        _assert_bytes_equal(getattr(got, field), getattr(want, field))
    for field in ("qs", "ks", "vs", "vi", "lens"):
        np.testing.assert_array_equal(np.asarray(getattr(got, field)), np.asarray(getattr(want, field)), field)
