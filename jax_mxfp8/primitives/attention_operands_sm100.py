"""FFI-backed operand producer of the Blackwell attention kernels (layer 5): square-block MX quantize of one
operand with the kernels' blocked scale bytes, in one pass (kernels/sm100/attention_operands.py).

  producer_unsupported(x_shape, dtype, scale_rounding) -> str | None
  attention_operands_sm100(x, *, scale_rounding="up", path, out=None) -> (MXArray, Sm100Operand)
  emulate_attention_operands(x, scale_rounding) -> (data, sq, hd, seq)   the kernel's byte placement in XLA

x (B, L, heads, H) bfloat16 / float32, L a multiple of 32, H 64 or 128. Returns the square-block MXArray
(B, L, heads, H) (axes (-3, -1); the residual the attention ops keep) and the Sm100Operand with the same data
and both orientations' scale bytes ("hd" (B, heads, ceil(L/128), 1, 512), "seq" (B, heads, 1, ceil(L/128), 512)),
equal bit for bit to attention_sm100_operands.sm100_operand(quantize_square(x)) (the XLA formulation; the
emulation here places each byte by the kernel's own index arithmetic, tests/test_attention_sm100_operands_producer.py
checks the two agree). Handler csrc/attention_operands_sm100.cc. NOT RUN ON HARDWARE by this project.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import quantize
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.attention_sm100_operands import Sm100Operand
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule

FAMILY = registry.AttentionOperandsSm100Config.op
ARCHS = registry.AttentionOperandsSm100Config.archs
CHUNK = 128


def find_variant(dtype, head_dim: int, scale_rounding: str) -> registry.AttentionOperandsSm100Config | None:
    try:
        in_dtype = np.dtype(dtype).name
    except TypeError:
        return None
    if in_dtype not in registry.IN_DTYPES:
        return None
    return registry.find(
        registry.AttentionOperandsSm100Config, in_dtype=in_dtype, head_dim=head_dim, scale_rounding=scale_rounding
    )


def producer_unsupported(x_shape, dtype, scale_rounding: str) -> str | None:
    """Why the producer kernel does not take x (None = it does)."""
    if len(x_shape) != 4:
        return f"x must be (B, L, heads, H), got {tuple(x_shape)}"
    _, length, _, h = x_shape
    if length % 32:
        return f"L = {length} must be a multiple of 32 (square blocks)"
    if find_variant(dtype, h, scale_rounding) is None:
        return f"no attention operand producer for {np.dtype(dtype).name} x with H = {h}, {scale_rounding!r} rounding"
    return None


def _chunks(length: int) -> int:
    return -(-length // CHUNK)


def _gather(sq: jax.Array, blocks: jax.Array, kblocks: jax.Array, ok: jax.Array) -> jax.Array:
    """(B, heads, lc, 512) bytes sq[b, blocks[c, p], head, kblocks[c, p]] (sq (B, L/32, heads, H/32)), 0 where
    not ok. (Index arrays are traced iotas, not constants: the body runs inside custom_partitioning.)"""
    t = jnp.transpose(sq, (0, 2, 1, 3))  # (B, heads, L/32, H/32)
    nb, kb = t.shape[2], t.shape[3]
    flat = t.reshape(t.shape[0], t.shape[1], nb * kb)
    idx = jnp.where(ok, jnp.clip(blocks, 0, nb - 1) * kb + jnp.clip(kblocks, 0, kb - 1), 0)
    return jnp.where(ok, flat[:, :, idx], jnp.zeros((), jnp.uint8))


def emulate_attention_operands(x: jax.Array, scale_rounding: str = "up") -> tuple[jax.Array, ...]:
    """(data, sq, hd, seq) as the kernel writes them: formats.quantize's square blocks, then every byte of a
    512-byte chunk c from its position p. "hd": p // 16 is the row within its 32 (the byte is the same for all
    32), p % 16 // 4 the row's 32-row group w, p % 4 the K block j: sq[4 c + w, j]. "seq": p // 16 + 32 (p % 16
    // 4) is the channel, p % 4 the position block i % 4: sq[4 c + p % 4, channel // 32]. Zero where the block is
    past L or the K block / channel past H."""
    _, length, _, h = x.shape
    mx = quantize(x, axis=(-3, -1), block="square", scale_rounding=scale_rounding)
    nb, kb, lc = length // 32, h // 32, _chunks(length)
    p = jnp.arange(512, dtype=jnp.int32)[None, :]
    c = jnp.arange(lc, dtype=jnp.int32)[:, None]
    hd_blocks, hd_k = c * 4 + (p % 16) // 4, jnp.broadcast_to(p % 4, (lc, 512))
    hd = _gather(mx.scale, hd_blocks, hd_k, (hd_blocks < nb) & (hd_k < kb))
    channel = jnp.broadcast_to(p // 16 + 32 * ((p % 16) // 4), (lc, 512))
    seq_blocks = c * 4 + p % 4
    seq = _gather(mx.scale, seq_blocks, channel // 32, (seq_blocks < nb) & (channel < h))
    return mx.data, mx.scale, hd[:, :, :, None, :], seq[:, :, None, :, :]


@dataclasses.dataclass(frozen=True)
class AttentionOperandsCall:
    variant: registry.AttentionOperandsSm100Config


def _outputs(call: AttentionOperandsCall, x):
    b, length, heads, h = x.shape
    lc = _chunks(length)
    return (
        jax.ShapeDtypeStruct(x.shape, jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct((b, length // 32, heads, h // 32), jnp.uint8),
        jax.ShapeDtypeStruct((b, heads, lc, 1, 512), jnp.uint8),
        jax.ShapeDtypeStruct((b, heads, 1, lc, 512), jnp.uint8),
    )


def _sharding(call: AttentionOperandsCall) -> ShardingRule:
    """Batch and heads shard (every block lies in one (batch, head)); the sequence, head_dim and bytes do not."""
    return ShardingRule(
        operands=("b l n h",),
        results=("b l n h", "b u n k", "b n c e p", "b n e c p"),
        replicated=("l", "h", "u", "k", "c", "e", "p"),
    )


ATTENTION_OPERANDS_SM100 = FfiOp(
    target="jax_mxfp8_attention_operands_sm100",
    outputs=_outputs,
    emulation=lambda call, x: emulate_attention_operands(x, call.variant.scale_rounding),
    sharding=_sharding,
    batch_dims=(0,),
    result_batch_dims=(0, 0, 0, 0),
)
"""(x) -> (data, sq, hd, seq); shapes in csrc/attention_operands_sm100.cc."""


def attention_operands_sm100(
    x: jax.Array, *, scale_rounding: str = "up", path: str = "cuda", out: tuple | None = None
) -> tuple[MXArray, Sm100Operand]:
    """The producer on x (B, L, heads, H): (square-block MXArray (axes (-3, -1)), Sm100Operand with both
    orientations' scales). path "cuda" (the kernel) or "emulated"; out: (data, sq, hd, seq) buffers the kernel
    writes into (aliased; the NaN-poisoning test hook). ValueError naming x when no variant takes it."""
    why = producer_unsupported(x.shape, x.dtype, scale_rounding)
    if why:
        raise ValueError(f"attention_operands_sm100: {why}")
    call = AttentionOperandsCall(find_variant(x.dtype, x.shape[-1], scale_rounding))
    if path == "cuda":
        library.load_library()
    if out is not None:
        data, sq, hd, seq = ATTENTION_OPERANDS_SM100.ffi_into(call, (x,), tuple(out))
    else:
        data, sq, hd, seq = ATTENTION_OPERANDS_SM100.call(call, path, x)
    return MXArray(data, sq, (-3, -1), "square"), Sm100Operand(data, sf_hd=hd, sf_seq=seq)
