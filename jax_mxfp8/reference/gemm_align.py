"""align128: MX operands re-encoded to one exponent per 128 K for the Hopper MX GEMM (XLA reference).

The contract (docs/numerics.md) quantizes a GEMM operand along its contracting axis K in blocks of 32:
FP8 elements q (E4M3 or E5M2) and one E8M0 byte e_b per block, value q * 2^(e_b - 127). Hopper's FP8
wgmma has no per-32 scales, so the kernel (its operands: docs/interfaces.md) takes the ALIGNED form:
for every run of 4 consecutive K blocks (128 K; the last run padded with zero blocks up to
Kp = ceil(K / 128) * 128)

    E      = max of the 4 e_b over the blocks that exist (padding blocks do not count; e_b >= 0, so
             padding with e_b = 0 changes nothing),
    data'  = RNE_satfinite(float(q) * 2^(e_b - E))      (in the element format; shift e_b - E <= 0),
    scale  = float32 2^(E - 127)   (2^-127 is a float32 subnormal, bits 0x00400000, for E = 0;
                                    NaN, bits 0x7FC00000, when E = 255: any NaN block makes its run NaN),
    padding elements (K <= k < Kp) are +0.

Exactness. q * 2^(e_b - E) keeps q's significand; it is an element of the format unless it lands below
the format's smallest normal 2^emin (E4M3 2^-6, E5M2 2^-14), where the spacing is 2^(emin - mantissa_bits)
(E4M3 2^-9, E5M2 2^-16) and RNE rounds it (possibly to zero). So dequant(aligned) equals dequant(MX)
exactly except for elements pushed into subnormals, whose error is at most half that spacing at the
aligned scale:

    |dequant(aligned) - dequant(MX)| <= 2^(E - 127) * 2^(emin - mantissa_bits - 1)
                                      = 2^(E - 127 - 10) (E4M3),   2^(E - 127 - 17) (E5M2).

Relative to the run's amax A (the block with e_b = E has A / 2^(E - 127) in (max/2, max] for
scale_rounding "up", in [2^emax, 2^(emax + 1)) for "floor"): at most 2^-10 / 224 * A ~ 4.4e-6 A (E4M3, "up"),
2^-18 A (E4M3, "floor"), 2^-17 / 28672 * A ~ 2.7e-10 A (E5M2, "up"). Only blocks at least 2^(mantissa
range) below the run's largest block lose anything; tests/gemm/test_gemm_align.py measures it on N(0,1),
log-normal-row and outlier-channel data.

Arithmetic here is exact float32: q is decoded from its bits (formats.decode), 2^shift is a normal power of
two (shifts below -64 are clamped to -64: |q| < 2^16, so the product still rounds to a signed zero in both
formats) and the products are normal float32 numbers, so XLA CPU's flush-to-zero never matters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.formats.decode import decode_elements
from jax_mxfp8.formats.elements import BLOCK_SIZE, SCALE_NAN, element_format
from jax_mxfp8.formats.scales import pow2

RUN = 128
"""K elements per aligned run (4 MX blocks): the GEMM promotes its FP32 accumulator every RUN K."""
BLOCKS_PER_RUN = RUN // BLOCK_SIZE
SHIFT_MIN = -64
"""Shifts below this are clamped: q * 2^-64 rounds to a signed zero in E4M3 and E5M2 alike."""
F32_NAN_BITS = 0x7FC00000
F32_TINY_BITS = 0x00400000  # 2^-127


def padded(k: int) -> int:
    """Kp: k rounded up to a multiple of RUN (128)."""
    return -(-k // RUN) * RUN


def scale_f32(e: jax.Array) -> jax.Array:
    """float32 2^(e - 127) for E8M0 exponents e (int32): subnormal 2^-127 for e = 0, NaN for e = 255."""
    e = e.astype(jnp.uint32)
    bits = jnp.where(e == SCALE_NAN, jnp.uint32(F32_NAN_BITS), jnp.where(e == 0, jnp.uint32(F32_TINY_BITS), e << 23))
    return lax.bitcast_convert_type(bits, jnp.float32)


def align128(data: jax.Array, scale_e8m0: jax.Array, *, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """Re-encodes MX blocks of 32 along K to one exponent per 128 K, in the K-major layout (module docstring).

    Args:
      data: (..., R, K) float8_e4m3fn / float8_e5m2 with blocks along the last axis (axis=-1), or
        (..., K, R) with blocks along the second-to-last (axis=-2). K a multiple of 32.
      scale_e8m0: uint8 E8M0 bytes, (..., R, K/32) for axis=-1, (..., K/32, R) for axis=-2.
      axis: -1 or -2, the contracting (blocked) axis of `data`.

    Returns:
      (data', scale): data' (..., R, Kp) of data's dtype, K-major (for axis=-2 this is the transpose of
      the input layout), padded with zeros from K to Kp = ceil(K/128)*128; scale (..., Kp/128, R) float32.

    Raises:
      ValueError: naming the argument for a non-FP8 `data`, a non-uint8 `scale_e8m0`, an `axis` other than
        -1 / -2, or shapes that do not match.
    """
    data, scale = jnp.asarray(data), jnp.asarray(scale_e8m0)
    element_format(data.dtype)  # ValueError naming dtype for non-MX elements
    if data.ndim < 2:
        raise ValueError(f"data must have rank >= 2, got shape {data.shape}")
    if axis not in (-1, -2, data.ndim - 1, data.ndim - 2):
        raise ValueError(f"axis={axis!r} must be -1 or -2 (the contracting axis of data)")
    if scale.dtype != jnp.uint8:
        raise ValueError(f"scale_e8m0 must be uint8 E8M0 bytes, got {scale.dtype}")
    if axis in (-2, data.ndim - 2):
        data, scale = jnp.swapaxes(data, -1, -2), jnp.swapaxes(scale, -1, -2)
    *lead, r, k = data.shape
    if k % BLOCK_SIZE or k == 0:
        raise ValueError(f"data's contracting axis has size {k}, not a positive multiple of {BLOCK_SIZE}")
    nb, kp = k // BLOCK_SIZE, padded(k)
    if tuple(scale.shape) != (*lead, r, nb):
        want = (*lead, r, nb) if axis in (-1, data.ndim - 1) else (*lead, nb, r)
        raise ValueError(f"scale_e8m0 has shape {tuple(scale.shape)}; data of this shape needs {want}")
    b = scale.astype(jnp.int32)
    runs = jnp.pad(b, [(0, 0)] * (b.ndim - 1) + [(0, kp // BLOCK_SIZE - nb)])
    e = jnp.max(runs.reshape(*lead, r, kp // RUN, BLOCKS_PER_RUN), axis=-1)  # (..., R, Kp/128)
    shift = b - jnp.repeat(e, BLOCKS_PER_RUN, axis=-1)[..., :nb]
    q = decode_elements(data).reshape(*lead, r, nb, BLOCK_SIZE)
    y = q * pow2(jnp.maximum(shift, SHIFT_MIN))[..., None]
    out = y.astype(data.dtype).reshape(*lead, r, k)
    out = jnp.pad(out, [(0, 0)] * (out.ndim - 1) + [(0, kp - k)])
    return out, jnp.swapaxes(scale_f32(e), -1, -2)


def error_bound(scale: jax.Array, dtype) -> np.ndarray:
    """The per-run bound on |dequant(aligned) - dequant(MX)| (module docstring): half the subnormal spacing
    at the aligned scale, 2^(emin - mantissa_bits - 1) * scale (same shape as `scale`)."""
    fmt = element_format(dtype)
    return np.asarray(scale, np.float64) * 2.0 ** (fmt.emin - fmt.mantissa_bits - 1)
