"""KV tiling shared by the attention forward and backward references.

Both passes walk the key/value sequence in tiles of `kv_tile` columns with `lax.scan`, holding every
query row at once, so the largest temporary is (B, K, G, T, kv_tile): memory grows linearly in the
sequence length and the T x S matrix never exists. The masked logits of a tile are computed by one
function (`tile_logits`) so that the backward recomputes exactly the forward's S.

Internal layout ("head-major"): queries (B, K, G, T, H) with N = K * G query heads grouped under their
KV head, keys/values (B, K, S, H), bias/mask 5-D (B|1, K|1, G|1, T|1, S|1).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def gemm_dtype():
    """Operand dtype of the emulated MX GEMMs.

    Every GEMM operand here is an MX-dequantized value (E4M3/E5M2 element times a power of two) and so is
    exactly representable in bfloat16; products are accumulated in float32 either way. Accelerators get
    bfloat16 operands (exact, fastest tensor-core path); XLA's CPU dot is faster in float32.
    """
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def mm(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """einsum of two MX-valued operands with float32 accumulation (exact products, see gemm_dtype)."""
    dt = gemm_dtype()
    # HIGHEST keeps float32 operands out of reduced-precision passes; bfloat16 operands need nothing.
    precision = lax.Precision.HIGHEST if dt == jnp.float32 else None
    return jnp.einsum(spec, a.astype(dt), b.astype(dt), preferred_element_type=jnp.float32, precision=precision)


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def pad_axis(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    """Pads `axis` of x at the end up to `size` with `value`."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def to_tiles(x: jax.Array, axis: int, tile: int) -> jax.Array:
    """(..., n * tile, ...) -> (n, ..., tile, ...): the tiles of `axis` as a leading scan axis."""
    axis = axis % x.ndim
    n = x.shape[axis] // tile
    x = x.reshape(x.shape[:axis] + (n, tile) + x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def from_tiles(y: jax.Array, axis: int) -> jax.Array:
    """Inverse of to_tiles: (n, ..., tile, ...) -> (..., n * tile, ...), `axis` counted without the n."""
    axis = axis % (y.ndim - 1)
    y = jnp.moveaxis(y, 0, axis)
    return y.reshape(y.shape[:axis] + (y.shape[axis] * y.shape[axis + 1],) + y.shape[axis + 2 :])


class Masking(NamedTuple):
    """Everything that decides which logits are valid, plus the additive bias.

    Attributes:
      is_causal: static; query row t sees key column s <= t (top-left aligned, as jax.nn).
      s_real: static; key columns >= s_real are tile padding.
      q_len, kv_len: optional (B,) int32; rows >= q_len[b] and columns >= kv_len[b] are padding.
      mask: optional 5-D bool (True = attend), last axis 1 or the padded S.
      bias: optional 5-D float added to the logits, last axis 1 or the padded S.
    """

    is_causal: bool
    s_real: int
    q_len: jax.Array | None
    kv_len: jax.Array | None
    mask: jax.Array | None
    bias: jax.Array | None


def tiled(x: jax.Array | None, kv_tile: int) -> jax.Array | None:
    """Scan input for a 5-D mask/bias: tiles of its last axis, or None when it does not vary along S."""
    if x is None or x.shape[-1] == 1:
        return None
    return to_tiles(x, -1, kv_tile)


_NEG_MAX = float(-np.finfo(np.float32).max)


def rounded(x: jax.Array) -> jax.Array:
    """x, rounded to float32 once for every consumer: max(x, -float32 max), which is x for any x > -inf.

    XLA fuses the logits' scale multiply (and bias add) into each of its consumers and LLVM may contract
    it with the consumer's subtraction into a fused multiply-add there (seen on XLA:CPU): exp(S - m) then
    sees S unrounded while m is the max of the rounded S, so for |S| beyond ~2^24 P~ overshoots 1 by up to
    e^(ulp(S) / 2) or vanishes (a row of zeros with LSE -inf). No multiply-add contracts through a max, so
    the running max and the exponent read the same float32 S: the max element gives exp(0) = 1 exactly and
    every other P~ is <= 1 (float32 subtraction is monotone). (An overflowed -inf logit becomes
    -float32 max, which exponentiates to 0 all the same; XLA removes optimization barriers and no-op
    reduce_precisions before fusion on CPU, so neither would do.)
    """
    return jnp.maximum(x, jnp.float32(_NEG_MAX))


def tile_logits(
    q: jax.Array,
    k_t: jax.Array,
    j: jax.Array,
    masking: Masking,
    mask_t: jax.Array | None,
    bias_t: jax.Array | None,
    *,
    scale: float,
) -> jax.Array:
    """S = scale * Q^ K^T (+ bias) in float32 for KV tile j, -inf where masked (a bias entry of -inf counts
    as masked). Shape (B, K, G, T, kv_tile).

    Args:
      q: (B, K, G, T, H) dequantized queries. k_t: (B, K, kv_tile, H) dequantized keys of tile j.
      j: tile index (int32 scalar). mask_t, bias_t: tile j of masking.mask / masking.bias when they vary
        along S (see `tiled`), else None (then masking.mask / masking.bias are used whole).
    """
    t_len, kt = q.shape[-2], k_t.shape[-2]
    s = rounded(mm("bkgth,bksh->bkgts", q, k_t) * jnp.float32(scale))
    bias = bias_t if bias_t is not None else masking.bias
    valid = None

    def both(a, b):
        return b if a is None else a & b

    if bias is not None:
        bias = bias.astype(jnp.float32)
        s = rounded(s + bias)
        # A bias of -inf is a mask entry: `rounded` would turn it into -float32 max, a finite logit, and a row
        # of them into a uniform softmax (the mean of V) where the contract gives a fully masked row's 0.
        valid = bias != -jnp.inf
    rows = jnp.arange(t_len, dtype=jnp.int32)[:, None]
    cols = j * kt + jnp.arange(kt, dtype=jnp.int32)[None, :]

    static = None  # the (T, kv_tile) masks, before the batch and head axes
    if masking.s_real % kt:
        static = both(static, cols < masking.s_real)
    if masking.is_causal:
        static = both(static, rows >= cols)
    if static is not None:
        valid = both(valid, static[None, None, None])
    if masking.q_len is not None:
        valid = both(valid, rows[None, None, None] < masking.q_len[:, None, None, None, None])
    if masking.kv_len is not None:
        valid = both(valid, cols[None, None, None] < masking.kv_len[:, None, None, None, None])
    mask = mask_t if mask_t is not None else masking.mask
    if mask is not None:
        valid = both(valid, mask)
    if valid is None:
        return s
    return jnp.where(valid, s, -jnp.inf)


def pad_masking(masking: Masking, s_pad: int) -> Masking:
    """Pads a mask/bias that varies along S to the tiled length (the padded columns are masked anyway)."""

    def pad(x, value):
        return x if x is None or x.shape[-1] == 1 else pad_axis(x, -1, s_pad, value)

    return masking._replace(mask=pad(masking.mask, False), bias=pad(masking.bias, 0))
