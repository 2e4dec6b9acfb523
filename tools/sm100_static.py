"""The shared machinery of the Blackwell (sm_100f) static checkers -- compile, read the cubins, the common
checks, the table and the command line -- with one Family per kernel family (per-family hooks):

  tools/check_sm100.py               the MX GEMM            table docs/perf/blackwell_gemm_variants.md
  tools/check_sm100_attention_fwd.py the attention forward  table docs/perf/blackwell_attention_fwd_variants.md
  tools/check_sm100_attention_bwd.py the attention backward table docs/perf/blackwell_attention_bwd_variants.md
                                     and its pre-pass

A Family names its variants (frozen configs with a `name`), the module whose make_kernel(config) builds a
variant's kernel object in the compiling process (`module(config)`: an object with entry(), fake_args()) and
which of that object's traced facts to keep next to the cubin (`meta_fields(config)`: attribute names, set
while tracing), how to check one compiled variant (`check(config, Compiled)` -> (its table row, problems))
and how to render the table (`table(rows, companion_rows)`). `companions(configs)` lists
variants of other families a table needs (the backward's forward + backward prediction takes the compiled
forward's instruction counts): they are compiled and checked with their own family's hooks.

Compiling runs in a subprocess of the family's tool with CUTE_DSL_ARCH=sm_100f (the DSL reads the target at
import): `cute.compile(kernel.entry(), *kernel.fake_args(), options="--gpu-arch sm_100f --keep-cubin
--keep-ptx --dump-dir DIR/<variant>")`; --reuse skips variants whose DIR/<variant>/meta.json exists. No GPU
is needed, and none of these kernels has run on one. cuobjdump comes from PATH or the nvidia-cuda-cuobjdump
wheel (compare_sass.find_cuobjdump).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from compare_sass import find_cuobjdump  # noqa: E402

ARCH = "sm_100f"
"""The family target every sm100 kernel is compiled for (one cubin for cc 10.0 and 10.3)."""
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([^;]*)")
"""A SASS instruction line of `cuobjdump -sass`: (address, the instruction without its predicate)."""
_RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_ALLOC = re.compile(
    r"tcgen05\.alloc\.cta_group::(\d)\.sync\.aligned\.shared::cta\.b32\s+\[%r\d+(?:\+\d+)?\],\s*(%r\d+|\d+);"
)
_MMA = re.compile(
    r"UTCQMMA(\.2CTA)?\s+(gdesc|tmem)\[\w+\],\s*gdesc\[\w+\],\s*tmem\[\w+\],\s*tmem\[\w+\],\s*idesc\[\w+\],\s*tmem\[\w+\]"
)
_SCALE_COPY = re.compile(r"UTCCP\.T\.S(\.2CTA)?\.4x32dp128bit\s+tmem\[\w+(?:\+0x([0-9a-f]+))?\]")
_SETMAXNREG = re.compile(r"USETMAXREG\.(TRY_ALLOC|DEALLOC)\.CTAPOOL\s+(?:U?P\w+,\s*)?0x([0-9a-f]+)")


@dataclasses.dataclass(frozen=True)
class Family:
    """One kernel family's hooks (module docstring)."""

    tool: Path
    variants: tuple
    module: Callable[[object], str]
    meta_fields: Callable[[object], tuple[str, ...]]
    check: Callable
    table: Callable
    companions: Callable = lambda configs: ()

    def chosen(self, only: list[str] | None) -> list:
        """The variants named by --only (all when none); SystemExit naming unknown names."""
        chosen = [v for v in self.variants if not only or v.name in only]
        missing = set(only or ()) - {v.name for v in chosen}
        if missing:
            raise SystemExit(f"unknown variants: {sorted(missing)}")
        return chosen

    def builds(self, only: list[str] | None) -> list[tuple[Family, object]]:
        """(family, config) of every variant to compile: the chosen ones, then their companions."""
        chosen = self.chosen(only)
        extra = []
        for fam, config in self.companions(chosen):
            if all(config.name != c.name for _, c in extra):
                extra.append((fam, config))
        return [(self, c) for c in chosen] + extra


