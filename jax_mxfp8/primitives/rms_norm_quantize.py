"""FFI-backed fused RMSNorm + MX quantize (layer 5): abstract eval, sharding, batching, and the fallback
to the XLA reference (jax_mxfp8.reference.rms_norm.rms_norm_quantize_fwd).

  rms_norm_quantize_fwd(x, weight, *, eps, dtype, scale_rounding, implementation=None, scale_layout="natural")
      -> (y, MXArray)

y = x * rsqrt(mean(x^2, -1) + eps) * weight in x.dtype (float32 arithmetic) and the MXArray of y in row
blocks along the last axis, quantized from the ROUNDED y. No custom_vjp here: jax_mxfp8.rms_norm_quantize
(ops layer) differentiates through the reference backward.

implementation: resolved by jax_mxfp8.primitives.implementation (None: the kernel where it runs and covers
the arguments; "xla": the reference; "emulated": RMS_NORM_QUANTIZE with its XLA body; "cuda": the kernel).

What the kernel covers: x float32 / bfloat16 of rank >= 1 with the last dimension D a multiple of 32 and
D <= registry.RMSNormQuantizeConfig.max_d (32768 for bf16, 16384 for f32); weight (D,) of any float
dtype (cast to float32 exactly, as the reference does); float8_e4m3fn / float8_e5m2; "up" / "floor".

Numerics: the kernel's (data, scale) equal jax_mxfp8.formats.quantize(y_kernel, axis=-1) bit for bit; y
equals the reference's except where the two float32 sums of squares (different summation orders)
differ and y lies next to a rounding boundary: there y differs in the last place (one bf16 ulp). See
jax_mxfp8/kernels/common/rms_norm_quantize.py and tests/rms_norm/test_rms_norm_quantize_gpu.py.

scale_layout="blocked" (x of rank >= 2; Blackwell): the MXArray's scales in the 128x4 blocked layout the sm100
MX GEMM reads (MXArray.scale_layout), written by the blocked-scale variants (RMS_NORM_QUANTIZE_BLOCKED,
RMSNormQuantizeBlockedConfig, sm_100f) on x viewed as (G, R, D); the same bytes as to_blocked_scales of the
natural scale, so the RMSNorm -> QKV hand-off reaches the GEMM without a re-layout pass.

Sharding (RMS_NORM_QUANTIZE): the leading (row) axes shard freely; the normalized axis (and the scale's
block axis) needs replication; the weight is replicated. RMS_NORM_QUANTIZE_BLOCKED: G shards freely, R in
whole 128-row tiles when 128 divides it (else replicated). Batching: a vmapped x folds into the rows (the G
axis); a vmapped weight falls back to the reference under vmap.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats import MXArray, element_format, to_blocked_scales
from jax_mxfp8.formats.mxarray import check_scale_layout
from jax_mxfp8.formats.scales import check_scale_rounding
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule
from jax_mxfp8.reference.rms_norm import rms_norm_quantize_fwd as ref_rms_norm_quantize_fwd


def kernel_variant(
    x, weight, dtype, scale_rounding, scale_layout: str = "natural"
) -> tuple[registry.RMSNormQuantizeConfig | None, str | None]:
    """(the registry variant, None) when the kernel covers these arguments, else (None, why not); scale_layout
    "blocked" looks for the blocked-scale variants (Blackwell)."""
    name = np.dtype(x.dtype).name
    if name not in registry.IN_DTYPES:
        return None, f"the rms_norm_quantize kernel takes float32 / bfloat16 input, got {x.dtype}"
    if x.ndim < 1 or weight.shape != (x.shape[-1],):
        return None, f"weight must have shape ({x.shape[-1] if x.ndim else '?'},), got {weight.shape}"
    if not jnp.issubdtype(weight.dtype, jnp.floating):
        return None, f"weight must be a float array, got {weight.dtype}"
    cls = registry.RMSNormQuantizeBlockedConfig if scale_layout == "blocked" else registry.RMSNormQuantizeConfig
    cfg = registry.find(cls, in_dtype=name, elem_dtype=np.dtype(dtype).name, scale_rounding=scale_rounding)
    if cfg is None:
        return None, "no registered rms_norm_quantize kernel variant for these arguments"
    d = x.shape[-1]
    if d % 32 or d == 0:
        return None, f"the last dimension must be a positive multiple of 32, got {d}"
    if d > cfg.max_d:
        return None, f"the kernel normalizes rows of at most {cfg.max_d} {name} elements, got {d}"
    return cfg, None


@dataclasses.dataclass(frozen=True)
class RmsNormQuantizeCall:
    """The static part of one kernel call: the registry variant and eps (an FFI attribute)."""

    variant: registry.RMSNormQuantizeConfig
    eps: float


def _outputs(call: RmsNormQuantizeCall, x, w32):
    elem = jnp.dtype(call.variant.elem_dtype)
    return (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(x.shape, elem),
        jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 32), jnp.uint8),
    )


def _emulation(call: RmsNormQuantizeCall, x, w32):
    v = call.variant
    y, q = ref_rms_norm_quantize_fwd(x, w32, call.eps, dtype=jnp.dtype(v.elem_dtype), scale_rounding=v.scale_rounding)
    return (y, q.data, q.scale)


def _blocked_outputs(call: RmsNormQuantizeCall, x, w32):
    g, r, d = x.shape
    return (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(x.shape, jnp.dtype(call.variant.elem_dtype)),
        jax.ShapeDtypeStruct((g, -(-r // 128), -(-d // 128), 512), jnp.uint8),
    )


def _blocked_emulation(call: RmsNormQuantizeCall, x, w32):
    y, data, scale = _emulation(call, x, w32)
    return (y, data, to_blocked_scales(scale))


def _blocked_sharding(call: RmsNormQuantizeCall, shapes) -> ShardingRule:
    """x (G, R, D): G free; R in whole 128-row tiles when 128 | R (two tiles or more), else replicated; D and
    the scale's tile columns replicated."""
    r = shapes[0][1]
    r_ok = r % 128 == 0 and r > 128
    rr, rt = ("(t k)", "t") if r_ok else ("r", "u")
    return ShardingRule(
        operands=(f"g {rr} d", "d"),
        results=(f"g {rr} d", f"g {rr} d", f"g {rt} e s"),
        factor_sizes=(("k", 128),) * r_ok,
        replicated=("d", "e", "s") + (() if r_ok else ("r", "u")),
    )


