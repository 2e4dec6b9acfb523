"""FFI-backed Hopper MX GEMM (layer 5) on the aligned operands (docs/interfaces.md, docs/numerics.md).

  MX_GEMM, MX_GEMM_BIAS: FfiOp        targets "jax_mxfp8_mx_gemm" (a, b, sa, sb) and
                                      "jax_mxfp8_mx_gemm_bias" (a, b, sa, sb, bias)
  mx_gemm(a, b, sa, sb, bias=None, *, out_dtype, path, tune=0, tile_n=None, out=None) -> c (G, M, N)
  tile_n_for(*, m, n, g, tile_n=None) -> int       the production tiling a call runs (TILE_N_ENV forces one)
  mx_gemm_unsupported(a_shape, b_shape, a_dtype, b_dtype, out_dtype, has_bias) -> str | None
  emulate_mx_gemm(a, b, sa, sb, bias, out_dtype) -> c     the kernel's formula in XLA

Operands: a (G, M, Kp), b (G, N, Kp) float8_e4m3fn / float8_e5m2, K-major (aligned data, zero padded to
Kp = ceil(K / 128) * 128); sa (G, Kp/128, M), sb (G, Kp/128, N) float32 (powers of two, NaN for a NaN
block); bias (N,) float32. c (G, M, N) bfloat16 / float32:
  c = sum_{kt ascending} (sa[g, kt, m] * sb[g, kt, n]) * (sum_{k in kt} a[g, m, k] b[g, n, k]) (+ bias[n])
with float32 partial sums per 128-K tile, float32 promotion, one RN cast at the end. The kernel is
jax_mxfp8/kernels/sm90/mx_gemm.py, its handler csrc/mx_gemm.cc; path "emulated" runs emulate_mx_gemm
instead of the FFI call, through the same partitioning and batching. Under jit with sharded operands the
call partitions over g, m and n, and over K in whole 128-K tiles (Kp sharded so that every device holds
whole tiles, i.e. a mesh axis size dividing Kp/128): each device then runs the float32 GEMM without bias
over its K slice, the partials are summed in float32 (psum over the K mesh axes), the bias is added once
and the sum rounded once to out_dtype (`_reduction`). That equals the unsharded result up to the float32
summation order of the Kp/128 tile partials (docs/numerics.md "Sharded K"). K sharded otherwise (a shard
boundary inside a tile) is gathered first. Under vmap the mapped axis joins G (an unbatched bias
broadcasts; a batched bias maps the call over the axis).

Tilings: every production key has two tilings, 128x192 and 128x128 (registry PRODUCTION_TILINGS, bit-identical
results); tile_n_for picks one per call from the global (G, M, N) by registry.mx_gemm_tile_n (the estimate of
padded work and wave tails), unless the call's tile_n or the environment variable JAX_MXFP8_MX_GEMM_TILE_N
(192 or 128, read at trace time: benchmarks that compare tilings in one process pass tile_n instead) forces
one. A K-sharded call's per-device partials run the tiling chosen for the whole call.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.ffi_op import FfiOp, Reduction, ShardingRule

ARCHS = registry.MXGemmConfig().archs
"""The archs the MX GEMM kernel is built for (wgmma: sm_90a)."""

K_TILE = registry.GEMM_K_TILE
_INT32_MAX = 2**31 - 1
TILE_N_ENV = "JAX_MXFP8_MX_GEMM_TILE_N"
"""Environment variable forcing the production tiling of every MX GEMM call that does not pass tile_n: "192" or
"128" (unset or empty: the choice by shape). For A/B runs of whole training steps."""


def tile_n_for(*, m: int, n: int, g: int = 1, tile_n: int | None = None) -> int:
    """The production tile width a call with output c (G, M, N) runs: tile_n when given, else TILE_N_ENV when
    set, else registry.mx_gemm_tile_n(m, n, g). ValueError for a width that is not a production tiling."""
    source = "tile_n"
    if tile_n is None:
        forced = os.environ.get(TILE_N_ENV, "").strip()
        if not forced:
            return registry.mx_gemm_tile_n(m, n, g) if min(g, m, n) > 0 else registry.PRODUCTION_TILE_NS[0]
        source = TILE_N_ENV
        try:
            tile_n = int(forced)
        except ValueError:
            tile_n = forced
    if tile_n not in registry.PRODUCTION_TILE_NS:
        raise ValueError(f"mx_gemm: {source}={tile_n!r} not in {registry.PRODUCTION_TILE_NS} (the production tilings)")
    return tile_n


def _dtype_name(dtype) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def _shape_error(a_shape, b_shape) -> str | None:
    """Why (a_shape, b_shape) are not a valid (G, M, Kp), (G, N, Kp) pair (any path), or None."""
    if len(a_shape) != 3 or len(b_shape) != 3:
        return f"a and b must be rank 3 (G, M, Kp) and (G, N, Kp), got a {tuple(a_shape)} and b {tuple(b_shape)}"
    if a_shape[0] != b_shape[0] or a_shape[2] != b_shape[2]:
        return f"a {tuple(a_shape)} and b {tuple(b_shape)} must agree on G (axis 0) and Kp (axis 2)"
    return None


def mx_gemm_unsupported(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    a_dtype,
    b_dtype,
    out_dtype,
    has_bias: bool,
) -> str | None:
    """The reason the kernel cannot take this call (None = it can).

    Args: the shapes a (G, M, Kp) and b (G, N, Kp), their dtypes, the output dtype and whether a bias is
    added. Used for the fallback to the reference and for the ValueError implementation="cuda" raises."""
    bad = _shape_error(a_shape, b_shape)
    if bad:
        return bad
    g, m, kp = a_shape
    n = b_shape[1]
    names = {"a": _dtype_name(a_dtype), "b": _dtype_name(b_dtype)}
    for arg, name in names.items():
        if name not in registry.ELEM_DTYPES:
            return f"{arg} has dtype {name}; the kernel takes {' or '.join(registry.ELEM_DTYPES)}"
    out_name = _dtype_name(out_dtype)
    if out_name not in registry.GEMM_OUT_DTYPES:
        return f"out_dtype={out_name}; the kernel writes {' or '.join(registry.GEMM_OUT_DTYPES)}"
    if kp <= 0 or kp % K_TILE:
        return f"Kp = {kp} (a's axis 2) must be a positive multiple of {K_TILE} (aligned operands are padded)"
    align = registry.GEMM_ALIGN
    if m % align or n % align:
        return f"M = {m} and N = {n} must be multiples of {align} (the kernel's TMA strides)"
    if max(g * m, g * n) * kp > _INT32_MAX or g * m * n > _INT32_MAX or g * (kp // K_TILE) > _INT32_MAX:
        return "operands over 2^31 elements (the kernel's 32-bit indexing)"
    if _variant(names["a"], names["b"], out_name, has_bias, 0, registry.PRODUCTION_TILE_NS[0]) is None:
        return f"no MX GEMM kernel for a {names['a']}, b {names['b']}, out {out_name}, bias {has_bias}"
    return None


def _variant(a_dtype: str, b_dtype: str, out_dtype: str, has_bias: bool, tune: int, tile_n: int):
    """The registry variant: production (tune 0) at tile_n, or a comparison schedule (tune > 0, its own tiling)."""
    fields = dict(a_dtype=a_dtype, b_dtype=b_dtype, out_dtype=out_dtype, has_bias=has_bias, tune=tune)
    if tune:
        matches = [v for v in registry.MX_GEMM_TUNINGS if all(getattr(v, f) == x for f, x in fields.items())]
        return matches[0] if matches else None
    return registry.find(registry.MXGemmConfig, tile_n=tile_n, **fields)


@dataclasses.dataclass(frozen=True)
class MXGemmCall:
    """The static part of one call: the registry variant (dtypes, bias, tiling or tuning)."""

    variant: registry.MXGemmConfig


def emulate_mx_gemm(a, b, sa, sb, bias, out_dtype) -> jax.Array:
    """The kernel's formula in XLA (see the module docstring): per K tile a float32 partial product
    (HIGHEST precision; FP8 values are exact in float32), times sa * sb (a float32 product, as in the
    kernel), added to a float32 accumulator in ascending kt; + bias; one cast to out_dtype."""
    g, m, kp = a.shape
    n = b.shape[1]
    kt = kp // K_TILE
    at = a.astype(jnp.float32).reshape(g, m, kt, K_TILE).transpose(2, 0, 1, 3)
    bt = b.astype(jnp.float32).reshape(g, n, kt, K_TILE).transpose(2, 0, 1, 3)
    sat = jnp.moveaxis(sa.astype(jnp.float32), 1, 0)  # (Kt, G, M)
    sbt = jnp.moveaxis(sb.astype(jnp.float32), 1, 0)  # (Kt, G, N)

    def step(acc, xs):
        ak, bk, sak, sbk = xs
        part = jnp.einsum("gmk,gnk->gmn", ak, bk, precision=jax.lax.Precision.HIGHEST)
        return acc + part * (sak[:, :, None] * sbk[:, None, :]), None

    acc, _ = jax.lax.scan(step, jnp.zeros((g, m, n), jnp.float32), (at, bt, sat, sbt))
    if bias is not None:
        acc = acc + bias.astype(jnp.float32)
    return acc.astype(out_dtype)


def _outputs(call: MXGemmCall, a, b, *rest):
    return (jax.ShapeDtypeStruct((a.shape[0], a.shape[1], b.shape[1]), jnp.dtype(call.variant.out_dtype)),)


def _emulation(call: MXGemmCall, a, b, sa, sb, bias=None):
    return (emulate_mx_gemm(a, b, sa, sb, bias, jnp.dtype(call.variant.out_dtype)),)


def _sharding(call: MXGemmCall) -> ShardingRule:
    """g, m and n shard freely; K shards in whole 128-K tiles t (the scales' axis 1; k = the 128 elements of
    one tile, never split) and is summed over (`_reduction`)."""
    ops = ("g m (t k)", "g n (t k)", "g t m", "g t n")
    return ShardingRule(
        operands=(*ops, "n") if call.variant.has_bias else ops,
        results=("g m n",),
        factor_sizes=(("k", K_TILE),),
        replicated=("k",),
        reduced=("t",),
    )


def _reduction(call: MXGemmCall) -> Reduction | None:
    """K sharded: per device the float32 GEMM without bias over its K tiles (the same kernel formula on a
    slice of kt), the float32 sum over the K shards, then + bias and one cast to out_dtype, as the unsharded
    kernel's epilogue does. None (K stays replicated) for the benchmark-only tunings (tune > 0)."""
    v = call.variant
    partial = _variant(v.a_dtype, v.b_dtype, "float32", False, 0, v.tile_n)
    if partial is None or v.tune:
        return None
    out_dtype = jnp.dtype(v.out_dtype)

    def finish(sums, a, b, sa, sb, bias=None):
        (acc,) = sums
        return (acc if bias is None else acc + bias).astype(out_dtype)

    return Reduction(decl=MX_GEMM, static=MXGemmCall(partial), n_args=4, finish=finish)


