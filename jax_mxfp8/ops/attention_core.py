"""The core the attention ops share: the trace-time facts of a call, the kernel's coverage, the custom_vjp
residuals, the forward (Hopper kernel path or XLA reference) and the reference backward.

  AttentionStatic                                   the hashable facts of one call (the custom_vjp's static)
  kernel_unsupported(...), choose_implementation()  whether the Hopper kernel covers a call; which path runs
  quantize_operands(static, q, k, v, q_len, kv_len) the residuals: each (operand, block layout) quantized once
  mx_attention_fwd / forward_from_quants            -> ((o, lse), residuals), on the kernel path (fwd_kernel)
                                                    or the reference
  reference_backward(static, res, cts)              the XLA reference backward on those residuals

Layouts: the caller's query (B, T, N, H) and key / value (B, S, K, H) (BTNH / BSKH); the reference works
head-major, query (B, K, G, T, H) and key / value (B, K, S, H) with G = N // K query heads per KV head. On
the kernel path the square-block residuals stay sequence-major (axes (-3, -1), like a caller's MXArray). O is
returned in BTNH, the LSE as float32 (B, N, T). The residuals are (quants, o, lse, bias, mask, q_len, kv_len)
with quants the dict operand_keys names: 1 byte per element plus scales; the T x S matrix is recomputed
tile by tile in the backward and never stored.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.attention import AttentionConfig, operand_layouts
from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import dequantize
from jax_mxfp8.ops import attention_sm100
from jax_mxfp8.ops.quantize import quantize as quantize_op
from jax_mxfp8.primitives import attention_fwd as attention_kernel
from jax_mxfp8.primitives import attention_fwd_sm100, library
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives.attention_operands import prepare_sequence_major
from jax_mxfp8.reference.attention_bwd import attention_bwd
from jax_mxfp8.reference.attention_fwd import attention_fwd
from jax_mxfp8.reference.attention_quant import quantize_operand
from jax_mxfp8.reference.attention_tiling import Masking

KERNEL_OUT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float32))
"""Input/output dtypes the kernel path takes. float32 inputs are quantized from float32 (the contract's MX
values of the given input, as the reference quantizes them); the kernel writes O in bfloat16, and float32
callers get those values upcast: O carries bfloat16's 8-bit precision (2^-9 relative), far below the MX
operands' own error (docs/numerics.md, "Hopper attention kernel")."""


HOPPER = attention_kernel.ARCHS[0]
BLACKWELL = attention_sm100.ARCH


def kernel_arch() -> str:
    """The arch whose attention kernels the kernel path runs here: BLACKWELL on a compute-capability 10.0 / 10.3
    GPU (or under library.forced_gpu of one), else HOPPER (also for implementation="emulated" on a machine
    without a GPU)."""
    return BLACKWELL if library.gpu_arch() == BLACKWELL else HOPPER


@dataclasses.dataclass(frozen=True)
class AttentionStatic:
    """Hashable, trace-time facts of one call (the custom_vjp's non-differentiable argument)."""

    config: AttentionConfig
    scale: float
    is_causal: bool
    is_mx: tuple[bool, bool, bool]  # which of query, key, value arrived as MXArray
    out_dtype: np.dtype
    group: int  # G = N // K
    impl: str = "xla"  # "xla" (reference forward), "cuda" (the kernel forward) or "emulated" (its XLA body)
    arch: str = HOPPER  # whose kernels the kernel path runs: HOPPER (sm_90a) or BLACKWELL (sm_100f); kernel_arch()

    @property
    def kernel_path(self) -> bool:
        """Whether the forward runs the kernel path ("cuda", or "emulated" on any machine)."""
        return self.impl != "xla"


# ---------------------------------------------------------------------------------------------------------
# Which path runs
# ---------------------------------------------------------------------------------------------------------


