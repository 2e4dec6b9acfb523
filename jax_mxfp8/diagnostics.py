"""What runs here: versions, the kernel library, the GPU, and the implementation each public op takes.

`python -m jax_mxfp8` runs `main()`: it prints the report section by section as each is built
(`report_lines()`), so whatever can be known is printed before anything fails. `python -m jax_mxfp8
--self-test` prints the versions, library and device sections, then runs the first-use self-test of every
kernel family that has not run on hardware here (primitives/self_test.py: the Blackwell kernels) and prints
their report, a text to paste into an issue; it exits 1 when a family failed. The per-op lines come from
tracing a typical call of each public op with implementation=None under `jax.eval_shape` (nothing is
computed or compiled) and reading the decision `jax_mxfp8.primitives.implementation.resolve` made for
it, so they state what the op itself does on this machine, not a re-derivation of its rules. When no JAX
backend starts (e.g. JAX_PLATFORMS=cuda without the CUDA plugin or a visible GPU) the devices section says
why, the ops are not traced, and `main()` returns 1.

  versions() -> dict[str, str]          distribution -> version (absent ones omitted)
  library_status() -> LibraryStatus     the kernel library: path, loaded or why not, targets, kernels
  backend_error() -> str | None         why no JAX backend starts (None when one does)
  device_lines() -> list[str]           the default backend and its first device (GPU: compute capability)
  op_decisions() -> list[OpDecision]    a typical call per public op and the path it takes, and why
  report_lines() -> Iterator[str]       all of the above as lines, built one section at a time
  report() -> str                       the same, as one text
  self_test_lines() -> Iterator[str]    the self-test report (runs every family's self-test now)
  main(argv) -> int                     prints report_lines() (or, --self-test, the self-test report) as they
                                        come; 0, or 1 without a backend / with a failed self-test
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import os
import platform
import sys
import warnings
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library, self_test

DISTRIBUTIONS = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_dtypes")
"""Distributions whose versions the report lists (plus every installed jax CUDA plugin)."""

_FORWARD_ONLY = ("rms_norm_quantize",)
"""Ops whose kernel computes the forward pass only (their gradients run the XLA reference)."""
_BACKWARD_KERNEL = ("dot_product_attention", "dot_product_attention_vjp", "varlen_attention")
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


def arch_lines() -> list[str]:
    """Which cubin serves which compute capability (registry.ARCH_CCS), and the unsupported ones."""
    lines = []
    for arch, ccs in registry.ARCH_CCS.items():
        served = ", ".join(registry.cc_name(cc) for cc in ccs)
        family = " (the family target: one cubin for every one of them)" if len(ccs) > 1 else ""
        lines.append(f"{arch} cubins serve compute capability {served}{family}")
    for major, why in registry.UNSUPPORTED_CCS.items():
        lines.append(f"compute capability {major}.x: {why}")
    return lines


def library_status() -> LibraryStatus:
    lib = library.load_library()
    counts = collections.Counter(arch for archs in library.kernel_targets().values() for arch in archs)
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


def backend_error() -> str | None:
    """Why no JAX backend starts, or None when the default backend does.

    jax.devices() raises RuntimeError when a platform named in JAX_PLATFORMS fails to initialise (e.g. a
    GPU without the CUDA plugin), and an AssertionError without a message when it skips every named platform
    (jax skips "cuda" when no NVIDIA GPU is visible): both mean no backend, and the reason says what was
    asked for and which jax CUDA plugins are installed.
    """
    try:
        jax.devices()
    except (RuntimeError, AssertionError) as e:
        detail = str(e) or "no platform it names could start here (jax skips 'cuda' without a visible NVIDIA GPU)"
        plugins = [name for name in versions() if name.startswith("jax-cuda")] or ["none installed"]
        return (
            f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')!r}: {detail}; jax CUDA plugins: "
            f"{', '.join(plugins)}. Fix: unset JAX_PLATFORMS (or set it to 'cpu'), or install the CUDA plugin "
            "(pip install 'jax[cuda12]' or 'jax[cuda13]') on a machine with an NVIDIA GPU"
        )
    return None


def device_lines() -> list[str]:
    """The default backend and its devices; for a GPU its kind, compute capability and kernel arch."""
    why = backend_error()
    if why is not None:
        return [f"no JAX backend: {why}"]
    devices = jax.devices()
    dev = devices[0]
    lines = [f"default backend: {jax.default_backend()} ({len(devices)} device{'s' * (len(devices) != 1)})"]
    cc = getattr(dev, "compute_capability", None)
    forced = library.forced_cc()
    if forced is not None:
        arch = registry.arch_for_cc(forced)
        served = f"served by the {arch} cubins, emulated" if arch else "no kernels for it"
        lines.append(f"forced: compute capability {registry.cc_name(forced)} (library.forced_gpu: {served})")
    elif dev.platform == "gpu" and cc is not None:
        gpu_cc = library.gpu_cc()
        arch = registry.arch_for_cc(gpu_cc) if gpu_cc else None
        if arch:
            built = f"served by the {arch} cubins"
        elif gpu_cc and gpu_cc[0] in registry.UNSUPPORTED_CCS:
            built = "not supported: every op runs its XLA reference"
        else:
            built = "no kernels for this compute capability: every op runs its XLA reference"
        lines.append(f"device 0: {dev.device_kind}, compute capability {cc} ({built})")
    else:
        lines.append(f"device 0: {dev.device_kind} (no NVIDIA GPU: every op runs its XLA reference)")
    return lines


def _typical_calls():
    """(op, call text, thunk, the op name its decision is recorded under) per public op: the thunk makes the
    call on abstract bf16 arguments."""
    import jax_mxfp8 as jm
    from jax_mxfp8.formats import quantize as ref_quantize
    from jax_mxfp8.ops.attention_grads import dot_product_attention_vjp
    from jax_mxfp8.ops.mx_dot_quantized import mx_dot_general_quantized

    bf16 = jnp.bfloat16
    x = jax.ShapeDtypeStruct((4096, 4096), bf16)
    w = jax.ShapeDtypeStruct((4096,), bf16)
    q = jax.ShapeDtypeStruct((4, 1024, 16, 128), bf16)
    kv = jax.ShapeDtypeStruct((4, 1024, 4, 128), bf16)
    q1 = jax.ShapeDtypeStruct((1024, 16, 128), bf16)
    pq = jax.ShapeDtypeStruct((4096, 16, 128), bf16)
    pkv = jax.ShapeDtypeStruct((4096, 4, 128), bf16)
    cu = jax.ShapeDtypeStruct((5,), jnp.int32)
    dn = (((1,), (0,)), ((), ()))

    def attention_vjp(a, b, c):
        out, vjp = dot_product_attention_vjp(a, b, c, is_causal=True)
        return vjp(out)

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
            "mx_dot_general_quantized",
            "mx_dot_general_quantized(bfloat16[4096,4096], bfloat16[4096,4096], activation='gelu', "
            "orientations=('row', 'wgrad'))",
            lambda: jax.eval_shape(
                lambda a, b: mx_dot_general_quantized(
                    a, b, dn, activation="gelu", preferred_element_type=bf16, orientations=("row", "wgrad")
                ),
                x,
                x,
            ),
        ),
        (
            "dot_product_attention",
            "dot_product_attention(q bfloat16[4,1024,16,128], k/v [4,1024,4,128], is_causal=True)",
            lambda: jax.eval_shape(lambda a, b, c: jm.dot_product_attention(a, b, c, is_causal=True), q, kv, kv),
        ),
        (
            "dot_product_attention_vjp",
            "dot_product_attention_vjp(q bfloat16[4,1024,16,128], k/v [4,1024,4,128], is_causal=True), its vjp",
            lambda: jax.eval_shape(attention_vjp, q, kv, kv),
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
        (
            "broadcast_query_attention",
            "broadcast_query_attention(q bfloat16[1024,16,128], k/v [4096,4,128] packed, 4 sequences <= 2048)",
            lambda: jax.eval_shape(
                lambda a, b, c, ck: jm.broadcast_query_attention(a, b, c, ck, max_seqlen_k=2048), q1, pkv, pkv, cu
            ),
        ),
    ]


_RECORDED_AS = {"dot_product_attention_vjp": "dot_product_attention"}
"""Ops whose decision is the one of the op they call (the vjp's forward and backward are
dot_product_attention's; its MX gradients' quantize decides for itself and is reported with it)."""


def _decision(op: str, call: str, decisions) -> OpDecision:
    mine = [d for d in decisions if d.op == _RECORDED_AS.get(op, op)]
    if not mine:  # the op never asked the kernel policy
        return OpDecision(op, call, "xla", "no implementation decision recorded: the XLA reference")
    d = mine[0]
    reason = d.reason or "the CuTe DSL kernel covers the call and runs on this GPU"
    if d.path == "cuda" and op in _FORWARD_ONLY:
        reason += " (forward pass; the backward runs the XLA reference)"
    if d.path == "cuda" and op in _BACKWARD_KERNEL:
        reason += " (backward: the backward kernel where the library holds a variant for it, else the XLA reference)"
    if op == "mx_dot_general_quantized" and d.path == "xla":
        reason += " (the two-pass path: mx_dot_general, then quantize, each choosing its own implementation)"
    if op == "dot_product_attention_vjp":
        grads = [g for g in decisions if g.op == "quantize_rowcol"]
        if grads:
            reason += f"; dK, dV quantized (row and column blocks) by: {grads[0].path}"
            reason += f" ({grads[0].reason})" if grads[0].reason else " (the quantize_rowcol kernel)"
    return OpDecision(op, call, d.path, reason)


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
        out.append(_decision(op, call, decisions))
    return out


def report_lines() -> Iterator[str]:
    """The report, one section at a time (versions first: they never need a backend)."""
    yield from ["jax_mxfp8 diagnostics", "", "versions"]
    yield from (f"  {name:<18} {version}" for name, version in versions().items())
    st = library_status()
    yield from ["", "kernel library", f"  path               {st.path}"]
    yield from (f"  {'archs' if i == 0 else '':<18} {line}" for i, line in enumerate(arch_lines()))
    if st.loaded:
        per_arch = ", ".join(f"{n} for {arch}" for arch, n in st.kernels_per_arch) or "none"
        yield f"  status             loaded: {len(st.targets)} FFI targets, kernels: {per_arch}"
        note = f" ({st.binding_note})" if st.binding_note else ""
        yield f"  binding            {st.binding}{note}"
        if st.build_info:
            yield "  built with         " + ", ".join(f"{k} {v}" for k, v in st.build_info)
    else:
        yield f"  status             NOT loaded: {st.error}"
        yield f"  fix                {impl.FIX_LIBRARY}"
    yield from ["", "devices"]
    yield from (f"  {line}" for line in device_lines())
    yield from ["", "ops: the implementation a typical call takes with implementation=None"]
    if backend_error() is not None:
        yield "  not traced: no JAX backend (devices, above)"
        return
    for d in op_decisions():
        yield f"  {d.op:<25} -> {d.path:<5} {d.call}"
        yield f"  {'':<25}    why: {d.reason}"
    yield from ["", "first-use self-tests (python -m jax_mxfp8 --self-test runs them now)"]
    for name in self_test.families():
        yield f"  {name:<26} {self_test.status(name)}"


def report() -> str:
    """The text `python -m jax_mxfp8` prints."""
    return "\n".join(report_lines())


def self_test_lines() -> Iterator[str]:
    """Versions, library, devices, then every family's self-test, run now (python -m jax_mxfp8 --self-test)."""
    lines = report_lines()
    for line in lines:  # everything up to the ops section (which traces every op: not needed here)
        if line.startswith("ops:"):
            break
        yield line
    reports = self_test.run_all()
    yield from ("", *self_test.report_text(reports).splitlines())


def main(argv: list[str] | None = None) -> int:
    """Prints the report (or, with --self-test, the self-test report) line by line as it is built; 1 when no
    JAX backend starts or a self-test failed, else 0."""
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    unknown = [a for a in args if a != "--self-test"]
    if unknown:
        print(f"jax_mxfp8: unknown arguments {unknown}; usage: python -m jax_mxfp8 [--self-test]", file=sys.stderr)
        return 2
    why = backend_error()
    if "--self-test" in args:
        failed = False
        for line in self_test_lines():
            print(line, flush=True)
            failed |= "-> this family is disabled" in line
        return 1 if failed or why is not None else 0
    for line in report_lines():
        print(line, flush=True)
    if why is not None:
        print(f"\njax_mxfp8: no JAX backend, so no op was traced: {why}", file=sys.stderr, flush=True)
        return 1
    return 0
