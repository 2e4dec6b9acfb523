"""FFI-backed fused RMSNorm + MX quantize (layer 5): abstract eval, sharding, batching, and the fallback
to the XLA reference (jax_mxfp8.reference.rms_norm.rms_norm_quantize_fwd).

  rms_norm_quantize_fwd(x, weight, *, eps, dtype, scale_rounding, implementation=None) -> (y, MXArray)

y = x * rsqrt(mean(x^2, -1) + eps) * weight in x.dtype (float32 arithmetic) and the MXArray of y in row
blocks along the last axis, quantized from the ROUNDED y. No custom_vjp here: jax_mxfp8.rms_norm_quantize
(ops layer) differentiates through the reference backward.

implementation: None picks the kernel when the library is built, the default backend is a GPU of
compute capability 9.x / 10.x and the kernels cover the arguments; "xla" always uses the reference;
"cuda" uses the kernel or raises (RuntimeError: no library / GPU; ValueError: arguments not covered).

What the kernel covers: x float32 / bfloat16 of rank >= 1 with the last dimension D a multiple of 32 and
D <= registry.RMSNormQuantizeConfig.max_d (32768 for bf16, 16384 for f32); weight (D,) of any float
dtype (cast to float32 exactly, as the reference does); float8_e4m3fn / float8_e5m2; "up" / "floor".

Numerics: the kernel's (data, scale) equal jax_mxfp8.formats.quantize(y_kernel, axis=-1) bit for bit; y
equals the reference's except where the two float32 sums of squares (different summation orders)
differ and y lies next to a rounding boundary: there y differs in the last place (one bf16 ulp). See
jax_mxfp8/kernels/sm90/rms_norm_quantize.py and tests/test_rms_norm_quantize_gpu.py.

Sharding: a `custom_partitioning` whose Shardy rule lets the leading (row) axes shard freely and marks
the normalized axis (and the scale's block axis) as needing replication; the weight is replicated. The
GSPMD callbacks do the same. Batching: `custom_vmap` moves a vmapped x axis to the front (rows); a
vmapped weight falls back to the reference under vmap.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_mxfp8.formats import MXArray, element_format
from jax_mxfp8.formats.scales import check_scale_rounding
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import quantize as pq
from jax_mxfp8.reference.rms_norm import rms_norm_quantize_fwd as ref_rms_norm_quantize_fwd


def unsupported(x, weight, dtype, scale_rounding) -> str | None:
    """Why the kernel cannot take these arguments, or None."""
    name = np.dtype(x.dtype).name
    if name not in registry.IN_DTYPES:
        return f"the rms_norm_quantize kernel takes float32 / bfloat16 input, got {x.dtype}"
    if x.ndim < 1 or weight.shape != (x.shape[-1],):
        return f"weight must have shape ({x.shape[-1] if x.ndim else '?'},), got {weight.shape}"
    if not jnp.issubdtype(weight.dtype, jnp.floating):
        return f"weight must be a float array, got {weight.dtype}"
    cfg = registry.find(
        registry.RMSNormQuantizeConfig, in_dtype=name, elem_dtype=np.dtype(dtype).name, scale_rounding=scale_rounding
    )
    if cfg is None:
        return "no registered rms_norm_quantize kernel variant for these arguments"
    d = x.shape[-1]
    if d % 32 or d == 0:
        return f"the last dimension must be a positive multiple of 32, got {d}"
    if d > cfg.max_d:
        return f"the kernel normalizes rows of at most {cfg.max_d} {name} elements, got {d}"
    return None


def _ffi_rms_norm_quantize(x, w32, eps, elem, scale_rounding, tune=0):
    out = (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(x.shape, elem),
        jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 32), jnp.uint8),
    )
    return tuple(
        jax.ffi.ffi_call("jax_mxfp8_rms_norm_quantize", out)(
            x,
            w32,
            eps=np.float32(eps),
            scale_rounding=np.int32(registry.ROUNDING_CODE[scale_rounding]),
            tune=np.int32(tune),
        )
    )


def _xla_rms_norm_quantize(x, w32, eps, elem, scale_rounding, tune=0):
    y, q = ref_rms_norm_quantize_fwd(x, w32, eps, dtype=elem, scale_rounding=scale_rounding)
    return (y, q.data, q.scale)


def _sharding_rule(rank: int) -> str:
    lead = " ".join(f"b{i}" for i in range(rank - 1))
    return f"{lead} d, d -> {lead} d, {lead} d, {lead} s"


@functools.cache
def _op(eps: float, elem: str, scale_rounding: str, impl: str, tune: int = 0):
    """custom_vmap(custom_partitioning(kernel call)) for one static configuration."""
    body = _ffi_rms_norm_quantize if impl == "cuda" else _xla_rms_norm_quantize
    elem_dt = jnp.dtype(elem)

    def fn(x, w32):
        return body(x, w32, eps, elem_dt, scale_rounding, tune)

    def shardings(mesh, arg_shapes):
        x = arg_shapes[0]
        spec = tuple(x.sharding.spec) + (None,) * (x.ndim - len(tuple(x.sharding.spec)))
        spec = (*spec[: x.ndim - 1], None)  # rows shard freely; the normalized axis is whole
        xs = NamedSharding(mesh, P(*spec))
        return (xs, NamedSharding(mesh, P(None))), (xs, xs, xs)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[1]

    def partition(mesh, arg_shapes, result_shape):
        args, outs = shardings(mesh, arg_shapes)
        return mesh, fn, outs, args

    @functools.cache
    def op_for_rank(rank):
        c = custom_partitioning(fn)
        c.def_partition(
            partition=partition,
            infer_sharding_from_operands=infer,
            sharding_rule=_sharding_rule(rank),
            need_replication_factors=("d", "s"),
        )
        return c

    @jax.custom_batching.custom_vmap
    def op(x, w32):
        return op_for_rank(x.ndim)(x, w32)

    @op.def_vmap
    def _vmap(axis_size, in_batched, x, w32):
        xb, wb = in_batched
        if wb:  # a different weight per batch element: the reference, vmapped
            if not xb:
                x = jnp.broadcast_to(x, (axis_size, *x.shape))
            out = jax.vmap(lambda a, b: _xla_rms_norm_quantize(a, b, eps, elem_dt, scale_rounding))(x, w32)
            return out, (True, True, True)
        out = op(x, w32)  # x arrives with the vmapped axis at 0: the kernel flattens it into rows
        return out, (xb, xb, xb)

    return op


def rms_norm_quantize_fwd(
    x,
    weight,
    *,
    eps: float = 1e-6,
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    implementation: str | None = None,
    _impl_override: str | None = None,
    _tune: int = 0,
) -> tuple[jax.Array, MXArray]:
    """(y, quantize(y, axis=-1)) of RMSNorm over the last axis; see the module docstring."""
    pq._check_implementation(implementation)
    x, weight = jnp.asarray(x), jnp.asarray(weight)
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    why = unsupported(x, weight, fmt.dtype, scale_rounding)
    if _impl_override is None and not pq._use_kernel(implementation, why):
        return ref_rms_norm_quantize_fwd(x, weight, eps, dtype=dtype, scale_rounding=scale_rounding)
    x2 = x if x.ndim >= 2 else x[None]
    w32 = weight.astype(jnp.float32)
    op = _op(float(np.float32(eps)), fmt.dtype.name, scale_rounding, _impl_override or "cuda", _tune)
    y, data, scale = op(x2, w32)
    if x.ndim < 2:
        y, data, scale = y[0], data[0], scale[0]
    return y, MXArray(data=data, scale=scale, axes=(-1,), block="row")
