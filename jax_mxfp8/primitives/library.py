"""The kernel library (jax_mxfp8/_lib/libjax_mxfp8_kernels.so): loading, FFI registration, device checks.

The library is a plain shared object with an extern "C" ABI (csrc/library.cc): it reports the FFI targets it
defines and the kernel variants it holds, so registration follows what was built, never a hand-kept list.
It is loaded once per process; every reported target is registered for platform "CUDA". The FFI
targets come from the pybind11 extension built next to it for this Python version
(_jax_mxfp8_ext.<abi>.so, csrc/python/extension.cc: registrations() = name -> capsule, kernels(),
build_info()) when it imports, else from by-name ctypes symbol lookups (a library built without the
extension, another Python version, or JAX_MXFP8_NO_EXTENSION=1).

  load_library() -> ctypes.CDLL | None     load + register once; None (see library_error) if absent/broken
  library_error() -> str | None           why the library is unavailable
  binding() -> str                        how its FFI targets were found: "pybind11 extension" or "ctypes"
  extension_note() -> str                 why the extension was not used ("" when it was)
  build_info() -> dict[str, str]          what the library was built from (FFI API, jaxlib, DSL, CUDA)
  library_path() -> Path
  extension_path() -> Path                the extension for this interpreter's ABI (built or not)
  ffi_targets() -> list[str]              the FFI targets the loaded library defines
  kernel_names() -> list[(name, major)]   every kernel variant in the library and its arch major
  has_kernel(name) -> bool                the library holds that variant (comparison schedules only with
                                          tools/build_library.py --with-tunes)
  kernel_targets() -> dict[str, str]      variant name -> the cubin targets it is built for ("sm_90a", ...)
  gpu_present() -> bool                   the default backend is an NVIDIA GPU (any arch)
  gpu_cc() -> (major, minor) | None       compute capability of the default backend's first device
  gpu_major() -> int | None               its major
  gpu_arch() -> str | None                the library arch whose cubins load there (registry.arch_for_cc)
  kernels_runnable(archs) -> (ok, why)    library loaded and the GPU's compute capability served by `archs`
  preload()                               load every module onto each local GPU (before CUDA-graph capture)
  forced_gpu(cc)                          context manager: answer the above as on a GPU of compute capability
                                          cc with the library built (dispatch tests on any machine; the
                                          implementation policy then runs every kernel it picks emulated)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import sysconfig
import threading
from pathlib import Path

import jax

from jax_mxfp8.kernels import registry

LIB_NAME = "libjax_mxfp8_kernels.so"
EXT_NAME = "_jax_mxfp8_ext"
NO_EXTENSION_ENV = "JAX_MXFP8_NO_EXTENSION"

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None
_targets: tuple[str, ...] = ()
_ext = None
_ext_note = ""
_forced_cc: tuple[int, int] | None = None
_forced_self_tests = False


def library_path() -> Path:
    return Path(__file__).resolve().parent.parent / "_lib" / LIB_NAME


def extension_path() -> Path:
    """The pybind11 extension for this interpreter's ABI, next to the library (it may not be built)."""
    return library_path().parent / f"{EXT_NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"


def _reported_targets(lib: ctypes.CDLL) -> tuple[str, ...]:
    lib.jax_mxfp8_ffi_target_name.restype = ctypes.c_char_p
    return tuple(lib.jax_mxfp8_ffi_target_name(i).decode() for i in range(lib.jax_mxfp8_ffi_target_count()))


def ctypes_registrations(lib: ctypes.CDLL) -> dict:
    """FFI target name -> PyCapsule of its handler, by name through ctypes (the fallback binding)."""
    return {name: jax.ffi.pycapsule(getattr(lib, name)) for name in _reported_targets(lib)}


