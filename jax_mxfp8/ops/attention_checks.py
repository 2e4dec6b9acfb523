"""Argument checks of the attention ops (dot_product_attention, varlen_attention, broadcast_query_attention,
ring_attention): each returns the checked value (converted where said) or raises ValueError naming the
argument.

Dense operands are BTNH query (B, T, N, H) and BSKH key / value (B, S, K, H); packed (jagged) ones are
(T_total, heads, H) with (B + 1,) cu_seqlens offsets.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray, check_consistent
from jax_mxfp8.formats.quantize import check_float32_range
from jax_mxfp8.ops.checks import check_length_values, concrete_value
from jax_mxfp8.primitives import implementation as impl

MAX_HEAD_DIM = 256
ALL_MX_OUTPUT_DTYPE = jnp.bfloat16
"""Output dtype when query, key and value are all MXArrays (there is no input dtype to follow)."""


def check_implementation(implementation) -> None:
    """ValueError unless `implementation` is one of None, "xla", "emulated", "cuda"."""
    impl.check(implementation)


def check_config(config: AttentionConfig | None, is_causal) -> AttentionConfig:
    """The config (default AttentionConfig()); ValueError unless config is one and is_causal a bool."""
    if config is None:
        config = AttentionConfig()
    if not isinstance(config, AttentionConfig):
        raise ValueError(f"config must be an AttentionConfig or None; got {type(config).__name__}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise ValueError(f"is_causal={is_causal!r} must be a bool")
    return config


def check_scale(scale, head_dim: int) -> float:
    """The softmax scale as a Python float (default 1 / sqrt(head_dim)); ValueError if traced or not finite."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        value = float(scale)
    except (TypeError, ValueError, jax.errors.ConcretizationTypeError) as e:
        raise ValueError(f"scale={scale!r} must be a concrete Python number (it is static)") from e
    if not math.isfinite(value):
        raise ValueError(f"scale={scale!r} must be finite")
    return value


def check_head_dim(h: int, name: str = "query") -> None:
    """Head dims are multiples of 32 (one MX block) up to 256."""
    if h % BLOCK_SIZE or not 0 < h <= MAX_HEAD_DIM:
        raise ValueError(
            f"{name} has head_dim {h}; MXFP8 attention supports multiples of {BLOCK_SIZE} up to {MAX_HEAD_DIM} "
            "(e.g. 64, 128, 256)"
        )


def check_qkv_shapes(q, k, v) -> tuple[int, int, int, int, int, int]:
    """Checks BTNH query against BSKH key/value (same batch and head_dim, N % K == 0, supported head_dim).

    Returns (B, T, N, H, S, K). Raises ValueError naming the offending argument.
    """
    b, t, n, h = q.shape
    _, s, n_kv, _ = k.shape
    check_head_dim(h, "query")
    if n == 0 or n_kv == 0:
        raise ValueError(f"query ({n}) and key ({n_kv}) must have at least one head (axis 2)")
    if k.shape[0] != b or k.shape[3] != h:
        raise ValueError(f"key of shape {k.shape} does not match query of shape {q.shape} (batch and head_dim)")
    if v.shape != k.shape:
        raise ValueError(f"value must have key's shape {k.shape}; got {v.shape}")
    if n % n_kv:
        raise ValueError(f"query has {n} heads, not a multiple of key's {n_kv} heads")
    return b, t, n, h, s, n_kv


def check_qkv_operand(x, name: str) -> tuple[jax.Array | MXArray, bool]:
    """A dense query / key / value: (x as a 4-D array or MXArray, whether a batch axis was added to a 3-D x).

    Arrays must be float32 / bfloat16 / float16; MXArrays blocked within (sequence, head_dim): axes (-3, -1)
    square, (-1,) or (-3,) row (either scale layout: a blocked one is re-laid to the natural layout).
    """
    if isinstance(x, MXArray):
        x = check_consistent(x, name).natural()
        if x.ndim not in (3, 4):
            raise ValueError(f"{name} must have rank 4 (BTNH) or 3 (TNH); got shape {x.shape}")
        if not set(x.axes) <= {-3, -1}:
            raise ValueError(
                f"{name} is an MXArray blocked along axes {x.axes}; attention operands must be blocked within "
                "(sequence, head_dim) of one batch row and head: axes (-3, -1) square, (-1,) or (-3,) row"
            )
        if x.ndim == 3:
            return MXArray(data=x.data[None], scale=x.scale[None], axes=x.axes, block=x.block), True
        return x, False
    check_float32_range(x, name)
    x = jnp.asarray(x)
    if x.ndim not in (3, 4):
        raise ValueError(f"{name} must have rank 4 (BTNH) or 3 (TNH); got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating) or np.dtype(x.dtype).itemsize < 2:
        raise ValueError(f"{name} has dtype {x.dtype}; pass float32, bfloat16 or float16 (or an MXArray)")
    return (x[None], True) if x.ndim == 3 else (x, False)


def check_bias_or_mask(x, name: str, full: tuple[int, int, int, int], *, is_mask: bool) -> jax.Array | None:
    """A float bias or boolean mask (True = attend) of rank <= 4 broadcastable to full = (B, N, T, S), as a
    4-D array (leading axes of size 1 added); None stays None."""
    if x is None:
        return None
    if not is_mask:
        check_float32_range(x, name)
    x = jnp.asarray(x)
    if is_mask and x.dtype != jnp.bool_:
        raise ValueError(f"mask must be boolean (True = attend); got dtype {x.dtype}. Pass additive masks as bias")
    if not is_mask and not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"bias must be floating point; got dtype {x.dtype}")
    if x.ndim > 4:
        raise ValueError(f"{name} must have rank <= 4, broadcastable to (B, N, T, S) = {full}; got shape {x.shape}")
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    for d, f in zip(x.shape, full, strict=True):
        if d not in (1, f):
            raise ValueError(f"{name} of shape {x.shape} does not broadcast to (B, N, T, S) = {full}")
    return x


