"""Public MXFP8 dot-product attention: argument checks, implementation choice and the custom_vjp.

The custom_vjp's residuals are the quantized operands (MXArrays: 1 byte per element plus scales), the
output O and the LSE; the T x S matrix is recomputed tile by tile in the backward and never stored.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.attention import AttentionConfig, operand_layouts
from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import check_float32_range, dequantize
from jax_mxfp8.ops import attention_compat as compat
from jax_mxfp8.ops.checks import check_nonnegative_lengths
from jax_mxfp8.ops.cotangents import remat_safe
from jax_mxfp8.ops.no_second_order import guard_bwd, guard_fwd
from jax_mxfp8.ops.quantize import quantize as quantize_op
from jax_mxfp8.ops.scope import named_op
from jax_mxfp8.primitives import attention_fwd as attention_kernel
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives.attention_operands import prepare_sequence_major
from jax_mxfp8.reference.attention_bwd import attention_bwd
from jax_mxfp8.reference.attention_fwd import attention_fwd
from jax_mxfp8.reference.attention_quant import quantize_operand
from jax_mxfp8.reference.attention_tiling import Masking

IMPLEMENTATIONS = impl.IMPLEMENTATIONS
MAX_HEAD_DIM = 256
ALL_MX_OUTPUT_DTYPE = jnp.bfloat16
"""Output dtype when query, key and value are all MXArrays (there is no input dtype to follow)."""
KERNEL_OUT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float32))
"""Input/output dtypes the kernel path takes. float32 inputs are quantized from float32 (the contract's MX
values of the given input, as the reference quantizes them); the kernel writes O in bfloat16, and float32
callers get those values upcast: O carries bfloat16's 8-bit precision (2^-9 relative), far below the MX
operands' own error (docs/numerics.md, "Hopper attention kernel")."""


def check_implementation(implementation) -> None:
    """ValueError unless `implementation` is one of IMPLEMENTATIONS (None, "xla", "emulated", "cuda")."""
    impl.check(implementation)


def choose_implementation(
    implementation: str | None, unsupported: str | None = None, op: str = "dot_product_attention"
) -> str:
    """Resolves `implementation` for one call: "xla", "emulated" or "cuda" (the Hopper kernel).

    None picks the kernel when it can run (library built, default backend a compute-capability 9.x GPU)
    and covers the arguments (`unsupported` is None), else the XLA reference. "emulated" runs the kernel
    path with the kernel calls' XLA emulation (any machine). "cuda" raises RuntimeError when the kernel
    cannot run here and ValueError naming the reason when it does not cover the arguments (the one
    policy of jax_mxfp8.primitives.implementation, which also preloads the kernel modules).
    """
    return impl.resolve(implementation, unsupported, attention_kernel.ARCHS, op=op)


def kernel_unsupported(config, *, head_dim, is_causal, has_bias, has_mask, out_dtype, mx_inputs) -> str | None:
    """Why the Hopper kernel does not cover these arguments (None when it does); see kernels/sm90/attention_fwd.py."""
    # scale_rounding (operands and block-scaled P), the backward's dQ options (dq_accum, dq_fp16_scale_log2,
    # deterministic) and p_scale may vary; the rest must be the defaults
    default = AttentionConfig(
        scale_rounding=config.scale_rounding,
        dq_accum=config.dq_accum,
        p_scale=config.p_scale,
        dq_fp16_scale_log2=config.dq_fp16_scale_log2,
        deterministic=config.deterministic,
    )
    if config != default:
        return f"the kernel implements AttentionConfig's defaults (qkv_blocks, kv_tile, causal_safe); got {config}"
    if has_bias or has_mask:
        return "the kernel takes no bias or mask arrays (use is_causal and the sequence lengths)"
    if np.dtype(out_dtype) not in KERNEL_OUT_DTYPES:
        return f"the kernel takes bfloat16 or float32 inputs; got {np.dtype(out_dtype).name}"
    for name, x in mx_inputs:
        if x.dtype != jnp.float8_e4m3fn or x.block != "square" or x.axes != (-3, -1):
            return f"{name}: the kernel takes float8_e4m3fn MXArrays with square blocks over (sequence, head_dim)"
    _, why = attention_kernel.kernel_variant(
        head_dim=head_dim, causal=is_causal, p_scale=config.p_scale, p_rounding=config.scale_rounding
    )
    return why


