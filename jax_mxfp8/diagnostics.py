"""What runs here: versions, the kernel library, the GPU, and the implementation each public op takes.

`python -m jax_mxfp8` prints `report()`. The per-op lines come from tracing a typical call of each public
op with implementation=None under `jax.eval_shape` (nothing is computed or compiled) and reading the
decision `jax_mxfp8.primitives.implementation.resolve` made for it, so they state what the op itself does
on this machine, not a re-derivation of its rules.

  versions() -> dict[str, str]          distribution -> version (absent ones omitted)
  library_status() -> LibraryStatus     the kernel library: path, loaded or why not, targets, kernels
  device_lines() -> list[str]           the default backend and its first device (GPU: compute capability)
  op_decisions() -> list[OpDecision]    a typical call per public op and the path it takes, and why
  report() -> str                       all of the above as text
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import platform
import sys
import warnings

import jax
import jax.numpy as jnp

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library

DISTRIBUTIONS = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_dtypes")
"""Distributions whose versions the report lists (plus every installed jax CUDA plugin)."""

_ARCH_OF_MAJOR = {m: a for a, m in registry.ARCH_MAJOR.items()}
_FORWARD_ONLY = ("rms_norm_quantize",)
"""Ops whose kernel computes the forward pass only (their gradients run the XLA reference)."""
_BACKWARD_KERNEL = ("dot_product_attention", "varlen_attention")
"""Ops whose backward takes its own kernel where a variant covers the call (ops/attention_bwd_kernel.py)."""


@dataclasses.dataclass(frozen=True)
class LibraryStatus:
    """The kernel library as this process sees it."""

    path: str
    loaded: bool
    error: str | None
    binding: str  # how the FFI targets were found: "pybind11 extension" or "ctypes" ("" when not loaded)
    binding_note: str  # why the extension was not used ("" when it was)
    build_info: tuple[tuple[str, str], ...]
    targets: tuple[str, ...]
    kernels_per_arch: tuple[tuple[str, int], ...]  # (arch, number of kernel variants built for it)


@dataclasses.dataclass(frozen=True)
class OpDecision:
    """The implementation a typical call of one public op takes with implementation=None."""

    op: str
    call: str  # the typical call, e.g. "quantize(bfloat16[4096,4096], axis=-1)"
    path: str  # "cuda" (the kernel), "xla" (the reference), "cudnn" (mx_dot_general on Blackwell)
    reason: str


def versions() -> dict[str, str]:
    """Installed versions of the distributions jax_mxfp8 depends on, and of any jax CUDA plugin."""
    out = {"python": f"{platform.python_version()} ({sys.executable})"}
    from jax_mxfp8 import __version__

    out["jax_mxfp8"] = __version__
    for name in DISTRIBUTIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("jax-cuda") and name not in out:
            out[name] = dist.version
    return out


def library_status() -> LibraryStatus:
    lib = library.load_library()
    counts = collections.Counter(_ARCH_OF_MAJOR.get(major, f"major {major}") for _, major in library.kernel_names())
    return LibraryStatus(
        path=str(library.library_path()),
        loaded=lib is not None,
        error=library.library_error(),
        binding=library.binding() if lib is not None else "",
        binding_note=library.extension_note() if lib is not None else "",
        build_info=tuple(library.build_info().items()),
        targets=tuple(library.ffi_targets()),
        kernels_per_arch=tuple(sorted(counts.items())),
    )


def device_lines() -> list[str]:
    """The default backend and its devices; for a GPU its kind, compute capability and kernel arch."""
    try:
        devices = jax.devices()
    except RuntimeError as e:
        return [f"no JAX backend: {e}"]
    dev = devices[0]
    lines = [f"default backend: {jax.default_backend()} ({len(devices)} device{'s' * (len(devices) != 1)})"]
    cc = getattr(dev, "compute_capability", None)
    if dev.platform == "gpu" and cc is not None:
        major = library.gpu_major()
        arch = _ARCH_OF_MAJOR.get(major)
        built = f"kernels built for it: {arch}" if arch else f"no kernels for compute capability {major}.x"
        lines.append(f"device 0: {dev.device_kind}, compute capability {cc} ({built})")
    else:
        lines.append(f"device 0: {dev.device_kind} (no NVIDIA GPU: every op runs its XLA reference)")
    return lines


def _typical_calls():
    """(op, call text, thunk) per public op: the thunk makes the call on abstract bf16 arguments."""
    import jax_mxfp8 as jm
    from jax_mxfp8.formats import quantize as ref_quantize

    bf16 = jnp.bfloat16
    x = jax.ShapeDtypeStruct((4096, 4096), bf16)
    w = jax.ShapeDtypeStruct((4096,), bf16)
    q = jax.ShapeDtypeStruct((4, 1024, 16, 128), bf16)
    kv = jax.ShapeDtypeStruct((4, 1024, 4, 128), bf16)
    pq = jax.ShapeDtypeStruct((4096, 16, 128), bf16)
    pkv = jax.ShapeDtypeStruct((4096, 4, 128), bf16)
    cu = jax.ShapeDtypeStruct((5,), jnp.int32)
    dn = (((1,), (0,)), ((), ()))
    return [
        ("quantize", "quantize(bfloat16[4096,4096], axis=-1)", lambda: jax.eval_shape(lambda a: jm.quantize(a), x)),
        (
            "dequantize",
            "dequantize(MXArray e4m3 [4096,4096] row blocks, float32)",
            lambda: jax.eval_shape(lambda a: jm.dequantize(ref_quantize(a)), x),
        ),
        (
            "rms_norm_quantize",
            "rms_norm_quantize(bfloat16[4096,4096], bfloat16[4096])",
            lambda: jax.eval_shape(lambda a, b: jm.rms_norm_quantize(a, b), x, w),
        ),
        (
            "mx_dot_general",
            "mx_dot_general(bfloat16[4096,4096], bfloat16[4096,4096])",
            lambda: jax.eval_shape(lambda a, b: jm.mx_dot_general(a, b, dn), x, x),
        ),
        (
            "dot_product_attention",
            "dot_product_attention(q bfloat16[4,1024,16,128], k/v [4,1024,4,128], is_causal=True)",
            lambda: jax.eval_shape(lambda a, b, c: jm.dot_product_attention(a, b, c, is_causal=True), q, kv, kv),
        ),
        (
            "varlen_attention",
            "varlen_attention(q bfloat16[4096,16,128] packed, k/v [4096,4,128], 4 sequences <= 2048, causal)",
            lambda: jax.eval_shape(
                lambda a, b, c, cq, ck: jm.varlen_attention(
                    a, b, c, cq, ck, max_seqlen_q=2048, max_seqlen_k=2048, is_causal=True
                ),
                pq,
                pkv,
                pkv,
                cu,
                cu,
            ),
        ),
    ]


def op_decisions() -> list[OpDecision]:
    """The path a typical call of each public op takes with implementation=None, and why."""
    out = []
    for op, call, thunk in _typical_calls():
        with impl.record() as decisions, warnings.catch_warnings():
            warnings.simplefilter("ignore", impl.KernelFallbackWarning)
            try:
                thunk()
            except Exception as e:  # noqa: BLE001 - a diagnostics tool reports, it does not raise
                out.append(OpDecision(op, call, "error", f"{type(e).__name__}: {e}"))
                continue
        mine = [d for d in decisions if d.op == op]
        if not mine:  # the op never asked the kernel policy
            out.append(OpDecision(op, call, "xla", "no implementation decision recorded: the XLA reference"))
            continue
        d = mine[0]
        reason = d.reason or "the CuTe DSL kernel covers the call and runs on this GPU"
        if d.path == "cuda" and op in _FORWARD_ONLY:
            reason += " (forward pass; the backward runs the XLA reference)"
        if d.path == "cuda" and op in _BACKWARD_KERNEL:
            reason += (
                " (backward: the backward kernel where the library holds a variant for it, else the XLA reference)"
            )
        out.append(OpDecision(op, call, d.path, reason))
    return out


def report() -> str:
    """The text `python -m jax_mxfp8` prints."""
    lines = ["jax_mxfp8 diagnostics", "", "versions"]
    lines += [f"  {name:<18} {version}" for name, version in versions().items()]
    st = library_status()
    lines += ["", "kernel library", f"  path               {st.path}"]
    if st.loaded:
        per_arch = ", ".join(f"{n} for {arch}" for arch, n in st.kernels_per_arch) or "none"
        lines.append(f"  status             loaded: {len(st.targets)} FFI targets, kernels: {per_arch}")
        note = f" ({st.binding_note})" if st.binding_note else ""
        lines.append(f"  binding            {st.binding}{note}")
        if st.build_info:
            lines.append("  built with         " + ", ".join(f"{k} {v}" for k, v in st.build_info))
    else:
        lines.append(f"  status             NOT loaded: {st.error}")
        lines.append(f"  fix                {impl.FIX_LIBRARY}")
    lines += ["", "devices"] + [f"  {line}" for line in device_lines()]
    lines += ["", "ops: the implementation a typical call takes with implementation=None"]
    for d in op_decisions():
        lines.append(f"  {d.op:<22} -> {d.path:<5} {d.call}")
        lines.append(f"  {'':<22}    why: {d.reason}")
    return "\n".join(lines)