def _import_extension():
    """(module, "") when the extension for this Python imports, else (None, why not)."""
    if os.environ.get(NO_EXTENSION_ENV, "") not in ("", "0"):
        return None, f"{NO_EXTENSION_ENV} is set"
    path = extension_path()
    if not path.exists():
        return None, f"no pybind11 extension for this Python ({path.name})"
    try:
        spec = importlib.util.spec_from_file_location(EXT_NAME, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the ctypes path takes over
        return None, f"importing {path.name} failed: {type(e).__name__}: {e}"
    return module, ""


def load_library() -> ctypes.CDLL | None:
    """Loads the kernel library once and registers the FFI targets it reports for platform "CUDA".

    Returns None (and remembers why, see `library_error`) when the library is not built or fails to load.
    """
    global _lib, _lib_error, _targets, _ext, _ext_note
    with _lock:
        if _lib is not None or _lib_error is not None:
            return _lib
        path = library_path()
        if not path.exists():
            _lib_error = f"{path} is not built (run: python tools/build_library.py)"
            return None
        try:
            ext, note = _import_extension()  # loads the library (NEEDED, rpath $ORIGIN) when it imports
            lib = ctypes.CDLL(str(path))  # the same loaded copy: for preload and the kernel table
            registrations = ext.registrations() if ext is not None else ctypes_registrations(lib)
            for name, capsule in registrations.items():
                jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
            targets = tuple(registrations)
        except Exception as e:  # noqa: BLE001 - reported through library_error / RuntimeError
            _lib_error = f"loading {path} failed: {type(e).__name__}: {e}"
            return None
        lib.jax_mxfp8_kernel_name.restype = ctypes.c_char_p
        lib.jax_mxfp8_preload.argtypes = [ctypes.c_int]
        _lib, _targets, _ext, _ext_note = lib, targets, ext, note
        return lib


def library_error() -> str | None:
    load_library()
    return _lib_error


def binding() -> str:
    """How the loaded library's FFI targets were found: "pybind11 extension" or "ctypes" (by name)."""
    load_library()
    return "pybind11 extension" if _ext is not None else "ctypes"


def extension_note() -> str:
    """Why the pybind11 extension was not used ("" when it was, or when the library is unavailable)."""
    load_library()
    return _ext_note


def build_info() -> dict[str, str]:
    """What the loaded library was built from ("ffi_api", "jaxlib", "cutlass_dsl", "cuda_runtime",
    "compiler"); empty when it is unavailable or predates jax_mxfp8_build_info."""
    lib = load_library()
    if lib is None:
        return {}
    if _ext is not None:
        return dict(_ext.build_info())
    fn = getattr(lib, "jax_mxfp8_build_info", None)
    if fn is None:
        return {}
    fn.restype = ctypes.c_char_p
    return dict(item.split("=", 1) for item in fn().decode().split(";") if "=" in item)


def ffi_targets() -> list[str]:
    """The FFI target names the loaded library defines (empty when it is unavailable)."""
    load_library()
    return list(_targets)


def kernel_names() -> list[tuple[str, int]]:
    """(variant name, arch major) of every kernel in the built library."""
    lib = load_library()
    if lib is None:
        return []
    if _ext is not None:
        return [(name, int(major)) for name, major in _ext.kernels()]
    return [
        (lib.jax_mxfp8_kernel_name(i).decode(), lib.jax_mxfp8_kernel_arch(i))
        for i in range(lib.jax_mxfp8_kernel_count())
    ]


def has_kernel(name: str) -> bool:
    """Whether the loaded library holds the kernel variant `name` (for any arch). The default build holds the
    production variants (registry.PRODUCTION_VARIANTS); the benchmarks' comparison schedules (tune > 0) only
    a library built with `tools/build_library.py --with-tunes`."""
    return name in {n for n, _ in kernel_names()}


def kernel_targets() -> dict[str, list[str]]:
    """Variant name -> the cubin targets ("sm_90a", "sm_100f") the loaded library holds it for (empty when the
    library is unavailable). registry.ARCH_CCS says which compute capabilities load each target."""
    lib = load_library()
    if lib is None:
        return {}
    target = getattr(lib, "jax_mxfp8_kernel_target", None)
    by_major = {major: arch for arch, major in registry.ARCH_MAJOR.items()}
    out: dict[str, list[str]] = {}
    for i, (name, major) in enumerate(kernel_names()):
        if target is not None:
            target.restype = ctypes.c_char_p
            arch = target(i).decode()
        else:  # a library that predates the per-row target: the major names it
            arch = by_major.get(major, f"major {major}")
        out.setdefault(name, []).append(arch)
    return out


@contextlib.contextmanager
def forced_gpu(cc: tuple[int, int], self_tests: bool = False):
    """Inside the block, answer as on a GPU of compute capability `cc` (e.g. (10, 3)) with the kernel library
    built: gpu_present, gpu_cc, gpu_arch and kernels_runnable report that device, preload does nothing. The
    implementation policy (primitives/implementation.py) then runs every kernel it picks on its "emulated"
    path (the XLA emulation: no such GPU is here). For tests and for reading the dispatch of another GPU.
    self_tests: also run the kernel families' first-use self-tests (primitives/self_test.py, on their
    emulation) where a GPU of that compute capability would; skipped otherwise."""
    global _forced_cc, _forced_self_tests
    cc = (int(cc[0]), int(cc[1]))
    previous, _forced_cc = (_forced_cc, _forced_self_tests), cc
    _forced_self_tests = bool(self_tests)
    try:
        yield cc
    finally:
        _forced_cc, _forced_self_tests = previous


def forced_cc() -> tuple[int, int] | None:
    """The compute capability forced_gpu set, or None."""
    return _forced_cc


def forced_self_tests() -> bool:
    """Whether forced_gpu asked for the self-tests to run."""
    return _forced_self_tests


def gpu_present() -> bool:
    """Whether the default backend's first device is an NVIDIA GPU (it has a compute capability)."""
    return gpu_cc() is not None


def gpu_cc() -> tuple[int, int] | None:
    """(major, minor) compute capability of the default backend's first device, or None when it is not an
    NVIDIA GPU (forced_gpu's inside that block)."""
    if _forced_cc is not None:
        return _forced_cc
    try:
        dev = jax.devices()[0]
    except RuntimeError:
        return None
    if dev.platform != "gpu":
        return None
    cc = getattr(dev, "compute_capability", None)
    try:
        major, _, minor = str(cc).partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return None


def gpu_major() -> int | None:
    """Compute-capability major of the default backend's first device, or None when it is not a GPU."""
    cc = gpu_cc()
    return None if cc is None else cc[0]


def gpu_arch() -> str | None:
    """The library arch ("sm_90a", "sm_100f") whose cubins load on the default backend's GPU, or None (no GPU,
    or a compute capability no arch serves, e.g. 12.x)."""
    cc = gpu_cc()
    return None if cc is None else registry.arch_for_cc(cc)


def library_ok() -> bool:
    """The kernel library is loaded (or forced_gpu pretends it is)."""
    return _forced_cc is not None or load_library() is not None


def kernels_runnable(archs: tuple[str, ...] = registry.ARCHS) -> tuple[bool, str]:
    """(True, "") when kernels built for `archs` can run on the default backend, else (False, why not)."""
    if not library_ok():
        return False, f"the jax_mxfp8 kernel library is unavailable: {_lib_error}"
    cc = gpu_cc()
    if cc is None:
        return False, f"the default JAX backend is {jax.default_backend()!r}, not an NVIDIA GPU"
    name = registry.cc_name(cc)
    if cc[0] in registry.UNSUPPORTED_CCS:
        return False, f"the GPU has compute capability {name}: {registry.UNSUPPORTED_CCS[cc[0]]}"
    arch = registry.arch_for_cc(cc)
    if arch not in archs:
        served = "; ".join(f"{a}: cc {', '.join(registry.cc_name(c) for c in registry.ARCH_CCS[a])}" for a in archs)
        return False, f"the GPU has compute capability {name}; these kernels are built for {served}"
    return True, ""


@functools.cache
def _preload_devices() -> None:
    lib = load_library()
    for dev in jax.local_devices():
        if dev.platform == "gpu":
            rc = lib.jax_mxfp8_preload(int(dev.local_hardware_id if dev.local_hardware_id is not None else dev.id))
            if rc != 0:
                raise RuntimeError(f"jax_mxfp8: loading the kernel modules on {dev} failed (cudaError {rc})")


def preload() -> None:
    """Loads every kernel module onto each local GPU before first use (so CUDA-graph capture never sees a
    module load); nothing under forced_gpu."""
    if _forced_cc is None:
        _preload_devices()
