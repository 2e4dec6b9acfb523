#!/usr/bin/env python3
"""Builds jax_mxfp8/_lib/libjax_mxfp8_kernels.so: the AOT CuTe DSL kernels + the XLA FFI handlers.

Steps: (1) tools/build_kernels.py compiles the production registry variants for sm_90a and sm_100f (no GPU;
with --with-tunes the comparison schedules too, for the benchmarks; a wheel ships production only);
(2) g++ compiles csrc/*.cc against the XLA FFI headers of the OLDEST supported jaxlib (0.10.2, FFI API
0.3: handlers built against it register on jaxlib 0.10.2 and newer) and CUDA headers from the
nvidia-cuda-runtime wheel; (3) g++ links one plain shared library with static cudart and the DSL's
static runtime, exporting only the `jax_mxfp8_*` extern "C" symbols (version script + --exclude-libs).
No -static-libstdc++ (it needs a newer glibc than the GPU machine has). No Python ABI inside: one build
serves Python 3.11 and 3.12. (4) g++ builds the pybind11 extension jax_mxfp8/_lib/_jax_mxfp8_ext.<abi>.so
(csrc/python/extension.cc: registrations(), kernels(), build_info()) for each --ext-python interpreter
(default: this one), linked against the library with rpath $ORIGIN; skipped, with a note, when pybind11
is not installed (the loader then finds the FFI targets by name with ctypes).

Build requirements, all from PyPI:
  pip install "nvidia-cutlass-dsl[cu13]==4.8.1" "nvidia-cuda-runtime==13.0.96" "jax==0.10.2" "jaxlib==0.10.2"
(jax only because the kernels read the numerics constants from jax_mxfp8.formats.) pybind11==3.1.0 for
the extension.

Usage: python tools/build_library.py [--skip-kernels] [--jobs 2] [--out jax_mxfp8/_lib] [--with-tunes]
                                     [--ext-python PYTHON ...] [--no-extension]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLDEST_JAXLIB = "0.10.2"
LIB_NAME = "libjax_mxfp8_kernels.so"


def _pkg_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"build_library: Python package {name!r} not found (see this script's docstring)")
    return Path(list(spec.submodule_search_locations)[0])


def toolchain() -> dict:
    """Paths of everything the link needs, from the installed build requirements."""
    import jaxlib

    if jaxlib.__version__ != OLDEST_JAXLIB:
        raise SystemExit(
            f"build_library: jaxlib {jaxlib.__version__} found; build against jaxlib=={OLDEST_JAXLIB} (FFI API 0.3) "
            "so that the library registers on every supported jaxlib"
        )
    ffi_include = Path(jaxlib.__file__).parent / "include"
    cuda = _pkg_dir("nvidia") / "cu13"
    dsl_lib = _pkg_dir("nvidia_cutlass_dsl") / "cu13" / "lib"
    paths = {
        "ffi_include": ffi_include,
        "cuda_include": cuda / "include",
        "cudart_static": cuda / "lib" / "libcudart_static.a",
        "dsl_runtime": dsl_lib / "libcuda_dialect_runtime_static.a",
    }
    for key, p in paths.items():
        if not p.exists():
            raise SystemExit(f"build_library: {key} not found at {p}")
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise SystemExit(f"build_library: C++ compiler {cxx!r} not found")
    paths["cxx"] = cxx
    return paths


def run(cmd: list[str]) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build(kernels_dir: Path, out_dir: Path, obj_dir: Path) -> Path:
    tc = toolchain()
    obj_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    cxxflags = [
        "-O2",
        "-std=c++17",
        "-fPIC",
        "-fvisibility=hidden",
        "-Wall",
        "-Wno-unused-function",
        "-Wno-sign-compare",
        "-Wno-return-type",  # jaxlib 0.10.2's api.h operator<< (a switch over every enum value)
        f"-I{tc['ffi_include']}",
        f"-I{tc['cuda_include']}",
        f"-I{kernels_dir}",
        f"-I{ROOT / 'csrc'}",
        f'-DJMX_BUILD_JAXLIB="{_version("jaxlib")}"',
        f'-DJMX_BUILD_CUTLASS_DSL="{_version("nvidia-cutlass-dsl")}"',
    ]
    objs = []
    for src in sorted((ROOT / "csrc").glob("*.cc")):
        obj = obj_dir / (src.stem + ".o")
        run([tc["cxx"], *cxxflags, "-c", src, "-o", obj])
        objs.append(obj)
    archive = kernels_dir / "libjmx_kernels.a"
    if not archive.exists():
        raise SystemExit(f"build_library: {archive} not found; run tools/build_kernels.py")
    lib = out_dir / LIB_NAME
    tmp = out_dir / (LIB_NAME + ".tmp")
    run(
        [
            tc["cxx"],
            "-shared",
            "-o",
            tmp,
            *objs,
            archive,
            tc["dsl_runtime"],
            tc["cudart_static"],
            "-ldl",
            "-lpthread",
            "-lrt",
            "-Wl,--exclude-libs,ALL",
            f"-Wl,--version-script={ROOT / 'csrc' / 'exports.map'}",
            "-Wl,--no-undefined",
            "-Wl,-z,noexecstack",
        ]
    )
    os.replace(tmp, lib)
    return lib


def _interpreter_abi(python: str) -> tuple[str, str]:
    """(include dir, extension suffix) of another Python interpreter."""
    code = "import sysconfig; print(sysconfig.get_paths()['include']); print(sysconfig.get_config_var('EXT_SUFFIX'))"
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return out[0], out[1]


def build_extension(lib: Path, python: str, cxx: str) -> Path | None:
    """The pybind11 extension for `python`'s ABI next to `lib`; None (with a note) without pybind11."""
    try:
        import pybind11
    except ImportError:
        print("build_library: pybind11 not installed; no extension (the loader uses ctypes)", flush=True)
        return None
    include, suffix = _interpreter_abi(python)
    if not (Path(include) / "Python.h").exists():
        raise SystemExit(f"build_library: {python} has no Python.h under {include}")
    ext = lib.parent / f"_jax_mxfp8_ext{suffix}"
    tmp = ext.with_name(ext.name + ".tmp")
    run(
        [
            cxx,
            "-O2",
            "-std=c++17",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            f"-I{pybind11.get_include()}",
            f"-I{include}",
            ROOT / "csrc" / "python" / "extension.cc",
            "-o",
            tmp,
            f"-L{lib.parent}",
            "-l:" + LIB_NAME,
            "-Wl,-rpath,$ORIGIN",
            f"-Wl,--version-script={ROOT / 'csrc' / 'python' / 'extension.map'}",
            "-Wl,-z,noexecstack",
        ]
    )
    os.replace(tmp, ext)
    return ext


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-kernels", action="store_true", help="reuse build/kernels from an earlier run")
    ap.add_argument("--jobs", type=int, default=1, help="archs compiled in parallel by build_kernels.py")
    ap.add_argument("--build-dir", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "jax_mxfp8" / "_lib"))
    ap.add_argument(
        "--ext-python",
        action="append",
        help="build the pybind11 extension for this interpreter (repeatable; default: this interpreter)",
    )
    ap.add_argument("--no-extension", action="store_true", help="build the library alone (ctypes loading)")
    ap.add_argument(
        "--with-tunes",
        action="store_true",
        help="also the comparison schedules (tune > 0) the benchmarks time against production",
    )
    args = ap.parse_args(argv)
    t0 = time.time()
    build_dir = Path(args.build_dir).resolve()
    kernels_dir = build_dir / "kernels"
    if not args.skip_kernels:
        rc = subprocess.call(
            [
                sys.executable,
                str(ROOT / "tools" / "build_kernels.py"),
                "--out",
                str(kernels_dir),
                "--jobs",
                str(args.jobs),
                *(["--with-tunes"] if args.with_tunes else []),
            ]
        )
        if rc:
            return rc
    lib = build(kernels_dir, Path(args.out).resolve(), build_dir / "obj")
    print(f"built {lib} ({lib.stat().st_size / 1e6:.1f} MB) in {time.time() - t0:.1f} s")
    if not args.no_extension:
        for python in args.ext_python or [sys.executable]:
            ext = build_extension(lib, python, os.environ.get("CXX", "g++"))
            if ext is not None:
                print(f"built {ext}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
