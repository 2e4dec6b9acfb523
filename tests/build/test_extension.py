"""The pybind11 extension (csrc/python/extension.cc, jax_mxfp8/_lib/_jax_mxfp8_ext.<abi>.so): the same
FFI targets (the very handler addresses), kernel table and build info as the library's C ABI read with
ctypes; the loader prefers it and falls back to ctypes; the handler library has no Python ABI.

Skips when the library or this Python's extension is not built (tools/build_library.py builds both).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jax_mxfp8.primitives import library

ROOT = Path(__file__).resolve().parents[2]
LIB = library.library_path()
EXT = library.extension_path()

pytestmark = pytest.mark.skipif(
    not (LIB.exists() and EXT.exists()),
    reason=f"{LIB.name} or {EXT.name} not built (tools/build_library.py, with pybind11 installed)",
)


@pytest.fixture(scope="module")
def ext():
    spec = importlib.util.spec_from_file_location("_jax_mxfp8_ext", EXT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def clib():
    lib = ctypes.CDLL(str(LIB))
    lib.jax_mxfp8_ffi_target_name.restype = ctypes.c_char_p
    lib.jax_mxfp8_kernel_name.restype = ctypes.c_char_p
    lib.jax_mxfp8_build_info.restype = ctypes.c_char_p
    lib.jax_mxfp8_ffi_target_handler.restype = ctypes.c_void_p
    return lib


def _capsule_pointer(capsule) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, None)


def test_registrations_are_the_handlers(ext, clib):
    regs = ext.registrations()
    names = [clib.jax_mxfp8_ffi_target_name(i).decode() for i in range(clib.jax_mxfp8_ffi_target_count())]
    assert list(regs) == names and len(names) > 0
    for i, name in enumerate(names):
        symbol = ctypes.cast(getattr(clib, name), ctypes.c_void_p).value
        assert _capsule_pointer(regs[name]) == symbol == clib.jax_mxfp8_ffi_target_handler(i), name
    assert clib.jax_mxfp8_ffi_target_handler(len(names)) is None  # out of range -> NULL
    via_ctypes = library.ctypes_registrations(clib)
    assert {n: _capsule_pointer(c) for n, c in via_ctypes.items()} == {n: _capsule_pointer(c) for n, c in regs.items()}


def test_kernel_table_and_build_info(ext, clib):
    table = [
        (clib.jax_mxfp8_kernel_name(i).decode(), clib.jax_mxfp8_kernel_arch(i))
        for i in range(clib.jax_mxfp8_kernel_count())
    ]
    assert ext.kernels() == table
    info = ext.build_info()
    raw = clib.jax_mxfp8_build_info().decode()
    assert info == dict(item.split("=", 1) for item in raw.split(";"))
    assert info["ffi_api"] == "0.3" and info["jaxlib"] == "0.10.2"  # built against the oldest jaxlib
    assert set(info) == {"ffi_api", "jaxlib", "cutlass_dsl", "cuda_runtime", "compiler"}


def test_loader_prefers_the_extension_and_falls_back_to_ctypes():
    probe = (
        "import json; from jax_mxfp8.primitives import library as l; "
        "print(json.dumps([l.binding(), l.extension_note(), l.ffi_targets(), l.kernel_names(), l.build_info()]))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    runs = {}
    for flag in ("", "1"):
        env[library.NO_EXTENSION_ENV] = flag
        out = subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True, text=True)
        runs[flag] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs[""][:2] == ["pybind11 extension", ""]
    assert runs["1"][:2] == ["ctypes", f"{library.NO_EXTENSION_ENV} is set"]
    assert runs[""][2:] == runs["1"][2:]  # the same targets, kernels and build info either way


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None, reason="binutils not found")
def test_binaries():
    # the handler library stays free of Python's ABI; the extension exports its init function alone and
    # finds the library next to itself
    undefined = subprocess.run(["nm", "-D", "--undefined-only", LIB], check=True, capture_output=True, text=True)
    assert not [ln for ln in undefined.stdout.splitlines() if " Py" in ln or "_Py" in ln]
    exported = subprocess.run(["nm", "-D", "--defined-only", EXT], check=True, capture_output=True, text=True)
    assert [ln.split()[-1] for ln in exported.stdout.splitlines()] == ["PyInit__jax_mxfp8_ext"]
    dyn = subprocess.run(["readelf", "-d", EXT], check=True, capture_output=True, text=True).stdout
    assert "Shared library: [libjax_mxfp8_kernels.so]" in dyn and "[$ORIGIN]" in dyn
