"""CPU checks of the kernel registry and the built kernel library: exported symbols, the kernel table and
the FFI target list it reports, embedded cubin targets, FFI registration.

Uses jax_mxfp8/_lib/libjax_mxfp8_kernels.so when present. When it is absent the test builds it with
tools/build_library.py if the build toolchain is importable (nvidia-cutlass-dsl, nvidia-cuda-runtime,
jaxlib 0.10.2 headers); otherwise it skips and says which piece is missing. Set
JAX_MXFP8_BUILD_PYTHON=/path/to/python to build with another interpreter (e.g. a build venv).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.kernels.registry.base import ARCH_PACKAGE

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "jax_mxfp8" / "_lib" / "libjax_mxfp8_kernels.so"
CSRC = ROOT / "csrc"
HANDLERS = {
    m for src in CSRC.glob("*.cc") for m in re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(\s*(\w+)", src.read_text())
}
"""Every FFI handler symbol the sources define (the C ABI of csrc/library.cc reports the same list)."""
C_ABI = {
    "jax_mxfp8_kernel_count",
    "jax_mxfp8_kernel_name",
    "jax_mxfp8_kernel_arch",
    "jax_mxfp8_kernel_target",
    "jax_mxfp8_kernel_ccs",
    "jax_mxfp8_preload",
    "jax_mxfp8_ffi_target_count",
    "jax_mxfp8_ffi_target_name",
    "jax_mxfp8_ffi_target_handler",
    "jax_mxfp8_build_info",
}
EXPORTED = HANDLERS | C_ABI
EM_CUDA = 190


def _missing_toolchain(python: str) -> str | None:
    code = (
        "import importlib.util as u, jaxlib, sys; "
        "m=[n for n in ('cutlass','nvidia_cutlass_dsl','nvidia') if u.find_spec(n) is None]; "
        "print(','.join(m) if m else ('jaxlib=='+jaxlib.__version__ if jaxlib.__version__!='0.10.2' else ''))"
    )
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except Exception as e:  # noqa: BLE001
        return f"{python}: {e}"
    if out.returncode:
        return out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "import failed"
    return out.stdout.strip() or None


@pytest.fixture(scope="module")
def library() -> Path:
    if LIB.exists():
        return LIB
    python = os.environ.get("JAX_MXFP8_BUILD_PYTHON", sys.executable)
    missing = _missing_toolchain(python)
    if missing:
        pytest.skip(
            f"kernel library not built and the build toolchain is absent ({missing}); "
            'pip install "nvidia-cutlass-dsl[cu13]==4.8.1" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-crt==13.0.88" '
            '"jaxlib==0.10.2" and run python tools/build_library.py'
        )
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("kernel library not built and no C++ compiler (g++) found")
    subprocess.run([python, str(ROOT / "tools" / "build_library.py"), "--jobs", "2"], check=True)
    return LIB


def _cubins(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, size, e_flags) of every CUDA ELF image embedded in `data` (past the host ELF header)."""
    found, i = [], 1
    while (i := data.find(b"\x7fELF", i)) > 0:
        hdr = data[i : i + 64]
        if len(hdr) == 64 and hdr[4] == 2 and struct.unpack_from("<H", hdr, 18)[0] == EM_CUDA:
            phoff, shoff = struct.unpack_from("<QQ", hdr, 32)
            flags = struct.unpack_from("<I", hdr, 48)[0]
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", hdr, 54)
            size = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
            found.append((i, size, flags))
        i += 4
    return found


def _nm_exports(lib: Path) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not found")
    out = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _ffi_targets(lib: ctypes.CDLL) -> list[str]:
    lib.jax_mxfp8_ffi_target_name.restype = ctypes.c_char_p
    lib.jax_mxfp8_ffi_target_name.argtypes = [ctypes.c_int]
    names = [lib.jax_mxfp8_ffi_target_name(i) for i in range(lib.jax_mxfp8_ffi_target_count())]
    assert lib.jax_mxfp8_ffi_target_name(len(names)) is None
    return [n.decode() for n in names]