def check_seq_lengths(x, name: str, batch: int, bound: int, axis: str) -> jax.Array | None:
    """Optional per-row sequence lengths: an integer (batch,) array, as int32 clipped to [0, bound].

    bound is the size of the sequence axis they describe (`axis`). Concrete lengths outside [0, bound] raise
    (ops/checks.py check_length_values); traced ones cannot be checked and act as the nearest value in the
    range. The clip makes that so on every path: the kernels pad S to 128 rows, and a length past S would
    read their zero padding as keys."""
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.shape != (batch,) or not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array of shape ({batch},); got {x.dtype}{tuple(x.shape)}")
    check_length_values(x, name, bound, axis)
    return jnp.clip(x, 0, bound).astype(jnp.int32)


def output_dtype(operands) -> np.dtype:
    """The dtype of the (name, array or MXArray) operands that are arrays (they must agree), or bfloat16
    (ALL_MX_OUTPUT_DTYPE) when all are MXArrays."""
    raw = [(name, x.dtype) for name, x in operands if not isinstance(x, MXArray)]
    for name, dt in raw[1:]:
        if dt != raw[0][1]:
            raise ValueError(f"{name} has dtype {dt} but {raw[0][0]} has dtype {raw[0][1]}; pass one dtype")
    return np.dtype(raw[0][1] if raw else ALL_MX_OUTPUT_DTYPE)


# ---------------------------------------------------------------------------------------------------------
# Packed (jagged) sequences: operands, cu_seqlens offsets and max_seqlen
# ---------------------------------------------------------------------------------------------------------


def check_packed_operand(x, name: str) -> jax.Array | MXArray:
    """A packed (T_total, heads, head_dim) operand: an array, or an MXArray blocked along head_dim only (row
    blocks, axis -1), since blocks along the packed sequence axis would cross sequences."""
    if isinstance(x, MXArray):
        x = check_consistent(x, name).natural()  # a blocked scale layout is re-laid to the natural one
        if x.ndim != 3:
            raise ValueError(f"{name} must have rank 3 (T_total, heads, head_dim); got shape {x.shape}")
        if x.block != "row" or x.axes != (-1,):
            raise ValueError(
                f"{name} is an MXArray blocked along {x.axes} ({x.block}); packed jagged operands must be "
                "blocked along head_dim only (row blocks, axis -1): sequence-axis blocks would cross sequences"
            )
        return x
    check_float32_range(x, name)
    x = jnp.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"{name} must have rank 3 (T_total, heads, head_dim); got shape {x.shape}")
    return x


def check_cu_seqlens(cu, name: str) -> jax.Array:
    """(B + 1,) integer offsets with B >= 1, as int32 (their values: check_concrete_offsets)."""
    cu = jnp.asarray(cu)
    if cu.ndim != 1 or cu.shape[0] < 2 or not jnp.issubdtype(cu.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array of shape (B + 1,) with B >= 1; got {cu.dtype}{cu.shape}")
    return cu.astype(jnp.int32)


def check_max_seqlen(m, name: str) -> int:
    """A static maximum sequence length: a positive Python int."""
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m <= 0:
        raise ValueError(f"{name}={m!r} must be a positive Python int (it is static)")
    return int(m)


def check_concrete_offsets(cu, max_len: int, total: int, name_cu: str, name_max: str) -> None:
    """When cu_seqlens is concrete (not traced), checks it is monotone, fits T_total and max_seqlen."""
    c = concrete_value(cu)
    if c is None:
        return
    lengths = np.diff(c)
    if c[0] < 0 or np.any(lengths < 0) or c[-1] > total:
        raise ValueError(f"{name_cu}={c.tolist()} must be non-decreasing offsets within [0, {total}]")
    if lengths.size and lengths.max() > max_len:
        raise ValueError(f"{name_max}={max_len} is smaller than the longest sequence ({int(lengths.max())})")


def check_offsets_traced(cu: jax.Array, max_len: int, total: int, name_cu: str, name_max: str) -> None:
    """The checked mode (check_offsets=True): check_concrete_offsets' checks as jax.experimental.checkify
    checks, so they also run on traced offsets; the caller wraps the computation in checkify.checkify."""
    lengths = cu[1:] - cu[:-1]
    checkify.check(
        (cu[0] >= 0) & jnp.all(lengths >= 0) & (cu[-1] <= total),
        f"{name_cu}={{}} must be non-decreasing offsets within [0, {total}]",
        cu,
    )
    checkify.check(
        jnp.max(lengths) <= max_len,
        f"{name_max}={max_len} is smaller than the longest sequence ({{}})",
        jnp.max(lengths),
    )
