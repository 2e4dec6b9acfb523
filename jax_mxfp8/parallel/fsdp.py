"""FSDP with pre-all-gather shard quantization: gather MXFP8 weights (1 byte + 1/32 byte per element)
instead of BF16/FP32 ones, in the forward AND the backward.

Each device quantizes its own shard of the weight along the GEMM's contracting axis (block boundaries
coincide with shard boundaries when every shard holds a multiple of 32 rows), then the FP8 bytes and the
E8M0 scales are all-gathered. The result is bit-identical to quantizing the whole weight on one device,
because row blocks never span two shards.

`fsdp_mx_dot` (used by the Flax layers' gather_sharding) does it for both GEMMs that read the weight: the
forward gathers W quantized along its contracting axis K, the backward gathers a second MXFP8 copy
quantized along the dgrad GEMM's contracting axis N (dX = Q(G along N) @ Q(W along N)): blocks along N lie
inside every shard of an FSDP split along K, so each device quantizes its shard and only bytes move; the
result is the operand the dgrad would have quantized from the gathered float32 weight, bit for bit. The
weight gradient needs no gathered weight (dW = Q(G along M)^T Q(X along M)).

On a Blackwell GPU (compute capability 10.0 / 10.3; library.forced_gpu in tests) `fsdp_mx_dot` runs the
three GEMMs on the sm100 kernel path (ops/mx_dot_sm100.py) where it covers the call: each device quantizes its
shard with the blocked-scale producer straight into the GEMM operand's form (contracting axis last, E8M0
scales in the 128x4 blocked layout: `gather_blocked`), and those bytes are all-gathered, so nothing is
re-laid after the gather. Elsewhere (Hopper included) the GEMMs run the XLA reference on the gathered
MXArrays.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.formats import BLOCK_SIZE, MXArray, quantize
from jax_mxfp8.formats.quantize import check_blockable, check_float32_range
from jax_mxfp8.ops import mx_dot_kernel
from jax_mxfp8.ops.mx_dot_general import check_dot_arguments
from jax_mxfp8.ops.mx_dot_sm100 import SM100
from jax_mxfp8.ops.no_second_order import guard_bwd, guard_fwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.gemm_operands import gemm_operands
from jax_mxfp8.reference import gemm_dims
from jax_mxfp8.reference.gemm import operand_layouts


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
    check_float32_range(w, "w")
    w = jnp.asarray(w)
    if not jnp.issubdtype(w.dtype, jnp.floating) or np.dtype(w.dtype).itemsize < 2:
        raise ValueError(f"w has dtype {w.dtype}; gather_quantized takes float32, bfloat16 or float16 weights")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -w.ndim <= axis < w.ndim:
        raise ValueError(f"axis={axis!r} must be an int indexing an axis of w (shape {w.shape})")
    check_blockable(w.shape, (int(axis) % w.ndim,), name="w")
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


def gather_blocked(
    w: jax.Array, sharding: NamedSharding, *, axis: int, config: MXDotConfig, path: str
) -> tuple[jax.Array, jax.Array]:
    """Blackwell: the (FSDP-sharded) weight w (D_in, D_out) quantized shard by shard along `axis` by the
    blocked-scale producer (primitives/gemm_operands.py, layout "blocked") as the sm100 GEMM's operand, then
    all-gathered to `sharding` (w's target sharding, mapped onto the operand's axes):
      axis 0 (the forward contracts D_in): data (1, D_out, D_in), scale (1, ceil(D_out/128), ceil(D_in/128), 512)
      axis 1 (the dgrad contracts D_out):  data (1, D_in, D_out), scale (1, ceil(D_in/128), ceil(D_out/128), 512)
    Each shard's tiles are the global ones when a shard holds whole 128-tiles of the contracting axis (the
    producer's sharding rule; else the producer runs replicated): only FP8 bytes and scale bytes move."""
    orient = "col" if axis == 0 else "row"
    w3 = mx_dot_kernel.kernel_input(w.reshape(1, *w.shape))
    data, scale = gemm_operands(
        w3, dtype=config.dtype, scale_rounding=config.scale_rounding, orientations=(orient,), path=path,
        layout="blocked",
    )[orient]  # fmt: skip
    spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
    order = (spec[1], spec[0]) if axis == 0 else spec
    packed = lax.with_sharding_constraint(pack_bytes(data), NamedSharding(sharding.mesh, P(None, *order)))
    scale = lax.with_sharding_constraint(scale, NamedSharding(sharding.mesh, P(None, *order, None)))
    return unpack_bytes(packed, data.dtype), scale


@dataclasses.dataclass(frozen=True)
class _FsdpStatic:
    sharding: jax.sharding.Sharding
    config: MXDotConfig
    out_dtype: np.dtype
    kernel: mx_dot_kernel.KernelDot | None = None  # the sm100 kernel path (Blackwell), or None: the reference


def fsdp_supported(w_shape: tuple[int, ...], config: MXDotConfig) -> bool:
    """Whether fsdp_mx_dot covers a (D_in, D_out) weight with this config (else gather in the forward only,
    through mx_dot_general(rhs_quantized=gather_quantized(...)))."""
    return len(w_shape) == 2 and w_shape[1] % BLOCK_SIZE == 0 and gemm_dims.keeps_dims(config)