MX_GEMM = FfiOp(
    target="jax_mxfp8_mx_gemm",
    outputs=_outputs,
    emulation=_emulation,
    sharding=_sharding,
    reduction=_reduction,
    batch_dims=(0, 0, 0, 0),
    result_batch_dims=(0,),
    attrs=lambda call: {"kernel": call.variant.name},
)
"""(a, b, sa, sb) -> c; shapes in the module docstring and csrc/mx_gemm.cc."""

MX_GEMM_BIAS = FfiOp(
    target="jax_mxfp8_mx_gemm_bias",
    outputs=_outputs,
    emulation=_emulation,
    sharding=_sharding,
    reduction=_reduction,
    batch_dims=(0, 0, 0, 0, None),
    result_batch_dims=(0,),
    attrs=lambda call: {"kernel": call.variant.name},
)
"""(a, b, sa, sb, bias) -> c + bias."""


def _check_scales(a, b, sa, sb, bias) -> None:
    g, m, kp = a.shape
    n = b.shape[1]
    kt = kp // K_TILE
    for arg, x, rows in (("sa", sa, m), ("sb", sb, n)):
        if tuple(x.shape) != (g, kt, rows):
            raise ValueError(f"{arg} has shape {tuple(x.shape)}, expected {(g, kt, rows)} (G, Kp/128, rows)")
        if x.dtype != jnp.float32:
            raise ValueError(f"{arg} has dtype {x.dtype}, expected float32")
    if bias is not None and (tuple(bias.shape) != (n,) or bias.dtype != jnp.float32):
        raise ValueError(f"bias must be float32 ({n},), got {bias.dtype} {tuple(bias.shape)}")


