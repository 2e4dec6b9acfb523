"""The attention producer's re-encode + transpose of FP8 data (layer 5): the REALIGN FFI op.

  realign(data, shift, operand, path) -> (B, N, Lp, H) ("rows": Q, K) or (B, N, H, Lp) ("v": V'^T)

data: (B, L, N, H) float8_e4m3fn square-block MX elements in the caller's sequence-major layout (L % 32 == 0);
shift: (B, L/32, N, H/32) int8 per-block exponent shifts (<= 0; -127 flushes the block, 0 keeps NaN
blocks' elements). Each element becomes RNE_E4M3(x * 2^shift), the rows are padded with zeros to Lp = L
rounded up to 128, and the result is written head-major ("rows") or transposed with the keys of every 32
in pv_permutation order ("v"), one read and one write per byte (kernels/sm90/attention_realign.py,
csrc/attention_realign.cc). Batch and heads shard; the sequence and head_dim do not. vmap folds into the
batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives.attention_layout import TILE_N, permute_keys_transposed, realign_elements, round_up
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule


def _out_shape(variant: registry.AttentionRealignConfig, data) -> tuple[int, ...]:
    b, length, n, h = data.shape
    lp = round_up(length, TILE_N)
    return (b, n, lp, h) if variant.operand == "rows" else (b, n, h, lp)


def _outputs(variant: registry.AttentionRealignConfig, data, shift):
    return (jax.ShapeDtypeStruct(_out_shape(variant, data), data.dtype),)


def _emulation(variant: registry.AttentionRealignConfig, data, shift):
    """The realign kernel's contract in XLA: the same block realignment, transposes and padding."""
    b, length, n, h = data.shape
    sh = jnp.minimum(shift.astype(jnp.int32), 0)
    blocks = data.reshape(b, length // 32, 32, n, h // 32, 32)
    out = realign_elements(blocks, sh[:, :, None, :, :, None]).reshape(data.shape).transpose(0, 2, 1, 3)
    out = jnp.pad(out, [(0, 0), (0, 0), (0, round_up(length, TILE_N) - length), (0, 0)])
    return out if variant.operand == "rows" else permute_keys_transposed(out)


def _cuda(decl: FfiOp, variant: registry.AttentionRealignConfig, data, shift):
    """The handler takes 2-D views: data (B, L*N*H), shift (B, L/32*N*H/32) -> out (B*N, Lp*H)."""
    b, length, n, h = data.shape
    shape = _out_shape(variant, data)
    flat = jax.ShapeDtypeStruct((b * n, shape[2] * shape[3]), data.dtype)
    (out,) = decl.ffi(variant, data.reshape(b, length * n * h), shift.reshape(b, -1), outputs=(flat,))
    return out.reshape(shape)


REALIGN = FfiOp(
    target="jax_mxfp8_attention_realign",
    outputs=_outputs,
    emulation=_emulation,
    sharding=lambda variant: ShardingRule(
        operands=("b l n h", "b m n c"), results=("b n p q",), replicated=("l", "h", "m", "c", "p", "q")
    ),
    batch_dims=(0, 0),
    result_batch_dims=(0,),
    cuda=_cuda,
)


def realign(data: jax.Array, shift: jax.Array, operand: str, path: str = "cuda") -> jax.Array:
    """Runs REALIGN ("cuda": the kernel; "emulated": its XLA body) for operand "rows" or "v" (module docstring)."""
    variant = registry.find(registry.AttentionRealignConfig, head_dim=data.shape[-1], operand=operand)
    if variant is None:
        raise ValueError(f"no realign kernel for head_dim={data.shape[-1]}, operand={operand!r}")
    return REALIGN.call(variant, path, data, shift)