def choose_implementation(
    implementation: str | None, unsupported: str | None = None, op: str = "dot_product_attention"
) -> str:
    """Resolves `implementation` for one call: "xla", "emulated" or "cuda" (the kernel of kernel_arch()).

    None picks the kernel when it can run (library built, default backend a compute-capability 9.0 GPU for
    the Hopper kernels, 10.0 / 10.3 for the Blackwell ones) and covers the arguments (`unsupported` is None,
    kernel_unsupported's answer for the same arch), else the XLA reference. "emulated" runs the kernel path
    with the kernel calls' XLA emulation (any machine). "cuda" raises RuntimeError when the kernel cannot run
    here and ValueError naming the reason when it does not cover the arguments (the one policy of
    jax_mxfp8.primitives.implementation, which also preloads the kernel modules). On Blackwell the forward's
    first-use self-test gates the kernel (a family it disabled runs the reference).
    """
    if kernel_arch() == BLACKWELL:
        archs, families = attention_fwd_sm100.ARCHS, attention_sm100.FAMILIES
        return impl.resolve(implementation, unsupported, archs, op=op, family=families)
    return impl.resolve(implementation, unsupported, attention_kernel.ARCHS, op=op)


def kernel_unsupported(config, *, head_dim, is_causal, has_bias, has_mask, out_dtype, mx_inputs) -> str | None:
    """Why the kernel of kernel_arch() does not cover these arguments (None when it does): the Hopper forward
    (kernels/sm90/attention_fwd.py) and the Blackwell one (kernels/sm100/attention_fwd.py) cover the same ones."""
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
    variants = attention_fwd_sm100 if kernel_arch() == BLACKWELL else attention_kernel
    _, why = variants.kernel_variant(
        head_dim=head_dim, causal=is_causal, p_scale=config.p_scale, p_rounding=config.scale_rounding
    )
    return why


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
# Residuals: the quantized operands
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


def quantize_operands(static, q, k, v, q_len, kv_len) -> dict:
    """Quantizes every (operand, layout) pair the config needs, once each (the custom_vjp residuals).

    Residuals are head-major, except on the kernel path, where the square-block residuals stay sequence-major
    (axes (-3, -1), like a caller's MXArray; T and S are multiples of 32, checked by dot_product_attention). On
    the Blackwell kernel path the producer also returns each operand's blocked scale bytes: "<name>:sm100"
    (Sm100Operand) next to its MXArray.
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
        elif static.kernel_path and layout == "square" and static.arch == BLACKWELL:
            # the producer writes the MXArray and the sm100 kernels' blocked bytes in one pass
            out[key], out[f"{name}:sm100"] = attention_sm100.square_operand(
                given[name], lengths[name], static.config.scale_rounding, static.impl
            )
        elif static.kernel_path and layout == "square":
            # the CUDA square quantize kernel: bit-identical to quantize_operand
            # (tests/quantize/test_quantize_kernels_gpu.py)
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


# ---------------------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------------------


def fwd_kernel(static: AttentionStatic, quants, q_len, kv_len, broadcast_q: bool = False):
    """Forward on the kernel of static.arch: on Hopper the producer pass on the sequence-major square MXArrays,
    then the kernel; on Blackwell the kernel on the same MXArrays (ops/attention_sm100.py).

    broadcast_q: the query residuals hold one batch row for all of k's (ops/broadcast_attention.py); the
    kernel reads it at batch 0 (q_len (B,) must be given)."""
    keys = operand_keys(static)
    q = kernel_operand(quants, keys["q_s"], q_len)
    if static.arch == BLACKWELL:  # the producer's operands where it ran, else the (caller's) MXArrays
        ops = [quants.get(f"{use[0]}:sm100") for use in ("q_s", "k_s", "v_o")]
        q, k, v = (
            op if op is not None and not keys[use].endswith(":user") else kernel_operand(quants, keys[use], n)
            for op, use, n in zip(ops, ("q_s", "k_s", "v_o"), (q_len, kv_len, kv_len), strict=True)
        )
        return attention_sm100.dense_forward(static, q, k, v, q_len, kv_len, broadcast_q)
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
    """The custom_vjp fwd: quantize_operands, then forward_from_quants -> ((o, lse), residuals)."""
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


# ---------------------------------------------------------------------------------------------------------
# Reference backward
# ---------------------------------------------------------------------------------------------------------


def reference_backward(static: AttentionStatic, res, cts):
    """The XLA reference backward on mx_attention_fwd's residuals and the cotangents (dO (B, T, N, H), dLSE
    (B, N, T)): (dq, dk, dv, dbias, None, None, None), None for MXArray inputs and an absent bias."""
    quants, o, lse, bias, mask, q_len, kv_len = res
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
