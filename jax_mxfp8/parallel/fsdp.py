"""FSDP with pre-all-gather shard quantization: gather MXFP8 weights (1 byte + 1/32 byte per element)
instead of BF16/FP32 ones.

Each device quantizes its own shard of the weight along the GEMM's contracting axis (block boundaries
coincide with shard boundaries when every shard holds a multiple of 32 rows), then the FP8 bytes and the
E8M0 scales are all-gathered. The result is bit-identical to quantizing the whole weight on one device,
because row blocks never span two shards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_mxfp8.formats import MXArray, quantize


def gather_quantized(
    w: jax.Array,
    sharding: jax.sharding.Sharding,
    *,
    axis: int = 0,
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
) -> MXArray:
    """Quantizes `w` shard by shard and all-gathers the MXArray to `sharding` (under jax.jit).

    Args:
      w: the (FSDP-sharded) weight, e.g. (D_in, D_out) sharded along D_in; any float dtype.
      sharding: where the quantized weight should live, usually replicated over the FSDP mesh axis
        (e.g. NamedSharding(mesh, P(None, "tp")) for a tensor-parallel column split).
      axis: the axis the GEMM contracts over (blocks of 32 run along it).
      dtype, scale_rounding: MX element format and scale rule.

    Returns:
      An MXArray of w's shape with `sharding`; pass it as mx_dot_general(..., rhs_quantized=...) together
      with the sharded high-precision `w` (which still receives the gradient).
    """
    q = quantize(w, axis=axis, dtype=dtype, scale_rounding=scale_rounding)
    data = lax.with_sharding_constraint(pack_bytes(q.data), sharding)
    scale = lax.with_sharding_constraint(q.scale, sharding)
    return MXArray(data=unpack_bytes(data, q.data.dtype), scale=scale, axes=q.axes, block=q.block)


def pack_bytes(data: jax.Array) -> jax.Array:
    """FP8 (..., n) -> uint32 (..., n / 4) holding the same bytes, when n % 4 == 0.

    XLA's CPU backend widens 8-bit floating all-gathers to FP16 (doubling the bytes on the wire, even
    when the FP8 is bitcast to uint8 first: the simplifier folds the casts back). Four bytes in a uint32
    are moved as they are on every backend.
    """
    if data.shape[-1] % 4:
        return data
    as_u8 = lax.bitcast_convert_type(data, jnp.uint8)
    return lax.bitcast_convert_type(as_u8.reshape(*data.shape[:-1], data.shape[-1] // 4, 4), jnp.uint32)


def unpack_bytes(packed: jax.Array, dtype) -> jax.Array:
    if packed.dtype != jnp.uint32:
        return packed
    as_u8 = lax.bitcast_convert_type(packed, jnp.uint8)  # (..., n / 4, 4)
    return lax.bitcast_convert_type(as_u8.reshape(*packed.shape[:-1], packed.shape[-1] * 4), dtype)
