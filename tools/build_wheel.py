#!/usr/bin/env python3
"""Builds a platform wheel of jax_mxfp8 that carries the prebuilt kernel library.

    python tools/build_wheel.py            # -> dist/jax_mxfp8-<version>-<tag>.whl

The wheel holds the Python package, jax_mxfp8/_lib/libjax_mxfp8_kernels.so (the CuTe DSL kernels and the
XLA FFI handlers, no Python ABI inside) and, when tools/build_library.py built it, the small pybind11
extension jax_mxfp8/_lib/_jax_mxfp8_ext.cpython-3XX-*.so for this interpreter's Python version. Installing
the wheel (`pip install dist/jax_mxfp8-*.whl`) needs no CUTLASS DSL, no CUDA toolkit and no build venv:
the library links cudart statically and the kernels are compiled ahead of time for sm_90a and sm_100f.

Tags: `py3-none-linux_x86_64` without the extension (the library serves every Python >= 3.11); with it,
`cp3X-cp3X-linux_x86_64` for the Python version it was built for (one wheel per version:
`--python-version 3.12` packages the 3.12 extension, which `tools/build_library.py --ext-python
python3.12` builds; default: this interpreter's version). `pip install -e .` stays the CPU / development
path.

Steps: (1) when jax_mxfp8/_lib has no library, or with --rebuild, run tools/build_library.py with this
interpreter (which must then be the build venv's, tools/requirements-build.txt); --no-build fails
instead; (2) check that the library holds production kernels only (a library built with --with-tunes
also holds the benchmarks' comparison schedules, named *_t<N>: refused, rebuild it); (3) write the wheel
with the standard library alone (zipfile + RECORD hashes; no `wheel` or `build` package needed, no
network).

Usage: python tools/build_wheel.py [--out dist] [--rebuild | --no-build] [--jobs 2]
                                   [--python-version 3.X | --no-extension]
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import hashlib
import io
import platform
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "jax_mxfp8"
LIB_DIR = ROOT / PACKAGE / "_lib"
LIB_NAME = "libjax_mxfp8_kernels.so"
EXT_STEM = "_jax_mxfp8_ext"
GENERATOR = "jax_mxfp8 tools/build_wheel.py"
ZIP_DATE = (2026, 1, 1, 0, 0, 0)  # fixed timestamps: the same inputs give the same wheel bytes


def project_metadata(pyproject: Path = ROOT / "pyproject.toml") -> dict:
    """The [project] table of pyproject.toml."""
    return tomllib.loads(pyproject.read_text())["project"]


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def extension_path(lib_dir: Path = LIB_DIR, python_version: str | None = None) -> Path:
    """Where the pybind11 extension for CPython `python_version` (default: this one) lives, built or not."""
    if python_version in (None, this_python()):
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
    else:
        major, minor = python_version.split(".")
        suffix = f".cpython-{major}{minor}-{platform.machine().lower()}-linux-gnu.so"
    return lib_dir / f"{EXT_STEM}{suffix}"


def platform_tag() -> str:
    machine = platform.machine().lower()
    if sys.platform != "linux" or machine not in ("x86_64", "aarch64"):
        raise SystemExit(f"build_wheel: the kernel library is built for linux x86_64; this is {sys.platform} {machine}")
    return f"linux_{machine}"


def wheel_tag(python_version: str | None) -> str:
    """py3-none-<plat> for the Python-free library alone (None); cp3X-cp3X-<plat> with the extension for
    CPython `python_version` inside."""
    if python_version is None:
        return f"py3-none-{platform_tag()}"
    py = "cp" + python_version.replace(".", "")
    return f"{py}-{py}-{platform_tag()}"


def metadata_text(meta: dict, readme: Path = ROOT / "README.md") -> str:
    """Core metadata 2.1 (METADATA) from pyproject's [project] table."""
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {meta['name']}",
        f"Version: {meta['version']}",
    ]
    if "description" in meta:
        lines.append(f"Summary: {meta['description']}")
    if "requires-python" in meta:
        lines.append(f"Requires-Python: {meta['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in meta.get("dependencies", [])]
    for extra, deps in meta.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    text = "\n".join(lines) + "\n"
    if readme.exists():
        text += "Description-Content-Type: text/markdown\n\n" + readme.read_text()
    return text


def package_files(lib_dir: Path = LIB_DIR, python_version: str | None = None) -> list[tuple[str, Path]]:
    """(path in the wheel, path on disk) of every file the wheel carries: the package's .py files, the
    kernel library and, with `python_version`, the pybind11 extension built for it (it must exist)."""
    pkg = ROOT / PACKAGE
    files = [
        (p.relative_to(ROOT).as_posix(), p)
        for p in sorted(pkg.rglob("*.py"))
        if "__pycache__" not in p.parts and lib_dir not in p.parents
    ]
    lib = lib_dir / LIB_NAME
    if not lib.exists():
        raise SystemExit(f"build_wheel: {lib} is not built (run tools/build_library.py, or drop --no-build)")
    files.append((f"{PACKAGE}/_lib/{LIB_NAME}", lib))
    if python_version is not None:
        ext = extension_path(lib_dir, python_version)
        if not ext.exists():
            raise SystemExit(
                f"build_wheel: {ext} is not built (tools/build_library.py --ext-python python{python_version})"
            )
        files.append((f"{PACKAGE}/_lib/{ext.name}", ext))
    return files


def comparison_kernels(lib: Path) -> list[str]:
    """The kernels of a built library that are comparison schedules (tune > 0: every config names them
    <name>_t<tune>), read from its C ABI (csrc/library.cc; no GPU needed)."""
    handle = ctypes.CDLL(str(lib))
    handle.jax_mxfp8_kernel_name.restype = ctypes.c_char_p
    handle.jax_mxfp8_kernel_name.argtypes = [ctypes.c_int]
    names = [handle.jax_mxfp8_kernel_name(i).decode() for i in range(handle.jax_mxfp8_kernel_count())]
    return sorted({n for n in names if re.search(r"_t\d+$", n)})


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(out_dir: Path, files: list[tuple[str, Path]], meta: dict, tag: str) -> Path:
    """Writes <name>-<version>-<tag>.whl into out_dir and returns its path."""
    name = re.sub(r"[-_.]+", "_", meta["name"]).lower()
    dist_info = f"{name}-{meta['version']}.dist-info"
    entries: list[tuple[str, bytes, int]] = []  # (arcname, bytes, unix mode)
    for arc, path in files:
        mode = 0o755 if path.suffix == ".so" else 0o644
        entries.append((arc, path.read_bytes(), mode))
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: false\nTag: {tag}\n"
    entries.append((f"{dist_info}/METADATA", metadata_text(meta).encode(), 0o644))
    entries.append((f"{dist_info}/WHEEL", wheel_meta.encode(), 0o644))
    entries.append((f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode(), 0o644))
    record = io.StringIO()
    for arc, data, _ in entries:
        record.write(f"{arc},{_record_hash(data)},{len(data)}\n")
    record.write(f"{dist_info}/RECORD,,\n")
    entries.append((f"{dist_info}/RECORD", record.getvalue().encode(), 0o644))

    out_dir.mkdir(parents=True, exist_ok=True)
    whl = out_dir / f"{name}-{meta['version']}-{tag}.whl"
    tmp = whl.with_suffix(".whl.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arc, data, mode in entries:
            info = zipfile.ZipInfo(arc, date_time=ZIP_DATE)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    tmp.replace(whl)
    return whl


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "dist"), help="folder the wheel is written to")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--rebuild", action="store_true", help="run tools/build_library.py even if built")
    group.add_argument("--no-build", action="store_true", help="only package the library already built")
    ap.add_argument("--jobs", type=int, default=2, help="passed to tools/build_library.py")
    ext = ap.add_mutually_exclusive_group()
    ext.add_argument("--python-version", help="CPython X.Y whose pybind11 extension goes in (default: this one's)")
    ext.add_argument("--no-extension", action="store_true", help="the library alone: a py3-none wheel")
    ap.add_argument("--lib-dir", default=str(LIB_DIR), help=argparse.SUPPRESS)  # tests: another built library
    args = ap.parse_args(argv)
    lib_dir = Path(args.lib_dir).resolve()
    if args.rebuild or (not (lib_dir / LIB_NAME).exists() and not args.no_build):
        build = str(ROOT / "tools" / "build_library.py")
        cmd = [sys.executable, build, "--jobs", str(args.jobs), "--out", str(lib_dir)]
        print("+", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
        if rc:
            return rc
    python_version = None if args.no_extension else (args.python_version or this_python())
    if python_version is not None and args.python_version is None and not extension_path(lib_dir).exists():
        print(f"build_wheel: no pybind11 extension for Python {python_version}: packaging the library alone")
        python_version = None
    files = package_files(lib_dir, python_version)
    tunes = comparison_kernels(lib_dir / LIB_NAME)
    if tunes:
        raise SystemExit(
            f"build_wheel: {lib_dir / LIB_NAME} holds {len(tunes)} comparison kernels (e.g. {tunes[0]}; built with "
            "--with-tunes): a wheel ships production only (build_wheel.py --rebuild)"
        )
    whl = write_wheel(Path(args.out).resolve(), files, project_metadata(), wheel_tag(python_version))
    print(f"built {whl} ({whl.stat().st_size / 1e6:.1f} MB; {len(files)} files)")
    print(f"install: pip install {whl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
