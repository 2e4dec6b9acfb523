"""The platform wheel (tools/build_wheel.py): its contents, and that it installs into a clean venv whose
jax_mxfp8 loads the kernel library inside the wheel and lists its FFI targets and kernels (no GPU needed).

Skips when jax_mxfp8/_lib holds no built library (tools/build_library.py builds it; CI does).
The install test makes a clean venv, points it at the site-packages this interpreter imports jax from (a
.pth file: works when this interpreter is itself a venv, where --system-site-packages would not see its
packages) and `pip install --no-deps --no-index` the wheel: no network.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "jax_mxfp8" / "_lib" / "libjax_mxfp8_kernels.so"

pytestmark = pytest.mark.skipif(
    not LIB.exists(), reason=f"{LIB} is not built (run tools/build_library.py; see README 'Building')"
)


def _tool():
    spec = importlib.util.spec_from_file_location("build_wheel", ROOT / "tools" / "build_wheel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    tool = str(ROOT / "tools" / "build_wheel.py")
    subprocess.run([sys.executable, tool, "--no-build", "--out", str(out)], check=True)
    (whl,) = out.glob("*.whl")
    return whl


def _clean_env() -> dict:
    """The environment without anything that would put the source tree on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_wheel_contents(wheel: Path):
    tool = _tool()
    meta = tool.project_metadata()
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = f"jax_mxfp8-{meta['version']}.dist-info"
        # every module of the package, and the library byte for byte
        sources = [p for p in (ROOT / "jax_mxfp8").rglob("*.py") if "__pycache__" not in p.parts]
        py = {p.relative_to(ROOT).as_posix() for p in sources}
        assert py <= names, sorted(py - names)
        assert zf.read("jax_mxfp8/_lib/libjax_mxfp8_kernels.so") == LIB.read_bytes()
        assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
        # a platform wheel: not purelib, tagged for this platform (py3-none without the extension)
        wheel_meta = zf.read(f"{dist_info}/WHEEL").decode()
        assert "Root-Is-Purelib: false" in wheel_meta
        tag = wheel.name.removesuffix(".whl").split("-", 2)[2]
        assert f"Tag: {tag}" in wheel_meta and tag.endswith("linux_x86_64")
        exts = [n for n in names if n.startswith("jax_mxfp8/_lib/_jax_mxfp8_ext")]
        assert tag.startswith("py3-none-") != bool(exts)
        assert len(exts) <= 1  # one Python version per wheel
        # metadata follows pyproject
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        assert f"Name: {meta['name']}\n" in metadata and f"Version: {meta['version']}\n" in metadata
        for dep in meta["dependencies"]:
            assert f"Requires-Dist: {dep}\n" in metadata
        # RECORD lists every other file with its sha256 and size
        rows = list(csv.reader(io.StringIO(zf.read(f"{dist_info}/RECORD").decode())))
        recorded = {r[0]: r for r in rows}
        assert set(recorded) == names
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = zf.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data), name


def test_wheel_is_reproducible(wheel: Path, tmp_path: Path):
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_wheel.py"), "--no-build", "--out", str(tmp_path)], check=True
    )
    assert (tmp_path / wheel.name).read_bytes() == wheel.read_bytes()


_PROBE = """
import json, jax_mxfp8
from jax_mxfp8.primitives import library
print(json.dumps({"file": jax_mxfp8.__file__, "lib": str(library.library_path()), "error": library.library_error(),
                  "targets": library.ffi_targets(), "kernels": library.kernel_names(), "binding": library.binding()}))
"""


def _outer_site_dirs() -> list[str]:
    """The site-packages directories of this interpreter (where jax and its dependencies are)."""
    import jax

    dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    jax_dir = str(Path(jax.__file__).resolve().parent.parent)
    return dirs if jax_dir in dirs else [*dirs, jax_dir]