@dataclasses.dataclass(frozen=True)
class AttentionStatic:
    """Hashable, trace-time facts of one call (the custom_vjp's non-differentiable argument)."""

    config: AttentionConfig
    scale: float
    is_causal: bool
    is_mx: tuple[bool, bool, bool]  # which of query, key, value arrived as MXArray
    out_dtype: np.dtype
    group: int  # G = N // K
    impl: str = "xla"  # "xla" (reference forward), "cuda" (the Hopper kernel forward) or "emulated" (its XLA body)

    @property
    def kernel_path(self) -> bool:
        """Whether the forward runs the kernel path ("cuda", or "emulated" on any machine)."""
        return self.impl != "xla"


# ---------------------------------------------------------------------------------------------------------
# Layout: user BTNH / BSKH <-> head-major (B, K, G, T, H) / (B, K, S, H)
# ---------------------------------------------------------------------------------------------------------


def _q_to_hm(x: jax.Array, group: int) -> jax.Array:
    b, t, n, h = x.shape
    return x.reshape(b, t, n // group, group, h).transpose(0, 2, 3, 1, 4)


def _q_from_hm(x: jax.Array) -> jax.Array:
    b, k, g, t, h = x.shape
    return x.transpose(0, 3, 1, 2, 4).reshape(b, t, k * g, h)


def _kv_to_hm(x: jax.Array) -> jax.Array:
    return x.transpose(0, 2, 1, 3)


def _kv_from_hm(x: jax.Array) -> jax.Array:
    return x.transpose(0, 2, 1, 3)


def _zero_rows(x: jax.Array, lengths: jax.Array | None, axis: int) -> jax.Array:
    """Zeroes positions >= lengths[b] along `axis` (batch is axis 0): padding must not move a block scale."""
    if lengths is None:
        return x
    pos = jnp.arange(x.shape[axis], dtype=jnp.int32)
    shape = [1] * x.ndim
    shape[0], shape[axis] = x.shape[0], x.shape[axis]
    keep = (pos[None, :] < lengths[:, None]).reshape(shape)
    return jnp.where(keep, x, jnp.zeros((), x.dtype))


def _to_5d(x: jax.Array | None, n_kv: int, group: int) -> jax.Array | None:
    """(B|1, N|1, T|1, S|1) bias/mask -> (B|1, K|1, G|1, T|1, S|1)."""
    if x is None:
        return None
    b, n, t, s = x.shape
    return x.reshape(b, 1, 1, t, s) if n == 1 else x.reshape(b, n_kv, group, t, s)


# ---------------------------------------------------------------------------------------------------------
# Quantized operands
# ---------------------------------------------------------------------------------------------------------


def operand_keys(static: AttentionStatic) -> dict[str, str]:
    """Maps each GEMM use (q_s, k_s, v_o, v_dp, q_dk, k_dq) to the residual holding its quantized operand."""
    lay = dataclasses.asdict(operand_layouts(static.config))
    keys = {}
    for use, layout in lay.items():
        name = use[0]
        keys[use] = f"{name}:user" if static.is_mx["qkv".index(name)] else f"{name}:{layout}"
    return keys


def square_sequence_major(x: jax.Array, lengths: jax.Array | None, scale_rounding: str, path: str = "cuda") -> MXArray:
    """(B, L, N, H) -> square-block MXArray in the same layout (blocks over (L, H), axes (-3, -1)); L % 32 == 0.

    The 2-D view (B*L, N*H) has exactly the per-head 32x32 blocks when L and H are multiples of 32, so the
    square quantize kernel reads the caller's layout once and no bfloat16 transpose is materialized; the
    head-major transposes then move FP8 bytes inside the producer pass's fusions. path "emulated" quantizes
    through the kernel call's emulation; "cuda" lets `quantize` pick the kernel where it runs.
    A fallback warning of that quantize names the enclosing public op (dot_product_attention or
    varlen_attention), or dot_product_attention when none encloses the call (a backward pass is traced after
    the op returned).
    """
    b, length, n, h = x.shape
    with impl.public_op("dot_product_attention"):
        a = quantize_op(
            _zero_rows(x, lengths, 1).reshape(b * length, n * h),
            axis=(-2, -1),
            block="square",
            scale_rounding=scale_rounding,
            implementation="emulated" if path == "emulated" else None,
        )
    return MXArray(a.data.reshape(b, length, n, h), a.scale.reshape(b, length // 32, n, h // 32), (-3, -1), "square")


def quantize_operands(static, q, k, v, q_len, kv_len) -> dict[str, MXArray]:
    """Quantizes every (operand, layout) pair the config needs, once each (the custom_vjp residuals).

    Residuals are head-major, except on the kernel path, where the square-block residuals stay sequence-major
    (axes (-3, -1), like a caller's MXArray; T and S are multiples of 32, checked by dot_product_attention).
    """
    raw = {
        "q": lambda: _zero_rows(_q_to_hm(q, static.group), q_len, 3),
        "k": lambda: _zero_rows(_kv_to_hm(k), kv_len, 2),
        "v": lambda: _zero_rows(_kv_to_hm(v), kv_len, 2),
    }
    given = {"q": q, "k": k, "v": v}
    lengths = {"q": q_len, "k": kv_len, "v": kv_len}
    out = {}
    for key in sorted(set(operand_keys(static).values())):
        name, layout = key.split(":")
        if layout == "user":
            out[key] = given[name]
        elif static.kernel_path and layout == "square":
            # the CUDA square quantize kernel: bit-identical to quantize_operand (tests/test_quantize_kernels_gpu.py)
            out[key] = square_sequence_major(given[name], lengths[name], static.config.scale_rounding, static.impl)
        else:
            out[key] = quantize_operand(raw[name](), layout, static.config.scale_rounding)
    return out


def _sequence_major(quants, key: str) -> bool:
    """Whether residual `key` is in the caller's BTNH / BSKH layout (a caller's MXArray, or square_sequence_major)."""
    return key.endswith(":user") or quants[key].axes == (-3, -1)


def _operand(static, quants, key, q_len, kv_len) -> jax.Array:
    """Dequantized head-major float32 operand for one residual key."""
    x = dequantize(quants[key], jnp.float32)
    if not _sequence_major(quants, key):
        return x
    # A caller's MXArray is in BTNH / BSKH; its padding rows are zeroed after dequantization so that
    # non-finite garbage there cannot reach the GEMMs (0 * NaN).
    if key[0] == "q":
        return _zero_rows(_q_to_hm(x, static.group), q_len, 3)
    return _zero_rows(_kv_to_hm(x), kv_len, 2)


def _masking(static, bias, mask, q_len, kv_len, s_len, n_kv) -> Masking:
    return Masking(
        is_causal=static.is_causal,
        s_real=s_len,
        q_len=q_len,
        kv_len=kv_len,
        mask=_to_5d(mask, n_kv, static.group),
        bias=_to_5d(bias, n_kv, static.group),
    )


# ---------------------------------------------------------------------------------------------------------
# custom_vjp
# ---------------------------------------------------------------------------------------------------------


def kernel_operand(quants, key: str, lengths) -> MXArray:
    """The sequence-major square MXArray of one operand for the kernel's producer pass.

    Our own quantization zeroed the rows past the lengths before quantizing; in a caller's MXArray the data
    rows past them and the scales of blocks wholly past them are zeroed here, as the reference's zeroing does.
    """
    x = quants[key]
    if lengths is None or not key.endswith(":user"):
        return x
    pos = jnp.arange(x.data.shape[1])
    data = jnp.where((pos[None, :] < lengths[:, None])[:, :, None, None], x.data, jnp.zeros((), x.data.dtype))
    blk = jnp.arange(x.scale.shape[1]) * BLOCK_SIZE
    scale = jnp.where((blk[None, :] < lengths[:, None])[:, :, None, None], x.scale, jnp.zeros((), x.scale.dtype))
    return MXArray(data, scale, x.axes, x.block)


def fwd_kernel(static: AttentionStatic, quants, q_len, kv_len, broadcast_q: bool = False):
    """Forward on the Hopper kernel: the producer pass on the sequence-major square MXArrays, then the kernel.

    broadcast_q: the query residuals hold one batch row for all of k's (ops/broadcast_attention.py); the
    kernel reads it at batch 0 (q_len (B,) must be given)."""
    keys = operand_keys(static)
    q = kernel_operand(quants, keys["q_s"], q_len)
    ops = prepare_sequence_major(
        q,
        kernel_operand(quants, keys["k_s"], kv_len),
        kernel_operand(quants, keys["v_o"], kv_len),
        scale=static.scale,
        q_len=q_len,
        kv_len=kv_len,
        path=static.impl,
    )
    o, lse = attention_kernel.attention_fwd(
        ops,
        causal=static.is_causal,
        t=q.shape[1],
        p_scale=static.config.p_scale,
        p_rounding=static.config.scale_rounding,
        path=static.impl,
        broadcast_q=broadcast_q,
    )
    return o.astype(static.out_dtype), lse  # the kernel writes O in BTNH


def mx_attention_fwd(static: AttentionStatic, q, k, v, bias, mask, q_len, kv_len):
    quants = quantize_operands(static, q, k, v, q_len, kv_len)
    return forward_from_quants(static, quants, bias, mask, q_len, kv_len)


def forward_from_quants(static: AttentionStatic, quants, bias, mask, q_len, kv_len):
    """The forward on already quantized operands (quantize_operands' dict): ((o, lse), residuals).

    Separate from the quantization so that ops/broadcast_attention.py can quantize one query sequence once
    and hand its MXArrays broadcast over the batch (an FP8 broadcast, not a tiled float query)."""
    keys = operand_keys(static)
    if static.kernel_path:
        o, lse = fwd_kernel(static, quants, q_len, kv_len)
        return (o, lse), (quants, o, lse, bias, mask, q_len, kv_len)
    qs = _operand(static, quants, keys["q_s"], q_len, kv_len)
    ks = _operand(static, quants, keys["k_s"], q_len, kv_len)
    vo = _operand(static, quants, keys["v_o"], q_len, kv_len)
    masking = _masking(static, bias, mask, q_len, kv_len, ks.shape[-2], ks.shape[1])
    o, lse = attention_fwd(qs, ks, vo, masking, scale=static.scale, config=static.config)
    o = _q_from_hm(o).astype(static.out_dtype)
    b, n_kv, g, t = lse.shape
    lse = lse.reshape(b, n_kv * g, t)
    return (o, lse), (quants, o, lse, bias, mask, q_len, kv_len)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mx_attention(static: AttentionStatic, q, k, v, bias, mask, q_len, kv_len):
    return mx_attention_fwd(static, q, k, v, bias, mask, q_len, kv_len)[0]


def mx_attention_bwd(static: AttentionStatic, res, cts):
    """The custom_vjp bwd: the backward kernel when the forward ran the kernel path and a backward variant
    covers the call (ops/attention_bwd_kernel.py), else the XLA reference on the residuals."""
    quants, o, lse, bias, mask, q_len, kv_len = res
    if static.kernel_path:
        from jax_mxfp8.ops import attention_bwd_kernel as kernel_bwd  # imports this module

        variant, _ = kernel_bwd.backward_variant(static, o.shape[-1])
        if variant is not None:
            return kernel_bwd.kernel_backward(static, variant, res, cts)
    do, dlse = cts
    keys = operand_keys(static)

    deq = {key: _operand(static, quants, key, q_len, kv_len) for key in set(keys.values())}
    opnd = {use: deq[key] for use, key in keys.items()}
    n_kv, s_len = opnd["k_s"].shape[1], opnd["k_s"].shape[-2]
    masking = _masking(static, bias, mask, q_len, kv_len, s_len, n_kv)
    b, n, t = lse.shape
    hm = (b, n_kv, static.group, t)
    # dO rows of query padding are zeroed: those outputs are constant 0, and a nonzero cotangent there
    # would otherwise change the square-block scale of the valid rows sharing its block.
    do_hm = _zero_rows(_q_to_hm(do.astype(jnp.float32), static.group), q_len, 3)
    dq, dk, dv, dbias = attention_bwd(
        opnd["q_s"],
        opnd["k_s"],
        opnd["v_dp"],
        opnd["q_dk"],
        opnd["k_dq"],
        _q_to_hm(o, static.group),
        lse.reshape(hm),
        do_hm,
        dlse.reshape(hm),
        masking,
        scale=static.scale,
        config=static.config,
    )
    out_dt = static.out_dtype
    dq = None if static.is_mx[0] else _q_from_hm(dq).astype(out_dt)
    dk = None if static.is_mx[1] else _kv_from_hm(dk).astype(out_dt)
    dv = None if static.is_mx[2] else _kv_from_hm(dv).astype(out_dt)
    if bias is not None:
        dbias = dbias.reshape(bias.shape).astype(bias.dtype)
    return dq, dk, dv, dbias, None, None, None


# grad of grad would be silently zero (quantized residuals): raise instead (ops/no_second_order.py)
# FP8 residuals (the quantized operands) travel as bits: jax.checkpoint would NaN E4M3's top binade
_mx_attention.defvjp(
    *remat_safe(
        guard_fwd(mx_attention_fwd, "dot_product_attention", argnums=(1, 2, 3, 4)),
        guard_bwd(mx_attention_bwd, "dot_product_attention"),
    )
)

# Eager calls would dispatch the tiled scan op by op; one compiled program per static signature is far
# faster, and inside an outer jit this inner jit is simply inlined.
_mx_attention_jit = jax.jit(_mx_attention, static_argnums=(0,))


# ---------------------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------------------


def _as_4d_operand(x, name: str):
    """Returns (x as a 4-D array or MXArray, whether a batch axis was added)."""
    if isinstance(x, MXArray):
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


def _check_broadcast_4d(x, name: str, full: tuple[int, int, int, int], *, is_mask: bool):
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


def _check_lengths(x, name: str, batch: int):
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.shape != (batch,) or not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array of shape ({batch},); got {x.dtype}{tuple(x.shape)}")
    check_nonnegative_lengths(x, name)
    return x.astype(jnp.int32)


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


def check_head_dim(h: int, name: str = "query") -> None:
    """Head dims are multiples of 32 (one MX block) up to 256."""
    if h % BLOCK_SIZE or not 0 < h <= MAX_HEAD_DIM:
        raise ValueError(
            f"{name} has head_dim {h}; MXFP8 attention supports multiples of {BLOCK_SIZE} up to {MAX_HEAD_DIM} "
            "(e.g. 64, 128, 256)"
        )


def output_dtype(operands) -> np.dtype:
    raw = [(name, x.dtype) for name, x in operands if not isinstance(x, MXArray)]
    for name, dt in raw[1:]:
        if dt != raw[0][1]:
            raise ValueError(f"{name} has dtype {dt} but {raw[0][0]} has dtype {raw[0][1]}; pass one dtype")
    return np.dtype(raw[0][1] if raw else ALL_MX_OUTPUT_DTYPE)


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------


@named_op("dot_product_attention")
def dot_product_attention(
    query: jax.Array | MXArray,
    key: jax.Array | MXArray,
    value: jax.Array | MXArray,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: jax.Array | None = None,
    key_value_seq_lengths: jax.Array | None = None,
    implementation: str | None = None,
    config: AttentionConfig | None = None,
    return_residual: bool | str = False,
    local_window_size: int | tuple[int, int] | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """MXFP8 scaled dot-product attention with jax.nn.dot_product_attention's layout and masks.

    softmax(scale * Q^ K^T + bias) V^ per head, with Q, K, V, P and (in the backward) dO and dS quantized to
    MXFP8 as DESIGN.md section 4 specifies (options in `config`, decisions in docs/numerics.md).

    Args:
      query: (B, T, N, H) or (T, N, H) float32/bfloat16/float16, or an MXArray of that shape blocked within
        (T, H). T must be a multiple of 32; H a multiple of 32 up to 256.
      key: (B, S, K, H) (or (S, K, H)); N must be a multiple of K (GQA; K == 1 is MQA). S a multiple of 32.
      value: same shape as key.
      bias: optional float array broadcastable to (B, N, T, S) (rank <= 4, leading axes added), added to the
        scaled logits; it receives a gradient.
      mask: optional bool array broadcastable to (B, N, T, S); True = attend.
      scale: softmax scale tau (a Python number); default 1 / sqrt(H).
      is_causal: query t attends key s <= t (top-left aligned, like jax.nn).
      query_seq_lengths, key_value_seq_lengths: optional (B,) int arrays; positions past them are padding:
        zeroed before quantization (so padding never changes a valid row's block scale) and masked.
      implementation: None (the Hopper kernel where it runs and covers the arguments, else the XLA
        reference), "xla" (the reference, runs anywhere), "emulated" (the kernel path with the kernel's
        arithmetic emulated in XLA: any machine, slow, for tests) or "cuda" (the kernel, or RuntimeError /
        ValueError saying why not). On the kernel path the backward runs the backward kernel where a
        variant covers the call (ops/attention_bwd_kernel.py), else the XLA reference. See
        choose_implementation and kernel_unsupported.
      config: AttentionConfig (default AttentionConfig()).
      return_residual: True: also return jax.nn's residual, the log-sum-exp (B, T, N) (or (T, N)) in the
        output's dtype with its gradient stopped; "lse": our float32 (B, N, T) LSE, differentiable.
      local_window_size: (left, right) or w = (w, w): query t attends keys t - left .. t + right, as in
        jax.nn (XLA reference only). See jax_mxfp8/ops/attention_compat.py.

    Returns:
      The output, shaped like query, in the inputs' dtype (bfloat16 if all three are MXArrays). Query rows
      with no valid key (fully masked) are 0 (jax.nn's XLA path: the mean of V) and their LSE -inf. With
      return_residual, (output, residual) as above.

    Gradients flow to query, key, value and bias (not to MXArray inputs, which are constants), under the
    straight-through rule: quantization is treated as identity and the backward GEMMs are MXFP8 too.
    """
    check_implementation(implementation)
    compat.check_return_residual(return_residual)
    window = compat.check_window(local_window_size)
    config = check_config(config, is_causal)

    q, unbatched = _as_4d_operand(query, "query")
    k, k_unb = _as_4d_operand(key, "key")
    v, v_unb = _as_4d_operand(value, "value")
    if not (unbatched == k_unb == v_unb):
        raise ValueError(f"query, key and value must all be rank 4 or all rank 3; got {q.shape}, {k.shape}, {v.shape}")
    b, t, n, h, s, n_kv = check_qkv_shapes(q, k, v)
    if t % BLOCK_SIZE or t == 0:
        raise ValueError(f"query sequence length T={t} (axis 1) must be a positive multiple of {BLOCK_SIZE}")
    if s % BLOCK_SIZE or s == 0:
        raise ValueError(f"key sequence length S={s} (axis 1) must be a positive multiple of {BLOCK_SIZE}")
    out_dtype = output_dtype([("query", q), ("key", k), ("value", v)])
    full = (b, n, t, s)
    bias = _check_broadcast_4d(bias, "bias", full, is_mask=False)
    mask = _check_broadcast_4d(mask, "mask", full, is_mask=True)
    if window is not None:
        mask = compat.with_window(mask, window, t, s)
    q_len = _check_lengths(query_seq_lengths, "query_seq_lengths", b)
    kv_len = _check_lengths(key_value_seq_lengths, "key_value_seq_lengths", b)
    why_not = kernel_unsupported(
        config,
        head_dim=h,
        is_causal=bool(is_causal),
        has_bias=bias is not None,
        has_mask=mask is not None,
        out_dtype=out_dtype,
        mx_inputs=[(nm, x) for nm, x in (("query", q), ("key", k), ("value", v)) if isinstance(x, MXArray)],
    )
    why_not = compat.KERNEL_NO_WINDOW if window is not None else why_not
    static = AttentionStatic(
        config=config,
        scale=check_scale(scale, h),
        is_causal=bool(is_causal),
        is_mx=tuple(isinstance(x, MXArray) for x in (q, k, v)),
        out_dtype=out_dtype,
        group=n // n_kv,
        impl=choose_implementation(implementation, why_not),
    )
    out, lse = _mx_attention_jit(static, q, k, v, bias, mask, q_len, kv_len)
    if unbatched:
        out, lse = out[0], lse[0]
    if not return_residual:
        return out
    return (out, lse) if return_residual == "lse" else (out, compat.jax_nn_residual(lse, out.dtype))