def test_registry_configs():
    """Each config class owns its archs, kernel factories ("module:function" under kernels/<arch dir>/ or
    kernels/common/, checked without importing the DSL) and named key; names and keys are unique."""
    assert HANDLERS, "no XLA_FFI_DEFINE_HANDLER_SYMBOL found in csrc/"
    for cls in registry.CONFIG_CLASSES:
        assert cls.archs and set(cls.archs) <= set(registry.ARCHS), cls
        for arch, factory in cls.kernels.items():
            module, _, function = factory.partition(":")
            assert module.startswith(f"jax_mxfp8.kernels.{ARCH_PACKAGE[arch]}.") and function, factory
            path = ROOT / (module.replace(".", "/") + ".py")
            assert re.search(rf"^(def {function}\b|.* as {function}$)", path.read_text(), re.M), factory
    names = [v.name for v in registry.VARIANTS]
    assert len(set(names)) == len(names)
    keys = [(type(v), tuple(v.key.items())) for v in registry.VARIANTS]
    assert len(set(keys)) == len(keys)
    for v in registry.VARIANTS:
        assert type(v) in registry.CONFIG_CLASSES and all(x >= 0 for x in v.key.values()), v
        assert set(v.key) == {*v.key_fields, "tune", *v.table_fields}
        assert registry.find(type(v), **{f: getattr(v, f) for f in (*v.key_fields, "tune")}) is v
    assert registry.AttentionFwdConfig.archs == registry.AttentionRealignConfig.archs == ("sm_90a",)


def test_find_defaults_to_production():
    q = registry.find(registry.QuantizeConfig, in_dtype="float32", mode="row")
    assert q is not None and q.name == "quantize_row_f32_e4m3_up" and q.tune == 0
    assert registry.find(registry.QuantizeConfig, tune=1).name == "quantize_rowcol_bf16_e4m3_up_t1"
    a = registry.find(registry.AttentionFwdConfig, head_dim=64, causal=True)
    assert a.name == "attention_fwd_h64_causal" and not a.packed and a.p_scale == "const"
    assert registry.find(registry.AttentionFwdConfig, head_dim=64, p_scale="block", p_rounding="floor") is None
    assert registry.find(registry.DequantizeConfig, elem_dtype="float8_e5m2", block="rowcol") is None
    with pytest.raises(TypeError):
        registry.find(registry.DequantizeConfig, mode="row")


def test_only_handler_symbols_exported(library):
    assert _nm_exports(library) == EXPORTED


def test_ffi_target_list_is_the_handlers(library):
    """The loader registers what the library reports: exactly the handlers csrc/ defines, each exported."""
    lib = ctypes.CDLL(str(library))
    targets = _ffi_targets(lib)
    assert len(targets) == len(set(targets))
    assert set(targets) == HANDLERS
    exported = _nm_exports(library)
    for name in targets:
        assert name in exported and getattr(lib, name) is not None


def test_no_static_libstdcxx_and_static_cudart(library):
    out = subprocess.run(["ldd", str(library)], capture_output=True, text=True).stdout
    assert "libstdc++" in out, "libstdc++ must stay dynamic (-static-libstdc++ needs a newer glibc)"
    assert "libcudart" not in out, "cudart must be linked statically"


def _built_variants(library) -> tuple:
    """The registry variants the library was built with: production, or (built with --with-tunes) every one."""
    lib = ctypes.CDLL(str(library))
    lib.jax_mxfp8_kernel_name.restype = ctypes.c_char_p
    names = {lib.jax_mxfp8_kernel_name(i).decode() for i in range(lib.jax_mxfp8_kernel_count())}
    with_tunes = any(v.tune and v.name in names for v in registry.VARIANTS)
    return registry.variants(with_tunes)


def test_kernel_table_matches_registry(library):
    """The table holds exactly the production variants (tools/build_library.py's default), or with --with-tunes
    every registered variant (the comparison schedules too), each for every arch of its config."""
    lib = ctypes.CDLL(str(library))
    lib.jax_mxfp8_kernel_name.restype = ctypes.c_char_p
    names = {
        (lib.jax_mxfp8_kernel_name(i).decode(), lib.jax_mxfp8_kernel_arch(i))
        for i in range(lib.jax_mxfp8_kernel_count())
    }
    want = {(v.name, registry.ARCH_MAJOR[a]) for v in _built_variants(library) for a in v.archs}
    assert names == want