@pytest.fixture(scope="module")
def plain_wheel(tmp_path_factory) -> Path:
    """The py3-none wheel: the library alone, no extension (the loader's ctypes path)."""
    out = tmp_path_factory.mktemp("dist_plain")
    tool = str(ROOT / "tools" / "build_wheel.py")
    subprocess.run([sys.executable, tool, "--no-build", "--no-extension", "--out", str(out)], check=True)
    (whl,) = out.glob("*.whl")
    return whl


@pytest.mark.parametrize("kind", ["default", "no-extension"])
def test_wheel_installs_and_loads(kind: str, wheel: Path, plain_wheel: Path, tmp_path: Path):
    """A clean venv (jax from this interpreter's site-packages), the wheel alone: the library inside loads."""
    wheel = wheel if kind == "default" else plain_wheel
    venv = tmp_path / "venv"
    env = _clean_env()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    # appended after the venv's own site-packages, so the installed wheel wins; .pth files in these
    # folders (an editable install's finder) are not processed
    (site / "_outer_site.pth").write_text("".join(d + "\n" for d in _outer_site_dirs()))
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check", wheel],
        check=True,
        env=env,
    )
    out = subprocess.run(
        [python, "-c", _PROBE], check=True, env=env, cwd=tmp_path, capture_output=True, text=True
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(site), got["file"]  # the installed copy, not the source tree
    assert Path(got["lib"]).is_relative_to(site) and got["error"] is None, got
    # the same targets and kernel table as the library in the source tree (read with ctypes, no jax)
    import ctypes

    lib = ctypes.CDLL(str(LIB))
    lib.jax_mxfp8_ffi_target_name.restype = ctypes.c_char_p
    lib.jax_mxfp8_kernel_name.restype = ctypes.c_char_p
    targets = [lib.jax_mxfp8_ffi_target_name(i).decode() for i in range(lib.jax_mxfp8_ffi_target_count())]
    n_kernels = lib.jax_mxfp8_kernel_count()
    kernels = [[lib.jax_mxfp8_kernel_name(i).decode(), lib.jax_mxfp8_kernel_arch(i)] for i in range(n_kernels)]
    assert got["targets"] == targets and len(targets) > 0
    assert got["kernels"] == kernels and {a for _, a in kernels} >= {9}
    with zipfile.ZipFile(wheel) as zf:
        has_ext = any(n.startswith("jax_mxfp8/_lib/_jax_mxfp8_ext") for n in zf.namelist())
    assert got["binding"] == ("pybind11 extension" if has_ext else "ctypes")


def test_wheel_per_python_version(tmp_path: Path):
    """--no-extension: py3-none; --python-version X.Y: the cpXY extension alone, or a clear error."""
    tool = str(ROOT / "tools" / "build_wheel.py")
    subprocess.run([sys.executable, tool, "--no-build", "--no-extension", "--out", str(tmp_path)], check=True)
    (plain,) = tmp_path.glob("*.whl")
    assert plain.name.endswith("-py3-none-linux_x86_64.whl")
    with zipfile.ZipFile(plain) as zf:
        assert not any("_jax_mxfp8_ext" in n for n in zf.namelist())
    for version in ("3.11", "3.12"):
        ext = _tool().extension_path(python_version=version)
        out = tmp_path / version
        run = subprocess.run(
            [sys.executable, tool, "--no-build", "--python-version", version, "--out", str(out)],
            capture_output=True,
            text=True,
        )
        if not ext.exists():
            assert run.returncode != 0 and "is not built" in run.stderr
            continue
        assert run.returncode == 0, run.stderr
        (whl,) = out.glob("*.whl")
        tag = "cp" + version.replace(".", "")
        assert whl.name.endswith(f"-{tag}-{tag}-linux_x86_64.whl")
        with zipfile.ZipFile(whl) as zf:
            exts = [n for n in zf.namelist() if "_jax_mxfp8_ext" in n]
        assert exts == [f"jax_mxfp8/_lib/{ext.name}"] and f"cpython-{tag[2:]}" in ext.name