def fsdp_mx_dot(
    x: jax.Array,
    w: jax.Array,
    sharding: jax.sharding.Sharding,
    *,
    config: MXDotConfig | None = None,
    x_quantized: MXArray | None = None,
    preferred_element_type=jnp.float32,
) -> jax.Array:
    """x @ w over x's last axis with MXFP8 GEMMs, w (D_in, D_out) FSDP-sharded: the forward and the dgrad
    each all-gather an MXFP8 copy of w (along D_in, along D_out) to `sharding`; no float weight moves.

    x: (..., D_in) float; x_quantized: optional MXArray of x along its last axis (rms_norm_quantize).
    Same numerics as mx_dot_general(x, w, ((x.ndim - 1,), (0,)), ...) with `config` (whose grad_rounding
    must be "nearest" and hadamard_seed None: fsdp_supported). Returns (..., D_out) in
    preferred_element_type.
    """
    config = config or MXDotConfig()
    if not isinstance(config, MXDotConfig):
        raise ValueError(f"config must be an MXDotConfig or None; got {type(config).__name__}")
    if isinstance(x, MXArray):
        raise ValueError("x must be a float array for fsdp_mx_dot; pass its MXArray as x_quantized")
    if not fsdp_supported(np.shape(w), config):
        raise ValueError(f"fsdp_mx_dot covers (D_in, D_out % 32 == 0) weights with nearest rounding; got {np.shape(w)}")
    dn = (((np.ndim(x) - 1,), (0,)), ((), ()))
    # mx_dot_general's checks: dtypes, shapes, x_quantized (an MXArray of x's shape blocked along D_in)
    args = check_dot_arguments(x, w, dn, config, None, x_quantized, None, preferred_element_type, None, ("x", "w"))
    x, w, out_dtype = args.lhs, args.rhs, args.out_dtype
    if x.size == 0 or w.size == 0:  # docs/numerics.md "Zero-size inputs"
        return jnp.zeros(x.shape[:-1] + w.shape[1:], out_dtype)
    kernel = _sm100_kernel(x, w, sharding, config, x_quantized)
    st = _FsdpStatic(sharding, config, out_dtype, kernel)
    if kernel is None and x_quantized is not None:
        x_quantized = x_quantized.natural()  # the reference reads natural scales
    return _fsdp_dot(st, x, w, x_quantized)


def _sm100_kernel(x, w, sharding, config: MXDotConfig, x_q) -> mx_dot_kernel.KernelDot | None:
    """The sm100 kernel path's KernelDot when the device is a Blackwell GPU the sm100 kernels serve and they
    cover the call (implementation=None's policy, with the families' self-tests), else None."""
    if library.gpu_arch() not in SM100.archs or not isinstance(sharding, NamedSharding):
        return None
    lhs_l, rhs_l = _layouts(x, w)
    views = mx_dot_kernel.MatrixView.of(lhs_l), mx_dot_kernel.MatrixView.of(rhs_l)
    why = SM100.unsupported(*views, config, x_q, None)
    path = impl.resolve(None, why, SM100.archs, op="fsdp_mx_dot", warn=False, family=SM100.families)
    if path == "xla":
        return None
    return mx_dot_kernel.KernelDot(*views, np.dtype(x.dtype), np.dtype(w.dtype), config, path, SM100)


def _layouts(x, w):
    return operand_layouts(x.shape, w.shape, (((x.ndim - 1,), (0,)), ((), ())))


def _gather(st: _FsdpStatic, w: jax.Array, axis: int) -> MXArray:
    return gather_quantized(w, st.sharding, axis=axis, dtype=st.config.dtype, scale_rounding=st.config.scale_rounding)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fsdp_dot(st: _FsdpStatic, x, w, x_q):
    return _fsdp_fwd(st, x, w, x_q)[0]


def _fsdp_fwd(st: _FsdpStatic, x, w, x_q):
    if st.kernel is not None:  # Blackwell: x's forward operand and wgrad residual, the gathered blocked weight
        k, be = st.kernel, st.kernel.backend
        a = be.operands(k.lhs, x, ("x",) if x_q is not None else ("k", "x"), st.config.dtype, st.config, k.path)
        a_k = be.prequantized(k.lhs, x_q) if x_q is not None else a["k"]
        w_k = gather_blocked(w, st.sharding, axis=0, config=st.config, path=k.path)
        out = be.gemm(a_k, w_k, st.out_dtype, k.path).reshape(k.out_shape)
        return out, (a["x"], w)  # w stays sharded; the backward gathers MXFP8 again
    lhs_l, rhs_l = _layouts(x, w)
    out = gemm_dims.forward(x, w, lhs_l, rhs_l, st.config, lhs_q=x_q, rhs_q=_gather(st, w, 0))
    return out.astype(st.out_dtype), (x, w)  # w stays sharded; the backward gathers MXFP8 again


def _fsdp_bwd(st: _FsdpStatic, res, g):
    if st.kernel is not None:  # the dgrad's weight operand (blocked along D_out) gathered again
        x_x, w = res
        w_n = gather_blocked(w, st.sharding, axis=1, config=st.config, path=st.kernel.path)
        dx, dw = st.kernel.backward((x_x, w_n), g)
        return dx, dw, None
    x, w = res
    lhs_l, rhs_l = _layouts(x, w)
    dx, dw = gemm_dims.backward(x, w, g, lhs_l, rhs_l, st.config, None, rhs_dgrad_q=_gather(st, w, 1))
    return dx.astype(x.dtype), dw.astype(w.dtype), None


_fsdp_dot.defvjp(guard_fwd(_fsdp_fwd, "fsdp_mx_dot", argnums=(1, 2)), guard_bwd(_fsdp_bwd, "fsdp_mx_dot"))