def test_kernel_table_rows_name_their_cubin_and_its_compute_capabilities(library):
    """Every row says which cubin it holds and which compute capabilities load it (registry.ARCH_CCS): sm_90a
    rows cc 9.0 only, sm_100f rows cc 10.0 and 10.3 (one cubin for B200 and GB300); the handlers' lookup
    (csrc/common.cc FindKernel) matches a device's cc against this list."""
    lib = ctypes.CDLL(str(library))
    lib.jax_mxfp8_kernel_target.restype = ctypes.c_char_p
    lib.jax_mxfp8_kernel_name.restype = ctypes.c_char_p
    ccs = (ctypes.c_int * 4)()
    seen = set()
    for i in range(lib.jax_mxfp8_kernel_count()):
        arch = lib.jax_mxfp8_kernel_target(i).decode()
        n = lib.jax_mxfp8_kernel_ccs(i, ccs, 4)
        want = [10 * major + minor for major, minor in registry.ARCH_CCS[arch]]
        assert list(ccs[:n]) == want, (lib.jax_mxfp8_kernel_name(i), arch, list(ccs[:n]))
        assert lib.jax_mxfp8_kernel_arch(i) == registry.ARCH_MAJOR[arch]
        seen.add(arch)
    assert seen == set(registry.ARCHS)
    assert lib.jax_mxfp8_kernel_ccs(lib.jax_mxfp8_kernel_count(), ccs, 4) == -1  # out of range


def test_production_variants_and_comparisons():
    """The default build ships tune 0 only; the comparison schedules are at most two per kernel family and
    config class (benchmarks only), and no config class registers a tune without its production variant."""
    assert registry.variants() == registry.PRODUCTION_VARIANTS and registry.variants(True) == registry.VARIANTS
    assert all(v.tune == 0 for v in registry.PRODUCTION_VARIANTS)
    tunes: dict = {}
    for v in registry.VARIANTS:
        if v.tune:
            family = (type(v), getattr(v, "head_dim", None))
            tunes.setdefault(family, set()).add(v.tune)
    assert tunes and all(len(t) <= 2 for t in tunes.values()), tunes


def test_embedded_cubins_target_sm90a_and_sm100f(library, tmp_path):
    data = library.read_bytes()
    cubins = _cubins(data)
    per_arch = {a: sum(a in v.archs for v in _built_variants(library)) for a in registry.ARCHS}
    assert len(cubins) == sum(per_arch.values())
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None and importlib.util.find_spec("nvidia") is not None:
        for base in importlib.util.find_spec("nvidia").submodule_search_locations:
            cand = Path(base) / "cu13" / "bin" / "cuobjdump"
            if cand.exists():
                cuobjdump = str(cand)
    if cuobjdump is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    archs = {}
    for n, (off, size, _) in enumerate(cubins):
        path = tmp_path / f"k{n}.cubin"
        path.write_bytes(data[off : off + size])
        out = subprocess.run([cuobjdump, "-lelf", str(path)], capture_output=True, text=True).stdout
        arch = next((tok.rsplit(".", 2)[-2] for tok in out.split() if tok.endswith(".cubin")), None)
        if arch == "sm_100":  # -lelf names the family target sm_100; ptxas's command line says sm_100f (not 100a)
            elf = subprocess.run([cuobjdump, "-elf", str(path)], capture_output=True, text=True).stdout
            arch = re.search(r"-arch (sm_\w+)", elf).group(1)
        archs[arch] = archs.get(arch, 0) + 1
    assert archs == per_arch, archs


def test_registers_with_jax_ffi(library):
    import jax

    lib = ctypes.CDLL(str(library))
    for name in _ffi_targets(lib):
        # registration checks the handler's FFI API version against this jaxlib's
        jax.ffi.register_ffi_target(f"test_{name}", jax.ffi.pycapsule(getattr(lib, name)), platform="CUDA")
