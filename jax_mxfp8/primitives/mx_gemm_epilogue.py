"""FFI-backed Hopper MX GEMM with a quantize epilogue (layer 5): the output as MX row blocks along N.

  MX_GEMM_MX[(bias, pre, col)]: FfiOp   targets "jax_mxfp8_mx_gemm_mx[_bias][_pre][_col]" (col: with pre)
  mx_gemm_quantized(a, b, sa, sb, bias=None, *, activation="", store_pre=False, store_col=False, path)
      -> (q (G, M, N) float8_e4m3fn, s (G, M, N/32) uint8[, pre (G, M, N) bfloat16]
          [, qc (G, N, Mp) float8_e4m3fn, sc (G, Mp/128, N) float32])
  mx_gemm_quantized_unsupported(a_shape, b_shape, a_dtype, b_dtype, has_bias, activation) -> str | None
  emulate_mx_gemm_quantized(a, b, sa, sb, bias, activation, store_pre)   the kernel's formula in XLA

Operands as primitives/mx_gemm.py (aligned, K-major). The reference output is float32 (before any
bfloat16 rounding, registry/gemm_epilogue.py):
  y = acc (+ bias)                    acc the MX GEMM's float32 result (emulate_mx_gemm's float32 output)
  z = jax.nn.gelu(y) if activation == "gelu" else y     (tanh form, float32)
  (q, s) = jax_mxfp8.quantize(z, axis=-1)   (E4M3, scale_rounding "up"; NaN / Inf blocks: scale 0xFF, NaN)
  pre = y.astype(bfloat16)            store_pre only (the GELU backward's residual; without an activation,
                                      the bf16 output a following GEMM's backward needs)
  (qc, sc) = gemm_operands' "col" form of z = align128(quantize(z, axis=-2), axis=-2)   store_col only:
                                      blocks of 32 along M, one exponent per 128 M, transposed (G, N, Mp)
                                      (Mp = M rounded up to 128, padding +0): the operand of a wgrad GEMM
                                      that contracts z over M (ops/mx_dot_kernel.py's lhs residual)
The kernel is kernels/sm90/mx_gemm_epilogue.py, its handler csrc/mx_gemm.cc (RunMx). For activation ""
its bits are quantize(the plain MX GEMM kernel's float32 output (+ bias)); with "gelu" its tanh is the
hardware's tanh.approx.f32, so elements may differ from the emulation by one FP8 rounding step where the
~2^-11 relative tanh difference crosses a rounding boundary (and a scale where it crosses a power of two).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_mxfp8.formats import quantize
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule
from jax_mxfp8.primitives.gemm_operands import reference as operand_reference
from jax_mxfp8.primitives.mx_gemm import _check_scales, _dtype_name, emulate_mx_gemm, mx_gemm_unsupported

BLOCK = 32
ACTIVATIONS = registry.EPILOGUE_ACTIVATIONS
ELEM_DTYPE = jnp.dtype(registry.MX_EPILOGUE_ELEM)
RUN = 128  # rows per aligned run of the column orientation (reference/gemm_align.py RUN)


@dataclasses.dataclass(frozen=True)
class MXGemmQuantizedCall:
    """The static part of one call: the registry variant (bias, activation, store_pre, store_col)."""

    variant: registry.MXGemmEpilogueConfig


def _variant(
    a_dtype: str, b_dtype: str, has_bias: bool, activation: str, store_pre: bool, tune: int = 0, store_col: bool = False
):
    return registry.find(
        registry.MXGemmEpilogueConfig,
        a_dtype=a_dtype,
        b_dtype=b_dtype,
        has_bias=has_bias,
        activation=activation,
        store_pre=store_pre,
        store_col=store_col,
        tune=tune,
    )


def mx_gemm_quantized_unsupported(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    a_dtype,
    b_dtype,
    has_bias: bool,
    activation: str,
    store_col: bool = False,
) -> str | None:
    """The reason the quantize-epilogue kernel cannot take this call (None = it can): the plain MX GEMM's
    reasons (mx_gemm_unsupported), N not a multiple of 32, (store_col) M not a multiple of 32, or no
    variant for these operand dtypes."""
    why = mx_gemm_unsupported(a_shape, b_shape, a_dtype, b_dtype, "bfloat16", has_bias)
    if why:
        return why
    if b_shape[1] % BLOCK:
        return f"N = {b_shape[1]} must be a multiple of {BLOCK} (the epilogue's MX blocks along N)"
    if store_col and a_shape[1] % BLOCK:
        return f"M = {a_shape[1]} must be a multiple of {BLOCK} (the column orientation's MX blocks along M)"
    names = _dtype_name(a_dtype), _dtype_name(b_dtype)
    if _variant(*names, has_bias, activation, False) is None:
        return f"no quantize-epilogue kernel for a {names[0]}, b {names[1]} (the forward GEMM's e4m3 x e4m3 only)"
    return None


def epilogue_reference(y: jax.Array, activation: str) -> jax.Array:
    """z: the float32 value the epilogue quantizes, from y = acc (+ bias) float32."""
    return jax.nn.gelu(y, approximate=True) if activation == "gelu" else y


def emulate_mx_gemm_quantized(
    a, b, sa, sb, bias, activation: str, store_pre: bool, store_col: bool = False
) -> tuple[jax.Array, ...]:
    """The kernel's formula in XLA (module docstring): (q, s[, pre][, qc, sc])."""
    y = emulate_mx_gemm(a, b, sa, sb, bias, jnp.float32)
    z = epilogue_reference(y, activation)
    qz = quantize(z, axis=-1, dtype=ELEM_DTYPE, scale_rounding="up")
    out = (qz.data, qz.scale) + ((y.astype(jnp.bfloat16),) if store_pre else ())
    return out + (operand_reference(z, ELEM_DTYPE, "up", "col") if store_col else ())


