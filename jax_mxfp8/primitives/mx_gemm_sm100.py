"""FFI-backed Blackwell MX GEMM (layer 5): block-scaled tcgen05 MMAs on E4M3 operands with blocked E8M0 scales.

  MX_GEMM_SM100[(epilogue, bias)]: FfiOp     targets "jax_mxfp8_mx_gemm_sm100[_row | _rowcol][_bias]"
  mx_gemm_sm100(a, b, sa, sb, bias=None, *, out_dtype, epilogue="plain", activation="", path, cta_group=None,
                tune=0, out=None) -> outputs (c[, q, s][, qc, sc])
  mx_gemm_sm100_unsupported(a_shape, b_shape, a_dtype, b_dtype, out_dtype, has_bias, epilogue, activation)
      -> str | None
  find_variant(...), choose_cta_group(m, epilogue), preferred_scale_layout(implementation)

Operands (the kernel's, kernels/sm100/mx_gemm.py; docs/interfaces.md "Blackwell MX GEMM"): a (G, M, K), b
(G, N, K) float8_e4m3fn, K-major, K a positive multiple of 32 (not padded: the TMA loads zero-fill past K);
sa (G, ceil(M/128), ceil(K/128), 512), sb (G, ceil(N/128), ceil(K/128), 512) uint8: the E8M0 scales of
32-blocks along K in the 128x4 blocked layout (formats/blocked_scales.py, padding bytes 0); bias (N,)
float32. Outputs by epilogue ("plain", "row" or "rowcol"; the two quantized ones always keep c = the
pre-activation):
  c  (G, M, N) out_dtype        y = acc (+ bias), rounded once
  q  (G, M, N) float8_e4m3fn, s (G, ceil(M/128), ceil(N/128), 512)   quantize(act(y)) along N, blocked scales
  qc (G, N, M) float8_e4m3fn, sc (G, ceil(N/128), ceil(M/128), 512)  quantize(act(y)) along M, transposed
acc = sum over 32-blocks of K of 2^(sa - 127) 2^(sb - 127) (a_block . b_block) in float32: the contract's
numerics (no 128-run alignment, unlike the Hopper GEMM). path "emulated" runs emulate_mx_gemm_sm100
(primitives/mx_gemm_sm100_emulation.py) through the same partitioning and batching.

Sharding: g shards freely; M, N in whole 128-row / -column tiles when 128 divides them (the blocked scales'
tiles shard with their data), else replicated; K (plain epilogue only) in whole 128-K tiles: each device
computes a float32 partial without bias, the partials are summed (psum) and the bias added once (numerics.md
"Sharded K"). Batching: a vmapped axis folds into G.

NOT RUN ON HARDWARE by this project: the kernel is compiled for sm_100f and checked statically; its first
call on a compute-capability 10.x GPU runs the family's self-test (primitives/sm100_self_tests.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.ffi_op import FfiOp, Reduction, ShardingRule
from jax_mxfp8.primitives.mx_gemm_sm100_emulation import emulate_mx_gemm_sm100

FAMILY = registry.MXGemmSm100Config.op
ARCHS = registry.MXGemmSm100Config.archs
EPILOGUES = ("plain", "row", "rowcol")
"""The epilogues a dispatch path runs (registered variants)."""
TILE = 128
BLOCK = 32
_INT32_MAX = 2**31 - 1


def preferred_scale_layout(implementation: str | None) -> str:
    """The scale layout the MX GEMMs of this device read: "blocked" on a GPU the sm100 kernels serve (compute
    capability 10.0 / 10.3, or library.forced_gpu of one) unless implementation is "xla", else "natural"."""
    return "blocked" if implementation != "xla" and library.gpu_arch() in ARCHS else "natural"


def choose_cta_group(m: int, epilogue: str) -> int:
    """2 (256-row tiles on a CTA pair, production) unless M fits one 128-row tile and the epilogue is plain
    (the registered 1-CTA variants): then 1, so that no CTA of a pair idles."""
    return 1 if m <= TILE and epilogue == "plain" else 2


def find_variant(
    a_dtype, b_dtype, out_dtype, has_bias: bool, epilogue: str = "plain", activation: str = "", cta_group: int = 2,
    tune: int = 0,
) -> registry.MXGemmSm100Config | None:  # fmt: skip
    """The registered variant for these arguments (None when there is none). Quantized epilogues keep c (the
    pre-activation) in bfloat16."""
    names = [np.dtype(d).name for d in (a_dtype, b_dtype, out_dtype)]
    return registry.find(
        registry.MXGemmSm100Config,
        a_dtype=names[0],
        b_dtype=names[1],
        out_dtype=names[2],
        has_bias=bool(has_bias),
        epilogue=epilogue,
        activation=activation,
        store_pre=epilogue != "plain",
        cta_group=cta_group,
        tune=tune,
    )


def _dtype_name(dtype) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def mx_gemm_sm100_unsupported(
    a_shape, b_shape, a_dtype, b_dtype, out_dtype, has_bias: bool, epilogue: str = "plain", activation: str = ""
) -> str | None:
    """Why the kernel cannot take this call (None = it can): shapes a (G, M, K), b (G, N, K), dtypes, the
    output dtype (c), the bias, the epilogue and its activation."""
    if len(a_shape) != 3 or len(b_shape) != 3:
        return f"a and b must be rank 3 (G, M, K) and (G, N, K), got a {tuple(a_shape)} and b {tuple(b_shape)}"
    if a_shape[0] != b_shape[0] or a_shape[2] != b_shape[2]:
        return f"a {tuple(a_shape)} and b {tuple(b_shape)} must agree on G (axis 0) and K (axis 2)"
    if epilogue not in EPILOGUES:
        return f"epilogue={epilogue!r} not in {EPILOGUES}"
    g, m, k = (int(d) for d in a_shape)
    n = int(b_shape[1])
    variant = find_variant(a_dtype, b_dtype, out_dtype, has_bias, epilogue, activation, choose_cta_group(m, epilogue))
    if variant is None:
        return (
            f"no Blackwell MX GEMM for a {_dtype_name(a_dtype)}, b {_dtype_name(b_dtype)}, out "
            f"{_dtype_name(out_dtype)}, bias {has_bias}, epilogue {epilogue!r}, activation {activation!r} "
            "(it takes float8_e4m3fn operands and writes bfloat16 / float32; the quantized epilogues keep bfloat16)"
        )
    return variant.unsupported(g, m, n, k)


def _tiles(x: int) -> int:
    return -(-x // TILE)


@dataclasses.dataclass(frozen=True)
class MXGemmSm100Call:
    """The static part of one call: the registry variant."""

    variant: registry.MXGemmSm100Config


def _outputs(call: MXGemmSm100Call, a, b, *rest):
    v = call.variant
    g, m, _ = a.shape
    n = b.shape[1]
    e4m3 = jnp.dtype(jnp.float8_e4m3fn)
    avals = {
        "c": jax.ShapeDtypeStruct((g, m, n), jnp.dtype(v.out_dtype)),
        "q": jax.ShapeDtypeStruct((g, m, n), e4m3),
        "s": jax.ShapeDtypeStruct((g, _tiles(m), _tiles(n), 512), jnp.uint8),
        "qc": jax.ShapeDtypeStruct((g, n, m), e4m3),
        "sc": jax.ShapeDtypeStruct((g, _tiles(n), _tiles(m), 512), jnp.uint8),
    }
    return tuple(avals[name] for name in v.outputs)


def _emulation(call: MXGemmSm100Call, a, b, sa, sb, bias=None):
    out = emulate_mx_gemm_sm100(a, b, sa, sb, bias, call.variant)
    return tuple(out[name] for name in call.variant.outputs)


def _axis(size: int, name: str) -> tuple[str, str, tuple, tuple]:
    """(the data dim, the scale tile dim, factor sizes, replicated factors) of an axis of `size`: whole
    128-tiles shard when 128 divides it (two tiles or more: Shardy rejects a factor of size 1)."""
    if size % TILE == 0 and size > TILE:
        return f"({name}t {name}e)", f"{name}t", ((f"{name}e", TILE),), (f"{name}e",)
    return name, f"{name}t", (), (name, f"{name}t")


def _sharding(call: MXGemmSm100Call, shapes) -> ShardingRule:
    """g free; M, N, K in whole 128-tiles when 128 divides them (module docstring); K is summed over
    (`reduced`: the plain epilogue's Reduction; the quantized ones keep K whole)."""
    (_, m, k), (_, n, _) = shapes[0], shapes[1]
    mm, mt, msz, mrep = _axis(m, "m")
    nn, nt, nsz, nrep = _axis(n, "n")
    kk, kt, ksz, krep = _axis(k, "k")
    ops = (f"g {mm} {kk}", f"g {nn} {kk}", f"g {mt} {kt} s", f"g {nt} {kt} s")
    if call.variant.has_bias:
        ops += (nn,)
    res = {"c": f"g {mm} {nn}", "q": f"g {mm} {nn}", "s": f"g {mt} {nt} s"}
    res |= {"qc": f"g {nn} {mm}", "sc": f"g {nt} {mt} s"}
    return ShardingRule(
        operands=ops,
        results=tuple(res[name] for name in call.variant.outputs),
        factor_sizes=msz + nsz + ksz,
        replicated=("s",) + mrep + nrep + krep,
        reduced=(kt,) if kk.startswith("(") else (),  # K in whole tiles: summed over (the plain epilogue)
    )


def _reduction(call: MXGemmSm100Call) -> Reduction | None:
    """K sharded (plain epilogue): per device the float32 GEMM without bias over its K tiles, the float32 sum
    over the K shards, then + bias and one cast to out_dtype. None for the quantized epilogues (their
    quantization needs the whole sum) and the comparison schedules."""
    v = call.variant
    if v.epilogue != "plain" or v.tune:
        return None
    partial = find_variant(v.a_dtype, v.b_dtype, "float32", False, "plain", "", v.cta_group)
    if partial is None:
        return None
    out_dtype = jnp.dtype(v.out_dtype)

    def finish(sums, a, b, sa, sb, bias=None):
        (acc,) = sums
        return (acc if bias is None else acc + bias).astype(out_dtype)

    return Reduction(decl=declaration(partial), static=MXGemmSm100Call(partial), n_args=4, finish=finish)


def _declaration(target: str, bias: bool, n_results: int) -> FfiOp:
    return FfiOp(
        target=target,
        outputs=_outputs,
        emulation=_emulation,
        sharding=_sharding,
        sharding_takes_shapes=True,
        reduction=_reduction,
        batch_dims=(0, 0, 0, 0, None) if bias else (0, 0, 0, 0),
        result_batch_dims=(0,) * n_results,
    )


_RESULTS = {"plain": 1, "row": 3, "rowcol": 5}
MX_GEMM_SM100 = {
    (epilogue, bias): _declaration(
        "jax_mxfp8_mx_gemm_sm100" + ("" if epilogue == "plain" else f"_{epilogue}") + ("_bias" if bias else ""),
        bias,
        _RESULTS[epilogue],
    )
    for epilogue in EPILOGUES
    for bias in (False, True)
}
"""(epilogue, has_bias) -> the declaration of its target: (a, b, sa, sb[, bias]) -> the epilogue's outputs."""


def declaration(variant: registry.MXGemmSm100Config) -> FfiOp:
    return MX_GEMM_SM100[(variant.epilogue, variant.has_bias)]


def _check(a, b, sa, sb, bias) -> None:
    g, m, k = a.shape
    n = b.shape[1]
    for arg, x, rows in (("sa", sa, m), ("sb", sb, n)):
        want = (g, _tiles(rows), _tiles(k), 512)
        if tuple(x.shape) != want or x.dtype != jnp.uint8:
            raise ValueError(f"{arg} must be uint8 {want} (blocked scales), got {x.dtype} {tuple(x.shape)}")
    if bias is not None and (tuple(bias.shape) != (n,) or bias.dtype != jnp.float32):
        raise ValueError(f"bias must be float32 ({n},), got {bias.dtype} {tuple(bias.shape)}")


def mx_gemm_sm100(
    a: jax.Array,
    b: jax.Array,
    sa: jax.Array,
    sb: jax.Array,
    bias: jax.Array | None = None,
    *,
    out_dtype=jnp.bfloat16,
    epilogue: str = "plain",
    activation: str = "",
    path: str,
    cta_group: int | None = None,
    tune: int = 0,
    out: tuple | None = None,
) -> tuple[jax.Array, ...]:
    """The Blackwell MX GEMM of the operands (module docstring): the epilogue's outputs (c[, q, s][, qc, sc]).

    path: "cuda" (the kernel) or "emulated" (its XLA emulation through the same partitioning and batching).
    cta_group: 1 or 2 (default: choose_cta_group). tune: a comparison schedule (built with --with-tunes).
    out: buffers the kernel writes into (aliased; the NaN-poisoning test hooks; no partitioning or batching).
    Raises ValueError naming the argument when the operands do not fit together or no kernel covers them."""
    has_bias = bias is not None
    why = mx_gemm_sm100_unsupported(a.shape, b.shape, a.dtype, b.dtype, out_dtype, has_bias, epilogue, activation)
    if why:
        raise ValueError(f"mx_gemm_sm100: {why}")
    _check(a, b, sa, sb, bias)
    cta_group = cta_group or choose_cta_group(a.shape[1], epilogue)
    variant = find_variant(a.dtype, b.dtype, out_dtype, bias is not None, epilogue, activation, cta_group, tune)
    if variant is None:
        raise ValueError(f"mx_gemm_sm100: no registered variant with cta_group={cta_group}, tune={tune}")
    if path == "cuda":
        library.load_library()  # registers the FFI targets (idempotent)
    decl = declaration(variant)
    args = (a, b, sa, sb) if bias is None else (a, b, sa, sb, bias)
    if out is not None:
        return decl.ffi_into(MXGemmSm100Call(variant), args, tuple(out))
    res = decl.call(MXGemmSm100Call(variant), path, *args)
    return tuple(res) if isinstance(res, (tuple, list)) else (res,)