class Compiled:
    """One compiled variant in DIR/<name>/: its cubin's SASS and resource usage, its PTX and meta.json."""

    def __init__(self, folder: Path, cuobjdump: str):
        self.folder = folder
        self.cubin = _one(folder, "*.cubin")
        self.ptx = _one(folder, "*.ptx").read_text()
        self.meta = json.loads((folder / "meta.json").read_text())
        self.sass = self._cuobjdump(cuobjdump, "-sass")
        self.sass_lines = self.sass.splitlines()
        usage = _RES.search(self._cuobjdump(cuobjdump, "-res-usage"))
        self.registers, self.stack, self.static_smem, self.local = map(int, usage.groups())
        self.elf = self._cuobjdump(cuobjdump, "-elf")

    def _cuobjdump(self, cuobjdump: str, flag: str) -> str:
        return subprocess.run([cuobjdump, flag, str(self.cubin)], capture_output=True, text=True, check=True).stdout

    def instructions(self) -> list[tuple[int, str]]:
        """(address, instruction) of every SASS instruction, in order."""
        return [(int(m.group(1), 16), m.group(2)) for line in self.sass_lines if (m := INSTRUCTION.match(line))]

    def mma_sites(self) -> list[tuple[bool, str]]:
        """UTCQMMA with TMEM scale operands (gdesc|tmem A, gdesc B, tmem D, tmem SFA, idesc, tmem SFB):
        (.2CTA?, A's source "gdesc" or "tmem") each."""
        return [(bool(two), a) for two, a in _MMA.findall(self.sass)]

    def scale_copies(self) -> list[tuple[bool, int]]:
        """UTCCP.T.S.4x32dp128bit (tcgen05.cp of a scale chunk into TMEM): (.2CTA?, TMEM column) each."""
        return [(bool(two), int(off or "0", 16)) for two, off in _SCALE_COPY.findall(self.sass)]

    def setmaxnreg(self) -> list[tuple[str, int]]:
        """(TRY_ALLOC or DEALLOC, registers) of every USETMAXREG."""
        return [(kind, int(value, 16)) for kind, value in _SETMAXNREG.findall(self.sass)]

    def tmem_alloc(self) -> tuple[int | None, int | None]:
        """(columns, cta_group) of the PTX's tcgen05.alloc (a register operand resolved through its mov)."""
        alloc = _ALLOC.search(self.ptx)
        if not alloc:
            return None, None
        value = alloc.group(2)
        if value.startswith("%"):
            mov = re.search(rf"mov\.(?:b|u)32\s+{re.escape(value)},\s*(\d+);", self.ptx)
            value = mov.group(1) if mov else None
        return (int(value) if value else None), int(alloc.group(1))

    def common_problems(self) -> list[str]:
        """What every sm100 kernel must satisfy: built for ARCH, no local memory, stack or spill traffic."""
        problems = []
        if f"-arch {ARCH}" not in self.elf:
            problems.append(f"cubin not built for {ARCH}")
        spills = len(re.findall(r"\b(STL|LDL)\b", self.sass))
        if self.local or self.stack or spills:
            problems.append(f"LOCAL {self.local}, STACK {self.stack}, {spills} STL / LDL: registers spill")
        return problems


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise SystemExit(f"{folder}: expected one {pattern}, found {[p.name for p in found]}")
    return found[0]


def compile_worker(family: Family, dump: Path, names: list[str], reuse: bool) -> None:
    """Runs in a process with CUTE_DSL_ARCH=sm_100f: compiles each variant, keeps cubin, PTX and meta.json."""
    import cutlass.cute as cute

    for fam, config in family.builds(names or None):
        out = dump / config.name
        if reuse and (out / "meta.json").exists():
            continue
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*"):
            old.unlink()
        kernel = importlib.import_module(fam.module(config)).make_kernel(config)
        t0 = time.time()
        options = f"--gpu-arch {ARCH} --keep-cubin --keep-ptx --dump-dir {out}"
        cute.compile(kernel.entry(), *kernel.fake_args(), options=options)
        meta = {f: getattr(kernel, f) for f in fam.meta_fields(config)}
        meta = {**json.loads(json.dumps(meta, default=int)), "seconds": round(time.time() - t0, 2)}
        (out / "meta.json").write_text(json.dumps(meta))
        print(f"[{ARCH}] {config.name}: {meta['seconds']:.2f} s", flush=True)


def main(family: Family, argv: list[str] | None = None, doc: str | None = None) -> int:
    """The checker's command line: compile (in a worker), check every chosen variant, write or compare the
    table; exit 1 when any variant has a problem or the table differs."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="folder for the cubins and PTX (DIR/<variant>/)")
    ap.add_argument("--only", action="append", help="check only these variants")
    ap.add_argument("--reuse", action="store_true", help="do not recompile variants already in --dump")
    ap.add_argument("--python", default=sys.executable, help="the Python with nvidia-cutlass-dsl (compiling)")
    ap.add_argument("--write-table", help="write the table to this file")
    ap.add_argument("--check-table", help="compare the table with this file (exit 1 when it differs)")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dump = Path(args.dump).resolve()
    names = args.only or []
    if args.worker:
        compile_worker(family, dump, names, args.reuse)
        return 0
    cmd = [args.python, str(family.tool), "--worker", "--dump", str(dump)] + [a for n in names for a in ("--only", n)]
    subprocess.run(cmd + (["--reuse"] if args.reuse else []), check=True, env={**os.environ, "CUTE_DSL_ARCH": ARCH})
    cuobjdump = find_cuobjdump(args.cuobjdump)
    rows, companion_rows, failed = {}, {}, 0
    for fam, config in family.builds(names or None):
        row, problems = fam.check(config, Compiled(dump / config.name, cuobjdump))
        (rows if fam is family else companion_rows)[config.name] = row
        failed += bool(problems)
        status = "ok" if not problems else "FAILED: " + "; ".join(problems)
        print(f"{config.name}{'' if fam is family else ' (companion)'}: {row} {status}")
    text = family.table(rows, companion_rows)
    if args.write_table:
        Path(args.write_table).write_text(text)
    if args.check_table and Path(args.check_table).read_text() != text:
        print(f"the table differs from {args.check_table}:\n{text}")
        failed += 1
    print(f"{len(rows)} variants checked, {failed} with problems")
    return 1 if failed else 0