def _outputs(call: MXGemmQuantizedCall, a, b, *rest):
    g, m, n = a.shape[0], a.shape[1], b.shape[1]
    outs = [jax.ShapeDtypeStruct((g, m, n), ELEM_DTYPE), jax.ShapeDtypeStruct((g, m, n // BLOCK), jnp.uint8)]
    if call.variant.store_pre:
        outs.append(jax.ShapeDtypeStruct((g, m, n), jnp.bfloat16))
    if call.variant.store_col:
        mp = -(-m // RUN) * RUN
        outs += [jax.ShapeDtypeStruct((g, n, mp), ELEM_DTYPE), jax.ShapeDtypeStruct((g, mp // RUN, n), jnp.float32)]
    return tuple(outs)


def _emulation(call: MXGemmQuantizedCall, a, b, sa, sb, bias=None):
    v = call.variant
    return emulate_mx_gemm_quantized(a, b, sa, sb, bias, v.activation, v.store_pre, v.store_col)


def _sharding(call: MXGemmQuantizedCall, shapes) -> ShardingRule:
    """g, m and the N blocks shard freely (a block's 32 columns c stay on one device); K is replicated.
    store_col: M shards only in whole 128-runs (r runs of j = 128 rows) when it is a multiple of 128 with
    two runs or more (every shard's runs are then the global ones: bit-identical, as gemm_operands);
    otherwise M is replicated (its padding to Mp ties the column outputs to the global size)."""
    v = call.variant
    m = shapes[0][1]
    runs = not v.store_col or (m % RUN == 0 and m > RUN)
    mm = "(r j)" if v.store_col and runs else "m"
    ops = (f"g {mm} k", "g (n c) k", f"g t {mm}", "g t (n c)")
    results = (f"g {mm} (n c)", f"g {mm} n") + ((f"g {mm} (n c)",) if v.store_pre else ())
    replicated = ("k", "t")
    sizes = (("c", BLOCK),)
    if v.store_col:
        results += (f"g (n c) {mm if runs else 'p'}", f"g {'r' if runs else 'u'} (n c)")
        sizes += (("j", RUN),) if runs else ()
        replicated += () if runs else ("m", "p", "u")
    return ShardingRule(
        operands=(*ops, "(n c)") if v.has_bias else ops, results=results, factor_sizes=sizes, replicated=replicated
    )


def _decl(bias: bool, pre: bool, col: bool) -> FfiOp:
    n_results = 2 + pre + 2 * col
    return FfiOp(
        target="jax_mxfp8_mx_gemm_mx" + ("_bias" if bias else "") + ("_pre" if pre else "") + ("_col" if col else ""),
        outputs=_outputs,
        emulation=_emulation,
        sharding=_sharding,
        sharding_takes_shapes=True,
        batch_dims=(0, 0, 0, 0, None) if bias else (0, 0, 0, 0),
        result_batch_dims=(0,) * n_results,
        attrs=lambda call: {"kernel": call.variant.name},
    )


MX_GEMM_MX = {
    (bias, pre, col): _decl(bias, pre, col)
    for bias in (False, True)
    for pre in (False, True)
    for col in (False, True)
    if pre or not col
}
"""(has_bias, store_pre, store_col) -> the FfiOp: (a, b, sa, sb[, bias]) -> (q, s[, pre][, qc, sc]) (store_col
only with store_pre: the registered variants)."""


def mx_gemm_quantized(
    a: jax.Array,
    b: jax.Array,
    sa: jax.Array,
    sb: jax.Array,
    bias: jax.Array | None = None,
    *,
    activation: str = "",
    store_pre: bool = False,
    store_col: bool = False,
    path: str,
    tune: int = 0,
    out: tuple[jax.Array, ...] | None = None,
) -> tuple[jax.Array, ...]:
    """(q, s[, pre]) of the MX GEMM of the aligned operands with the quantize epilogue (module docstring).

    Args:
      a (G, M, Kp), b (G, N, Kp): float8_e4m3fn, K-major; sa (G, Kp/128, M), sb (G, Kp/128, N) float32;
        bias (N,) float32 or None. N must be a multiple of 32.
      activation: "" or "gelu" (tanh form, float32, after the bias).
      store_pre: also return pre = bf16(acc + bias) (the GELU backward's residual, or with activation ""
        the high-precision output itself).
      store_col: also return the column orientation (qc, sc) (module docstring); needs store_pre and M a
        multiple of 32.
      path: "cuda" (the kernel) or "emulated" (emulate_mx_gemm_quantized through the same partitioning).
      tune: a comparison schedule (registry MX_GEMM_EPILOGUE_VARIANTS with tune > 0; built with --with-tunes).
      out: store_col only, path "cuda": the five result buffers the kernel writes into (the `_into` test
        hook: a test passes NaN-filled ones to check that every element is written; no partitioning).
    Returns q (G, M, N) float8_e4m3fn and s (G, M, N/32) uint8 (blocks of 32 along N)[, pre (G, M, N) bf16]
    [, qc (G, N, Mp) float8_e4m3fn, sc (G, Mp/128, N) float32].
    Raises ValueError naming the argument when the operands do not fit or the kernel does not cover them.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} not in {ACTIVATIONS}")
    if store_col and not store_pre:
        raise ValueError("store_col=True needs store_pre=True (the registered column-orientation variants)")
    why = mx_gemm_quantized_unsupported(a.shape, b.shape, a.dtype, b.dtype, bias is not None, activation, store_col)
    if why:
        raise ValueError(f"mx_gemm_quantized: {why}")
    _check_scales(a, b, sa, sb, bias)
    names = _dtype_name(a.dtype), _dtype_name(b.dtype)
    variant = _variant(*names, bias is not None, activation, store_pre, tune, store_col)
    if variant is None:
        raise ValueError(f"mx_gemm_quantized: no tuning {tune} of the epilogue kernel for these arguments")
    if path == "cuda":
        library.load_library()
    args = (a, b, sa, sb) if bias is None else (a, b, sa, sb, bias)
    decl = MX_GEMM_MX[(bias is not None, store_pre, store_col)]
    if out is not None:
        if not store_col or path != "cuda":
            raise ValueError("out= (the _into test hook) is for store_col=True on path 'cuda'")
        return decl.ffi_into(MXGemmQuantizedCall(variant), args, tuple(out))
    return tuple(decl.call(MXGemmQuantizedCall(variant), path, *args))
