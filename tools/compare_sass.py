#!/usr/bin/env python3
"""Compares the compiled kernels of two builds variant by variant: "same bits" check for refactors.

Each build dir is what tools/build_kernels.py wrote (--out DIR: DIR/<arch>/dump/<variant>/*.cubin) or what
tools/build_library.py wrote (--build-dir DIR: DIR/kernels/<arch>/dump/<variant>/*.cubin). For every variant
present in the build dirs (filtered by --variant globs), the cubins are compared:
  identical (bytes)  the cubin files are byte-identical
  identical (SASS)   the bytes differ (e.g. the kernel symbol was renamed) but `cuobjdump -sass` is the same
                     once instruction addresses and symbol/function-name lines are stripped
  DIFFERENT          the SASS differs (with -v: the first differing lines)
  missing            the variant exists in only one build (an error unless --intersection)
Exit code 0 when every compared variant is identical, 1 otherwise.

Usage (rebuild the kernels from your tree, then compare against a build of the base commit):
  CUTE_DSL_ARCH=sm_90a python tools/build_kernels.py --out /tmp/new --arch sm_90a
  python tools/compare_sass.py BASE_BUILD /tmp/new --arch sm_90a --variant 'attention_fwd*'
cuobjdump is taken from --cuobjdump, PATH, or the nvidia-cuda-cuobjdump wheel (nvidia/cu13/bin).
Standard library only (runs on any Python 3.11).
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

# "/*0a30*/" instruction-address comments; the encoding comments ("/* 0x... */") stay: they are the bits.
_ADDR_RE = re.compile(r"/\*[0-9a-f]{4,}\*/")
# lines that carry the kernel's (mangled) name or the file header, not code
_NAME_LINE_RE = re.compile(r"^\s*(Function\s*:|code for sm_|Fatbin|arch\s*=|code version|host\s*=|compile_size|\.)")


def kernels_root(build: Path) -> Path:
    """The directory holding <arch>/dump/ (build_kernels --out) inside a build dir (either layout)."""
    if (build / "kernels").is_dir() and any((build / "kernels").glob("*/dump")):
        return build / "kernels"
    return build


def variants(root: Path, arch: str) -> dict[str, list[Path]]:
    """variant name -> its cubins (sorted by name) under root/<arch>/dump/."""
    dump = root / arch / "dump"
    if not dump.is_dir():
        return {}
    return {d.name: sorted(d.glob("*.cubin")) for d in sorted(dump.iterdir()) if d.is_dir()}


def find_cuobjdump(explicit: str | None) -> str:
    if explicit:
        return explicit
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia  # the nvidia-cuda-cuobjdump wheel (build venv)

        for base in nvidia.__path__:
            cand = Path(base) / "cu13" / "bin" / "cuobjdump"
            if cand.exists():
                return str(cand)
    except ImportError:
        pass
    for venv in (Path(sys.prefix), Path(__file__).resolve().parent.parent / ".venv-build"):
        for cand in venv.glob("lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump"):
            return str(cand)
    sys.exit("compare_sass: cuobjdump not found (pass --cuobjdump, or put it on PATH)")


def normalized_sass(cuobjdump: str, cubin: Path) -> list[str]:
    """`cuobjdump -sass` of a cubin without addresses, names and blank lines (what must match)."""
    out = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    lines = []
    for line in out.splitlines():
        if not line.strip() or _NAME_LINE_RE.match(line):
            continue
        lines.append(" ".join(_ADDR_RE.sub("", line).split()))
    return lines


def compare_variant(cuobjdump: str | None, a: list[Path], b: list[Path], verbose: bool) -> tuple[bool, str]:
    """(identical?, status text) for one variant's cubins in the two builds (paired in sorted order).
    cuobjdump is looked up (find_cuobjdump) only when some bytes differ."""
    if len(a) != len(b) or not a:
        return False, f"DIFFERENT ({len(a)} vs {len(b)} cubins)"
    if all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b)):
        return True, "identical (bytes)"
    cuobjdump = find_cuobjdump(cuobjdump)
    for x, y in zip(a, b):
        sx, sy = normalized_sass(cuobjdump, x), normalized_sass(cuobjdump, y)
        if sx != sy:
            detail = ""
            if verbose:
                diff = difflib.unified_diff(sx, sy, str(x), str(y), lineterm="", n=2)
                detail = "\n" + "\n".join(list(diff)[:40])
            return False, f"DIFFERENT ({len(sx)} vs {len(sy)} SASS lines){detail}"
    return True, "identical (SASS)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path, help="reference build dir")
    ap.add_argument("new", type=Path, help="build dir to check")
    ap.add_argument("--arch", action="append", help="default: every arch found in the base build")
    ap.add_argument("--variant", action="append", help="fnmatch glob on variant names (repeatable); default all")
    ap.add_argument("--intersection", action="store_true", help="compare only variants present in both builds")
    ap.add_argument("--cuobjdump", help="path of cuobjdump")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the first SASS differences")
    args = ap.parse_args(argv)

    base_root, new_root = kernels_root(args.base), kernels_root(args.new)
    archs = args.arch or sorted(p.parent.name for p in base_root.glob("*/dump"))
    globs = args.variant or ["*"]
    n_same = n_bad = 0
    for arch in archs:
        va, vb = variants(base_root, arch), variants(new_root, arch)
        names = sorted(n for n in set(va) | set(vb) if any(fnmatch.fnmatch(n, g) for g in globs))
        for name in names:
            if name not in va or name not in vb:
                if args.intersection:
                    continue
                ok, status = False, f"missing in {'new' if name in va else 'base'}"
            else:
                ok, status = compare_variant(args.cuobjdump, va[name], vb[name], args.verbose)
            n_same += ok
            n_bad += not ok
            print(f"[{arch}] {name}: {status}")
    print(f"{n_same} identical, {n_bad} different or missing, of {n_same + n_bad} variants")
    if n_same + n_bad == 0:
        print("compare_sass: no variants matched", file=sys.stderr)
        return 1
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