def mx_gemm(
    a: jax.Array,
    b: jax.Array,
    sa: jax.Array,
    sb: jax.Array,
    bias: jax.Array | None = None,
    *,
    out_dtype,
    path: str,
    tune: int = 0,
    tile_n: int | None = None,
    out: jax.Array | None = None,
) -> jax.Array:
    """c (G, M, N) = the MX GEMM of the aligned operands (module docstring), in out_dtype.

    path: "cuda" (the kernel) or "emulated" (emulate_mx_gemm through the same partitioning and batching).
    Either raises ValueError naming the argument when the operands do not fit together or the kernel does
    not cover them (mx_gemm_unsupported). tune: a comparison schedule (built with --with-tunes; it has its own
    tiling, so tile_n must then be None). tile_n: 192 or 128 forces that production tiling; None (default)
    takes tile_n_for's choice (TILE_N_ENV, else by shape). Both tilings return the same bits. out: an optional
    (G, M, N) buffer the kernel writes into (aliased; tests pass a NaN-filled one to check that every
    element is written; no partitioning or batching)."""
    why = mx_gemm_unsupported(a.shape, b.shape, a.dtype, b.dtype, out_dtype, bias is not None)
    if why:
        raise ValueError(f"mx_gemm: {why}")
    _check_scales(a, b, sa, sb, bias)
    if tune and tile_n is not None:
        raise ValueError(f"mx_gemm: tile_n={tile_n!r} with tune={tune}: a comparison schedule has its own tiling")
    chosen = tile_n_for(m=a.shape[1], n=b.shape[1], g=a.shape[0], tile_n=tile_n)
    names = (_dtype_name(a.dtype), _dtype_name(b.dtype), _dtype_name(out_dtype))
    variant = _variant(*names, bias is not None, tune, chosen)
    if variant is None:
        raise ValueError(f"mx_gemm: no tuning {tune} of the kernel for these dtypes")
    if path == "cuda":
        library.load_library()  # registers the FFI targets (idempotent)
    call = MXGemmCall(variant)
    decl = MX_GEMM if bias is None else MX_GEMM_BIAS
    args = (a, b, sa, sb) if bias is None else (a, b, sa, sb, bias)
    if out is not None:
        return decl.ffi_into(call, args, (out,))[0]
    return decl.call(call, path, *args)


def flops(a_shape: tuple[int, ...], n: int) -> int:
    """2 G M N Kp: the multiply-adds the kernel issues for a (G, M, Kp) and N columns."""
    return 2 * math.prod(a_shape) * n
