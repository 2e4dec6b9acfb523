"""The MX GEMMs' operands (layer 5): MX quantize of x in one pass, for the Hopper GEMM (aligned to one exponent per
128 K: GEMM_OPERANDS(_BOTH)) or the Blackwell GEMM (scales in the 128x4 blocked layout: BLOCKED_OPERANDS(_BOTH)).

  gemm_operands(x, *, dtype, scale_rounding, orientations, path, layout="aligned")
      -> {"row": (data, scale), "col": (data, scale)}
  gemm_operands_unsupported(shape, dtype_in, dtype, scale_rounding, orientations, layout) -> str | None

x: (G, R, C) float32 / bfloat16, R and C multiples of 32. Orientations (a non-empty subset of
("row", "col"); both from ONE read of x on the kernel path):
  layout "aligned" (Hopper, kernels/common/gemm_operands.py, csrc/gemm_operands.cc): bit for bit
  align128(formats.quantize(x, axis=-1 / -2, dtype, scale_rounding), axis=-1 / -2) (reference/gemm_align.py
  has the numerics and the error bound); Cp, Rp = C, R rounded up to 128:
    "row": contract along C: data (G, R, Cp) FP8, scale (G, Cp/128, R) float32
    "col": contract along R, written transposed (K-major for wgmma): data (G, C, Rp), scale (G, Rp/128, C)
  layout "blocked" (Blackwell, kernels/sm100/blocked_operands.py, csrc/gemm_operands.cc): bit for bit
  formats.quantize(x, axis=-1 / -2, dtype, scale_rounding), its E8M0 scales in formats/blocked_scales.py's
  layout; Rt, Ct = ceil(R, C / 128):
    "row": data (G, R, C) FP8, scale (G, Rt, Ct, 512) uint8
    "col": data (G, C, R) (transposed: K-major for the tcgen05 MMA), scale (G, Ct, Rt, 512) uint8

path: "cuda" (the kernel), "emulated" (the same declaration with its XLA emulation: the plumbing without the
kernel) or "xla" (the reference directly). `path` is the GEMM's resolved path
(primitives/implementation.resolve); this module does not choose.

Sharding: G shards freely; R and C shard in whole 128-runs (tiles) when they are multiples of 128 (`_sharding`).
Batching: vmap folds into G.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats import element_format, to_blocked_scales
from jax_mxfp8.formats import quantize as ref_quantize
from jax_mxfp8.formats.quantize import check_blockable
from jax_mxfp8.formats.scales import check_scale_rounding
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.ffi_op import FfiOp, ShardingRule
from jax_mxfp8.reference.gemm_align import RUN, align128, padded

ORIENTATIONS = ("row", "col")
PATHS = ("cuda", "emulated", "xla")
LAYOUTS = ("aligned", "blocked")
_AXIS = {"row": -1, "col": -2}
_CONFIG = {"aligned": registry.GemmOperandsConfig, "blocked": registry.BlockedOperandsConfig}


def _layout(variant: registry.GemmOperandsConfig) -> str:
    return "blocked" if isinstance(variant, registry.BlockedOperandsConfig) else "aligned"


def _modes(variant: registry.GemmOperandsConfig) -> tuple[str, ...]:
    return ORIENTATIONS if variant.orientations == "both" else (variant.orientations,)


# ------------------------------------------------------------------------------------------ declarations
def _outputs(variant: registry.GemmOperandsConfig, x):
    g, r, c = x.shape
    elem = jnp.dtype(variant.elem_dtype)
    out = []
    for mode in _modes(variant):
        n, k = (r, c) if mode == "row" else (c, r)
        if _layout(variant) == "blocked":
            tiles = (g, -(-n // RUN), -(-k // RUN), 512)
            out += [jax.ShapeDtypeStruct((g, n, k), elem), jax.ShapeDtypeStruct(tiles, jnp.uint8)]
            continue
        kp = padded(k)
        out += [jax.ShapeDtypeStruct((g, n, kp), elem), jax.ShapeDtypeStruct((g, kp // RUN, n), jnp.float32)]
    return tuple(out)


def reference(x, dtype, scale_rounding: str, mode: str, layout: str = "aligned") -> tuple[jax.Array, jax.Array]:
    """(data, scale) of one orientation: align128(formats.quantize(x along the mode's contracting axis)), or
    (layout "blocked") formats.quantize's data, contracting axis last, and its scales in the blocked layout."""
    q = ref_quantize(x, axis=_AXIS[mode], dtype=dtype, scale_rounding=scale_rounding)
    if layout == "blocked":
        if mode == "row":
            return q.data, to_blocked_scales(q.scale)
        return jnp.swapaxes(q.data, -1, -2), to_blocked_scales(jnp.swapaxes(q.scale, -1, -2))
    return align128(q.data, q.scale, axis=_AXIS[mode])


def _emulation(variant: registry.GemmOperandsConfig, x):
    """The kernel's outputs from the reference (bit-identical: tests/gemm/test_gemm_operands.py, marked gpu)."""
    out = []
    for mode in _modes(variant):
        out += list(reference(x, jnp.dtype(variant.elem_dtype), variant.scale_rounding, mode, _layout(variant)))
    return tuple(out)


def _sharding(variant: registry.GemmOperandsConfig, shapes) -> ShardingRule:
    """G shards freely. R and C shard in whole 128-runs when they are multiples of 128 (two runs or more):
    then Rp = R and Cp = C, every shard's blocks and runs are the global ones (bit-identical results) and
    the local sizes stay multiples of 128 for the kernel; otherwise they stay replicated (the padding and the transpose
    tie them to the global size). So row-sharded activations (data parallelism over B*T) need no gather.

    Factors: r/c = the 128-runs of R/C, k/j = the 128 elements inside one; p, t, q, u = padded dims of an
    axis that does not shard."""
    _, r, c = shapes[0]
    # (Shardy rejects a compound dim with a factor of size 1: one run does not shard anyway)
    r_ok, c_ok = r % RUN == 0 and r > RUN, c % RUN == 0 and c > RUN
    rr = "(r k)" if r_ok else "r"  # R in x, row data / scale, col data (Rp = R)
    cc = "(c j)" if c_ok else "c"
    if _layout(variant) == "blocked":  # scales (G, tiles of the data's rows, tiles of its K, 512 bytes)
        results = {
            "row": (f"g {rr} {cc}", f"g {'r' if r_ok else 't'} {'c' if c_ok else 'p'} s"),
            "col": (f"g {cc} {rr}", f"g {'c' if c_ok else 'u'} {'r' if r_ok else 'q'} s"),
        }
        res = tuple(s for mode in _modes(variant) for s in results[mode])
        replicated = ("s",) + (() if r_ok else ("r", "q", "t")) + (() if c_ok else ("c", "p", "u"))
        sizes = (("k", RUN),) * r_ok + (("j", RUN),) * c_ok
        return ShardingRule(operands=(f"g {rr} {cc}",), results=res, factor_sizes=sizes, replicated=replicated)
    results = {
        "row": (f"g {rr} {cc if c_ok else 'p'}", f"g {'c' if c_ok else 't'} {rr}"),
        "col": (f"g {cc} {rr if r_ok else 'q'}", f"g {'r' if r_ok else 'u'} {cc}"),
    }
    res = tuple(s for mode in _modes(variant) for s in results[mode])
    replicated = (() if r_ok else ("r", "q", "u")) + (() if c_ok else ("c", "p", "t"))
    sizes = (("k", RUN),) * r_ok + (("j", RUN),) * c_ok
    return ShardingRule(operands=(f"g {rr} {cc}",), results=res, factor_sizes=sizes, replicated=replicated)


def _declaration(target: str, n_results: int) -> FfiOp:
    return FfiOp(
        target=target,
        outputs=_outputs,
        emulation=_emulation,
        sharding=_sharding,
        sharding_takes_shapes=True,
        batch_dims=(0,),
        result_batch_dims=(0,) * n_results,
    )


GEMM_OPERANDS = _declaration("jax_mxfp8_gemm_operands", 2)
"""x (G, R, C) -> (data, scale) of a "row" or "col" variant."""

GEMM_OPERANDS_BOTH = _declaration("jax_mxfp8_gemm_operands_both", 4)
"""x (G, R, C) -> (row data, row scale, col data, col scale) of a "both" variant, one read of x."""

BLOCKED_OPERANDS = _declaration("jax_mxfp8_blocked_operands", 2)
"""x (G, R, C) -> (data, blocked scale) of a "row" or "col" BlockedOperandsConfig variant (Blackwell)."""

BLOCKED_OPERANDS_BOTH = _declaration("jax_mxfp8_blocked_operands_both", 4)
"""x (G, R, C) -> (row data, row scale, col data, col scale), blocked scales, one read of x (Blackwell)."""


def declaration(variant: registry.GemmOperandsConfig) -> FfiOp:
    """The FFI declaration that runs `variant`."""
    if _layout(variant) == "blocked":
        return BLOCKED_OPERANDS_BOTH if variant.orientations == "both" else BLOCKED_OPERANDS
    return GEMM_OPERANDS_BOTH if variant.orientations == "both" else GEMM_OPERANDS


# ------------------------------------------------------------------------------------ kernel coverage
def _orientations(orientations) -> tuple[str, ...]:
    """orientations as a sorted tuple of distinct names; ValueError naming `orientations` otherwise."""
    items = (orientations,) if isinstance(orientations, str) else tuple(orientations)
    if not items or len(set(items)) != len(items) or not set(items) <= set(ORIENTATIONS):
        raise ValueError(f"orientations={orientations!r} must be a non-empty subset of {ORIENTATIONS}")
    return tuple(o for o in ORIENTATIONS if o in items)


def _key(orientations: tuple[str, ...]) -> str:
    return "both" if len(orientations) == 2 else orientations[0]


def find_variant(
    dtype_in, dtype, scale_rounding: str, orientations, layout: str = "aligned"
) -> registry.GemmOperandsConfig | None:
    """The registered production variant for these arguments (layout "aligned": Hopper's GemmOperandsConfig,
    "blocked": Blackwell's BlockedOperandsConfig), or None."""
    return registry.find(
        _CONFIG[layout],
        in_dtype=np.dtype(dtype_in).name,
        orientations=_key(_orientations(orientations)),
        elem_dtype=np.dtype(dtype).name,
        scale_rounding=scale_rounding,
    )


def gemm_operands_unsupported(
    shape: Sequence[int],
    dtype_in,
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    orientations: Sequence[str] = ORIENTATIONS,
    layout: str = "aligned",
) -> str | None:
    """Why the kernel cannot take x of this shape and dtype (None: it can). Arguments as gemm_operands."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != 3:
        return f"the kernel takes x of shape (G, R, C), got {shape}"
    if np.dtype(dtype_in).name not in registry.IN_DTYPES:
        return f"the kernel takes float32 / bfloat16 x, got {np.dtype(dtype_in).name}"
    g, r, c = shape
    if min(shape) <= 0 or r % 32 or c % 32:
        return f"the kernel needs R and C positive multiples of 32, got x of shape {shape}"
    rp, cp = padded(r), padded(c)
    if g > 65535 or rp // RUN > 65535:
        return f"x of shape {shape} exceeds the kernel's grid (G <= 65535, R <= 65535 * 128)"
    if max(g * r, g * c, g * rp // RUN, g * cp // RUN, rp, cp) >= 2**31:
        return f"x of shape {shape} exceeds the kernel's int32 2-D views"
    if find_variant(dtype_in, dtype, scale_rounding, orientations, layout) is None:
        return f"no registered {_CONFIG[layout].op} kernel variant for these arguments"
    return None


# ---------------------------------------------------------------------------------------- entry point
def gemm_operands(
    x,
    *,
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    orientations: Sequence[str] = ORIENTATIONS,
    path: str = "cuda",
    layout: str = "aligned",
) -> dict[str, tuple[jax.Array, jax.Array]]:
    """The GEMM operands of x in `layout` (module docstring): {orientation: (data, scale)}.

    Raises:
      ValueError: naming the argument (x, dtype, scale_rounding, orientations, path, layout), or why the
        kernel does not cover x on path "cuda" / "emulated".
      RuntimeError: path "cuda" where the kernel library or a supported GPU is unavailable.
    """
    x = jnp.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"x must be (G, R, C), got shape {x.shape}")
    if np.dtype(x.dtype).name not in registry.IN_DTYPES:
        raise ValueError(f"x has dtype {x.dtype}; gemm_operands takes float32 or bfloat16")
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    modes = _orientations(orientations)
    if path not in PATHS:
        raise ValueError(f"path={path!r} not in {PATHS}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} not in {LAYOUTS}")
    check_blockable(x.shape, (1, 2))
    x = jax.lax.stop_gradient(x)
    if path == "xla":
        return {m: reference(x, fmt.dtype, scale_rounding, m, layout) for m in modes}
    why = gemm_operands_unsupported(x.shape, x.dtype, fmt.dtype, scale_rounding, modes, layout)
    if why:
        raise ValueError(f"path={path!r}: {why}")
    variant = find_variant(x.dtype, fmt.dtype, scale_rounding, modes, layout)
    if path == "cuda":
        ok, reason = library.kernels_runnable(variant.archs)
        if not ok:
            raise RuntimeError(f"gemm_operands(path='cuda'): {reason}")
        library.preload()
    out = declaration(variant).call(variant, path, x)
    return {m: (out[2 * i], out[2 * i + 1]) for i, m in enumerate(modes)}
