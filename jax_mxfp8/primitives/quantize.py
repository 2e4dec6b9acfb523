"""FFI-backed MX quantize / dequantize ops (layer 5): kernel library loading, abstract eval, sharding,
batching, and the fallback to the XLA reference.

Entry points (jax_mxfp8.quantize / dequantize, in jax_mxfp8/ops/quantize.py, forward to these):
  quantize(x, *, axis=-1, block="row", dtype=..., scale_rounding="up", rounding="nearest", rng=None,
           implementation=None) -> MXArray
  quantize_rowcol(x, *, dtype=..., scale_rounding="up", implementation=None) -> (row MXArray, col MXArray)
      one pass over x: row blocks along the last axis AND column blocks along the second-to-last axis.
  dequantize(a, dtype=jnp.float32, *, implementation=None) -> jax.Array
  kernel_available(), library_path()

implementation: None picks the CuTe DSL kernel when the library is built (jax_mxfp8/_lib), the default
backend is a GPU of compute capability 9.x or 10.x, and the kernels cover the arguments; the XLA
reference (jax_mxfp8.formats) otherwise. "xla" always uses the reference. "cuda" uses the kernel or
raises: RuntimeError when the library or a suitable GPU is missing, ValueError when the kernels do not
cover the arguments.

What the kernels cover: float32 / bfloat16 input of rank >= 2 whose last two dimensions are multiples
of 32; row blocks along the last axis (block="row", axis=-1), column blocks along the second-to-last
(block="row", axis=-2), 32x32 square blocks over the last two axes; float8_e4m3fn / float8_e5m2;
scale_rounding "up" / "floor"; rounding="nearest". Leading axes are flattened into rows by the handler.

Sharding: each op is a `custom_partitioning` with a Shardy `sharding_rule` (leading axes free; the last
two axes split as (blocks, 32) compound factors so that they shard only on block boundaries and scales
shard with their data) plus `infer_sharding_from_operands` / `partition` for GSPMD, which keep every
sharded axis whose local size stays a multiple of 32 and replicate the others. Batching:
`jax.custom_batching.custom_vmap` moves the vmapped axis to the front (the kernels flatten it into rows).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_mxfp8.formats import MXArray, element_format
from jax_mxfp8.formats import dequantize as ref_dequantize
from jax_mxfp8.formats import quantize as ref_quantize
from jax_mxfp8.formats.quantize import block_axes, check_blockable
from jax_mxfp8.formats.scales import check_scale_rounding
from jax_mxfp8.kernels import registry

IMPLEMENTATIONS = (None, "xla", "cuda")
LIB_NAME = "libjax_mxfp8_kernels.so"
_TARGETS = (
    "jax_mxfp8_quantize_rowcol",
    "jax_mxfp8_quantize",
    "jax_mxfp8_dequantize",
    "jax_mxfp8_rms_norm_quantize",
    "jax_mxfp8_attention_fwd",
    "jax_mxfp8_attention_fwd_into",
    "jax_mxfp8_attention_fwd_packed",
    "jax_mxfp8_attention_fwd_packed_into",
    "jax_mxfp8_attention_realign",
)
_KERNEL_ARCH_MAJORS = (9, 10)

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None


def library_path() -> Path:
    return Path(__file__).resolve().parent.parent / "_lib" / LIB_NAME


def load_library() -> ctypes.CDLL | None:
    """Loads the kernel library once and registers its FFI targets for platform "CUDA".

    Returns None (and remembers why, see `library_error`) when the library is not built or fails to load.
    """
    global _lib, _lib_error
    with _lock:
        if _lib is not None or _lib_error is not None:
            return _lib
        path = library_path()
        if not path.exists():
            _lib_error = f"{path} is not built (run: python tools/build_library.py)"
            return None
        try:
            lib = ctypes.CDLL(str(path))
            for name in _TARGETS:
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="CUDA")
        except Exception as e:  # noqa: BLE001 - reported through library_error / RuntimeError
            _lib_error = f"loading {path} failed: {type(e).__name__}: {e}"
            return None
        lib.jax_mxfp8_kernel_name.restype = ctypes.c_char_p
        lib.jax_mxfp8_preload.argtypes = [ctypes.c_int]
        _lib = lib
        return lib


def library_error() -> str | None:
    load_library()
    return _lib_error


def kernel_names() -> list[tuple[str, int]]:
    """(variant name, arch major) of every kernel in the built library."""
    lib = load_library()
    if lib is None:
        return []
    return [
        (lib.jax_mxfp8_kernel_name(i).decode(), lib.jax_mxfp8_kernel_arch(i))
        for i in range(lib.jax_mxfp8_kernel_count())
    ]


def _gpu_major() -> int | None:
    try:
        dev = jax.devices()[0]
    except RuntimeError:
        return None
    if dev.platform != "gpu":
        return None
    cc = getattr(dev, "compute_capability", None)
    try:
        return int(str(cc).split(".")[0])
    except ValueError:
        return None


@functools.cache
def _preload() -> None:
    """Loads every kernel module onto each local GPU before first use (so CUDA-graph capture never
    sees a module load)."""
    lib = load_library()
    for dev in jax.local_devices():
        if dev.platform == "gpu":
            rc = lib.jax_mxfp8_preload(int(dev.local_hardware_id if dev.local_hardware_id is not None else dev.id))
            if rc != 0:
                raise RuntimeError(f"jax_mxfp8: loading the kernel modules on {dev} failed (cudaError {rc})")


def kernel_available() -> tuple[bool, str]:
    """(True, "") when the kernels can run on the default backend, else (False, why not)."""
    if load_library() is None:
        return False, f"the jax_mxfp8 kernel library is unavailable: {_lib_error}"
    major = _gpu_major()
    if major is None:
        return False, f"the default JAX backend is {jax.default_backend()!r}, not an NVIDIA GPU"
    if major not in _KERNEL_ARCH_MAJORS:
        return False, f"the GPU has compute capability {major}.x; the kernels are built for sm_90a and sm_100a"
    return True, ""


def _check_implementation(implementation):
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}")


def _use_kernel(implementation, unsupported: str | None, available=None) -> bool:
    """Resolves `implementation` for one call; `unsupported` says why the kernels cannot take it (or None).

    available: the (ok, why) check of the kernel family (default `kernel_available`; the attention kernel
    narrows it to sm_90).
    """
    _check_implementation(implementation)
    if implementation == "xla":
        return False
    ok, why = (available or kernel_available)()
    if implementation == "cuda":
        if not ok:
            raise RuntimeError(f"implementation='cuda' was requested but {why}")
        if unsupported:
            raise ValueError(f"implementation='cuda': {unsupported}")
        _preload()
        return True
    if ok and not unsupported:
        _preload()
        return True
    return False


# ------------------------------------------------------------------------------------ kernel coverage
_MODE_OF = {("row", (-1,)): "row", ("row", (-2,)): "col", ("square", (-2, -1)): "square"}


def _unsupported_quantize(x, axes_neg, block, dtype, scale_rounding, rounding) -> str | None:
    if np.dtype(x.dtype).name not in registry.IN_DTYPES:
        return f"the kernels take float32 / bfloat16 input, got {x.dtype}"
    if rounding != "nearest":
        return "the kernels round to nearest even only (rounding='stochastic' runs in XLA)"
    if x.ndim < 2:
        return "the kernels take arrays of rank >= 2"
    if (block, axes_neg) not in _MODE_OF:
        return (
            "the kernels block along the last axis, the second-to-last, or both (square); "
            f"got block={block!r}, axes={axes_neg}"
        )
    if x.shape[-1] % 32 or x.shape[-2] % 32:
        return f"the kernels need the last two dimensions to be multiples of 32, got shape {x.shape}"
    if (
        registry.find(
            registry.QuantizeConfig,
            in_dtype=np.dtype(x.dtype).name,
            mode=_MODE_OF[(block, axes_neg)],
            elem_dtype=np.dtype(dtype).name,
            scale_rounding=scale_rounding,
        )
        is None
    ):
        return "no registered kernel variant for these arguments"
    return None


# ------------------------------------------------------------------------------------------ FFI calls
def _scale_shape(shape, mode):
    s = list(shape)
    if mode in ("col", "square"):
        s[-2] //= 32
    if mode in ("row", "square"):
        s[-1] //= 32
    return tuple(s)


def _ffi_quantize(x, mode, elem, scale_rounding, tune=0):
    """Kernel call; returns (data, scale) or (row_data, row_scale, col_data, col_scale) for "rowcol"."""
    rounding = np.int32(registry.ROUNDING_CODE[scale_rounding])
    if mode == "rowcol":
        out = (
            jax.ShapeDtypeStruct(x.shape, elem),
            jax.ShapeDtypeStruct(_scale_shape(x.shape, "row"), jnp.uint8),
            jax.ShapeDtypeStruct(x.shape, elem),
            jax.ShapeDtypeStruct(_scale_shape(x.shape, "col"), jnp.uint8),
        )
        return tuple(
            jax.ffi.ffi_call("jax_mxfp8_quantize_rowcol", out)(x, scale_rounding=rounding, tune=np.int32(tune))
        )
    out = (jax.ShapeDtypeStruct(x.shape, elem), jax.ShapeDtypeStruct(_scale_shape(x.shape, mode), jnp.uint8))
    return tuple(
        jax.ffi.ffi_call("jax_mxfp8_quantize", out)(x, mode=np.int32(registry.MODE_CODE[mode]), scale_rounding=rounding)
    )


def _xla_quantize(x, mode, elem, scale_rounding, tune=0):
    """The same outputs as _ffi_quantize from the reference (used by tests of the sharding plumbing)."""
    kw = dict(dtype=elem, scale_rounding=scale_rounding)
    if mode == "rowcol":
        r, c = ref_quantize(x, axis=-1, **kw), ref_quantize(x, axis=-2, **kw)
        return (r.data, r.scale, c.data, c.scale)
    q = (
        ref_quantize(x, axis=(-2, -1), block="square", **kw)
        if mode == "square"
        else ref_quantize(x, axis=-1 if mode == "row" else -2, **kw)
    )
    return (q.data, q.scale)


def _ffi_dequantize(data, scale, block, out_dtype):
    out = jax.ShapeDtypeStruct(data.shape, out_dtype)
    return jax.ffi.ffi_call("jax_mxfp8_dequantize", out)(data, scale, block=np.int32(registry.MODE_CODE[block]))


def _xla_dequantize(data, scale, block, out_dtype):
    axes = {"row": (-1,), "col": (-2,), "square": (-2, -1)}[block]
    a = MXArray(data=data, scale=scale, axes=axes, block="square" if block == "square" else "row")
    return ref_dequantize(a, out_dtype)


# ------------------------------------------------------------------------------------------- sharding
def _sanitize_spec(spec, shape, mesh) -> tuple:
    """A PartitionSpec entry per dimension that the kernels accept: the last two dimensions keep their
    sharding only while the local size stays a multiple of 32; leading dimensions keep theirs."""
    spec = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
    out = list(spec[: len(shape)])
    for d in (len(shape) - 2, len(shape) - 1):
        names = out[d]
        if names is None:
            continue
        n = int(np.prod([mesh.shape[a] for a in (names if isinstance(names, tuple) else (names,))]))
        if shape[d] % n or (shape[d] // n) % 32:
            out[d] = None
    return tuple(out)


def _named(mesh, spec):
    return NamedSharding(mesh, P(*spec))


def _dims(rank, modes):
    """Factor names of a data array's dims: leading b0.., then `m` / `k`, written as the compound
    (m r) / (k c) (r = c = 32, the block size) only when some scale blocks that dim."""
    lead = [f"b{i}" for i in range(rank - 2)]
    rows = "(m r)" if any(m in ("col", "square") for m in modes) else "m"
    cols = "(k c)" if any(m in ("row", "square") for m in modes) else "k"
    return lead, rows, cols


def _sharding_rule(rank, modes, n_in=1, out_data=True):
    """Shardy rule for data (rank `rank`) and one scale per mode: scales carry the block-count factor
    alone on blocked dims, so blocked dims shard only on block boundaries and scales shard with data."""
    lead, rows, cols = _dims(rank, modes)
    full = " ".join([*lead, rows, cols])

    def scale(mode):
        r = "m" if mode in ("col", "square") else rows
        c = "k" if mode in ("row", "square") else cols
        return " ".join([*lead, r, c])

    factor_sizes = {n: 32 for n, d in (("r", rows), ("c", cols)) if "(" in d}
    if n_in == 1:
        outs = []
        for mode in modes:
            outs += [full, scale(mode)]
        return f"{full} -> {', '.join(outs)}", factor_sizes
    return f"{full}, {scale(modes[0])} -> {full}", factor_sizes


@functools.cache
def _quantize_op(mode: str, elem: str, scale_rounding: str, impl: str, tune: int = 0):
    """custom_vmap(custom_partitioning(kernel call)) for one static configuration (`tune` > 0 selects a
    benchmark-only tuning of the bf16 row+col kernel, see registry.TUNING_VARIANTS)."""
    body = _ffi_quantize if impl == "cuda" else _xla_quantize
    modes = ("row", "col") if mode == "rowcol" else (mode,)
    elem_dt = jnp.dtype(elem)

    def fn(x):
        return body(x, mode, elem_dt, scale_rounding, tune)

    def shardings(mesh, arg_shapes):
        x = arg_shapes[0]
        spec = _sanitize_spec(x.sharding.spec, x.shape, mesh)
        outs = []
        for _ in modes:
            outs += [_named(mesh, spec), _named(mesh, spec)]  # scale dims: same mesh axes, blocks divide
        return _named(mesh, spec), tuple(outs)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[1]

    def partition(mesh, arg_shapes, result_shape):
        arg, outs = shardings(mesh, arg_shapes)
        return mesh, fn, outs, (arg,)

    # A string sharding rule fixes the rank: one custom_partitioning object per rank, built lazily.
    @functools.cache
    def op_for_rank(rank):
        c = custom_partitioning(fn)
        rule, sizes = _sharding_rule(rank, modes)
        c.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule, **sizes)
        return c

    @jax.custom_batching.custom_vmap
    def op(x):
        return op_for_rank(x.ndim)(x)

    @op.def_vmap
    def _vmap(axis_size, in_batched, x):
        (batched,) = in_batched
        out = op(x)  # x arrives with the vmapped axis at 0: the kernels flatten it into rows
        return out, tuple([batched] * len(out))

    return op


@functools.cache
def _dequantize_op(block: str, out_dtype: str, impl: str):
    body = _ffi_dequantize if impl == "cuda" else _xla_dequantize
    out_dt = jnp.dtype(out_dtype)

    def fn(data, scale):
        return body(data, scale, block, out_dt)

    def shardings(mesh, arg_shapes):
        d = arg_shapes[0]
        spec = _sanitize_spec(d.sharding.spec, d.shape, mesh)
        return (_named(mesh, spec), _named(mesh, spec)), _named(mesh, spec)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[1]

    def partition(mesh, arg_shapes, result_shape):
        args, out = shardings(mesh, arg_shapes)
        return mesh, fn, out, args

    @functools.cache
    def op_for_rank(rank):
        rule, sizes = _sharding_rule(rank, (block,), n_in=2)
        c = custom_partitioning(fn)
        c.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule, **sizes)
        return c

    @jax.custom_batching.custom_vmap
    def op(data, scale):
        return op_for_rank(data.ndim)(data, scale)

    @op.def_vmap
    def _vmap(axis_size, in_batched, data, scale):
        if not all(in_batched):
            data = data if in_batched[0] else jnp.broadcast_to(data, (axis_size, *data.shape))
            scale = scale if in_batched[1] else jnp.broadcast_to(scale, (axis_size, *scale.shape))
        return op(data, scale), True

    return op


# ---------------------------------------------------------------------------------------- public API
def quantize(
    x,
    *,
    axis=-1,
    block: str = "row",
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    rounding: str = "nearest",
    rng=None,
    implementation: str | None = None,
    _impl_override: str | None = None,
) -> MXArray:
    """jax_mxfp8.quantize with an `implementation` switch (see the module docstring)."""
    _check_implementation(implementation)
    x = jnp.asarray(x)
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    if rounding == "nearest" and rng is not None:
        raise ValueError("rng was given but rounding='nearest'; pass rounding='stochastic' to use it")
    axes = block_axes(x.ndim, axis, block) if x.ndim else ()
    axes_neg = tuple(a - x.ndim for a in axes)
    why = _unsupported_quantize(x, axes_neg, block, fmt.dtype, scale_rounding, rounding) if x.ndim else "rank 0"
    if _impl_override is None and not _use_kernel(implementation, why):
        return ref_quantize(
            x, axis=axis, block=block, dtype=dtype, scale_rounding=scale_rounding, rounding=rounding, rng=rng
        )
    check_blockable(x.shape, axes)
    mode = _MODE_OF[(block, axes_neg)]
    x = jax.lax.stop_gradient(x)  # like the reference: not differentiable (zero gradient)
    data, scale = _quantize_op(mode, fmt.dtype.name, scale_rounding, _impl_override or "cuda")(x)
    return MXArray(data=data, scale=scale, axes=axes_neg, block=block)


def quantize_rowcol(
    x,
    *,
    dtype=jnp.float8_e4m3fn,
    scale_rounding: str = "up",
    implementation: str | None = None,
    _impl_override: str | None = None,
) -> tuple[MXArray, MXArray]:
    """(quantize(x, axis=-1), quantize(x, axis=-2)) from one pass over x on the kernel path.

    Bit-identical to the two reference calls. x: rank >= 2, last two dimensions multiples of 32.
    """
    _check_implementation(implementation)
    x = jnp.asarray(x)
    fmt = element_format(dtype)
    check_scale_rounding(scale_rounding)
    if x.ndim < 2:
        raise ValueError(f"quantize_rowcol needs an array of rank >= 2, got shape {x.shape}")
    check_blockable(x.shape, (x.ndim - 2, x.ndim - 1))
    why = _unsupported_quantize(x, (-1,), "row", fmt.dtype, scale_rounding, "nearest")
    if _impl_override is None and not _use_kernel(implementation, why):
        kw = dict(dtype=dtype, scale_rounding=scale_rounding)
        return ref_quantize(x, axis=-1, **kw), ref_quantize(x, axis=-2, **kw)
    x = jax.lax.stop_gradient(x)
    rd, rs, cd, cs = _quantize_op("rowcol", fmt.dtype.name, scale_rounding, _impl_override or "cuda")(x)
    return (MXArray(data=rd, scale=rs, axes=(-1,), block="row"), MXArray(data=cd, scale=cs, axes=(-2,), block="row"))


def dequantize(
    a: MXArray, dtype=jnp.float32, *, implementation: str | None = None, _impl_override: str | None = None
) -> jax.Array:
    """jax_mxfp8.dequantize with an `implementation` switch."""
    _check_implementation(implementation)
    if not isinstance(a, MXArray):
        raise ValueError(f"a must be an MXArray, got {type(a).__name__}")
    block = {("row", (-1,)): "row", ("row", (-2,)): "col", ("square", (-2, -1)): "square"}.get(
        (a.block, tuple(sorted(a.axes)))
    )
    out_name = np.dtype(dtype).name
    why = None
    if a.ndim < 2 or block is None:
        why = f"the kernels dequantize blocks along the last axis, the second-to-last, or both; got {a!r}"
    elif (
        out_name not in registry.IN_DTYPES
        or registry.find(registry.DequantizeConfig, elem_dtype=np.dtype(a.dtype).name, block=block, out_dtype=out_name)
        is None
    ):
        why = f"no dequantize kernel for {np.dtype(a.dtype).name} -> {out_name}"
    elif a.shape[-1] % 32 or a.shape[-2] % 32:
        why = f"the kernels need the last two dimensions to be multiples of 32, got shape {a.shape}"
    if _impl_override is None and not _use_kernel(implementation, why):
        return ref_dequantize(a, dtype)
    return _dequantize_op(block, out_name, _impl_override or "cuda")(a.data, a.scale)