RMS_NORM_QUANTIZE = FfiOp(
    target="jax_mxfp8_rms_norm_quantize",
    outputs=_outputs,
    emulation=_emulation,
    # rows shard freely; the normalized axis (and the scale's block axis) stays whole; the weight is replicated
    sharding=lambda call: ShardingRule(
        operands=("... d", "d"), results=("... d", "... d", "... s"), replicated=("d", "s")
    ),
    batch_dims=(0, None),
    result_batch_dims=(0, 0, 0),
    unbatched="emulation",  # a different weight per batch element: the reference, vmapped
    attrs=lambda call: {"kernel": call.variant.name, "eps": np.float32(call.eps)},
)
"""(x (..., D), w32 (D,) float32) -> (y (..., D) in x.dtype, data (..., D), scale (..., D/32))."""

RMS_NORM_QUANTIZE_BLOCKED = FfiOp(
    target="jax_mxfp8_rms_norm_quantize_blocked",
    outputs=_blocked_outputs,
    emulation=_blocked_emulation,
    sharding=_blocked_sharding,
    sharding_takes_shapes=True,
    batch_dims=(0, None),
    result_batch_dims=(0, 0, 0),
    unbatched="emulation",
    attrs=lambda call: {"kernel": call.variant.name, "eps": np.float32(call.eps)},
)
"""(x (G, R, D), w32 (D,) float32) -> (y, data (G, R, D), scale (G, ceil(R/128), ceil(D/128), 512) blocked)."""


def rms_norm_quantize_fwd(
    x,
    weight,
    *,
    eps: float = 1e-6,
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    implementation: str | None = None,
    variant: registry.RMSNormQuantizeConfig | None = None,
    scale_layout: str = "natural",
) -> tuple[jax.Array, MXArray]:
    """(y, quantize(y, axis=-1)) of RMSNorm over the last axis; see the module docstring.

    variant: a registry variant to run instead of the production one (benchmarks of alternative tunings).
    scale_layout: the MXArray's ("natural" or "blocked": x of rank >= 2).
    """
    impl.check(implementation)
    x, weight = jnp.asarray(x), jnp.asarray(weight)
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    check_scale_layout(scale_layout, (-1,), "row", x)
    found, why = kernel_variant(x, weight, fmt.dtype, scale_rounding, scale_layout)
    variant = variant or found
    archs = variant.archs if variant is not None else registry.ARCHS
    path = impl.resolve(implementation, why, archs, op="rms_norm_quantize")
    if path == "xla":
        y, q = ref_rms_norm_quantize_fwd(x, weight, eps, dtype=dtype, scale_rounding=scale_rounding)
        return y, (q.blocked() if scale_layout == "blocked" else q)
    w32 = weight.astype(jnp.float32)
    call = RmsNormQuantizeCall(variant, float(np.float32(eps)))
    if scale_layout == "blocked":
        *lead, r, d = x.shape
        y, data, scale = RMS_NORM_QUANTIZE_BLOCKED.call(call, path, x.reshape(-1, r, d), w32)
        scale = scale.reshape(*lead, *scale.shape[1:])
        return y.reshape(x.shape), MXArray(data.reshape(x.shape), scale, (-1,), "row", scale_layout="blocked")
    x2 = x if x.ndim >= 2 else x[None]
    y, data, scale = RMS_NORM_QUANTIZE.call(call, path, x2, w32)
    if x.ndim < 2:
        y, data, scale = y[0], data[0], scale[0]
    return y, MXArray(data=data, scale=scale, axes=(-1,), block="row")
