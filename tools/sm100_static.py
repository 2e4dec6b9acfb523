"""The shared machinery of the Blackwell (sm_100f) static checkers -- compile, read the cubins, the common
checks, the table and the command line -- with one Family per kernel family (per-family hooks):

  tools/check_sm100.py               the MX GEMM            table docs/perf/blackwell_gemm_variants.md
  tools/check_sm100_attention_fwd.py the attention forward  table docs/perf/blackwell_attention_fwd_variants.md
  tools/check_sm100_attention_bwd.py the attention backward table docs/perf/blackwell_attention_bwd_variants.md
                                     and its pre-pass

A Family names its variants (frozen configs with a `name`), the module whose make_kernel(config) builds a
variant's kernel object in the compiling process (`module(config)`: an object with entry(), fake_args() and,
where a check needs traced facts beyond the cubin, build_facts()), how to check one compiled variant
(`check(config, Compiled)` -> (its table row, problems)) and how to render the table (`table(rows,
companion_rows)`). `companions(configs)` lists variants of other families a table needs (the backward's
forward + backward prediction takes the compiled forward's instruction counts): they are compiled and
checked with their own family's hooks.

Compiling runs in a subprocess of the family's tool with CUTE_DSL_ARCH=sm_100f (the DSL reads the target at
import): `cute.compile(kernel.entry(), *kernel.fake_args(), options="--gpu-arch sm_100f --keep-cubin
--keep-ptx --dump-dir DIR/<variant>")`, then write_facts: DIR/<variant>/facts.json (FACTS) holds the kernel
object's build_facts(). The library build (tools/build_kernels.py) dumps every variant the same way under
<out>/<arch>/dump/<variant>/, so DIR may be its sm_100f dump: --reuse skips variants whose facts.json exists
(no compiling process at all when every one does), and --all also checks every other registry variant built
for sm_100f that the library build compiled (the quantize family, the RMSNorm and the operand producers, and
for the attention checkers the MX GEMM): built for sm_100f, no local memory, at most 255 registers. No GPU is
needed, and none of these kernels has run on one. cuobjdump comes from PATH or the nvidia-cuda-cuobjdump
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

from jax_mxfp8.kernels import registry  # noqa: E402 (pure Python, no DSL)
from jax_mxfp8.kernels.registry.gemm_sm100 import ARCH  # noqa: E402 (sm_100f: one cubin for cc 10.0 and 10.3)

FACTS = "facts.json"
"""A compiled variant's traced facts, next to its cubin and PTX (write_facts; Compiled.facts)."""
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
    """One compiled variant in DIR/<name>/: its cubin's SASS and resource usage, its PTX and its traced facts
    (FACTS, `facts`)."""

    def __init__(self, folder: Path, cuobjdump: str):
        self.folder = folder
        self.cubin = _one(folder, "*.cubin")
        self.ptx = _one(folder, "*.ptx").read_text()
        self.facts = json.loads((folder / FACTS).read_text())
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


def write_facts(kernel, folder: Path) -> None:
    """folder/FACTS: the traced kernel object's build_facts() ({} for a kernel without one), written after
    the compile that dumped its cubin and PTX into folder (here and in tools/build_kernels.py)."""
    facts = kernel.build_facts() if hasattr(kernel, "build_facts") else {}
    (folder / FACTS).write_text(json.dumps(facts, default=int))


def compile_worker(family: Family, dump: Path, names: list[str], reuse: bool) -> None:
    """Runs in a process with CUTE_DSL_ARCH=sm_100f: compiles each variant, keeps cubin, PTX and FACTS."""
    import cutlass.cute as cute

    for fam, config in family.builds(names or None):
        out = dump / config.name
        if reuse and (out / FACTS).exists():
            continue
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*"):
            old.unlink()
        kernel = importlib.import_module(fam.module(config)).make_kernel(config)
        t0 = time.time()
        options = f"--gpu-arch {ARCH} --keep-cubin --keep-ptx --dump-dir {out}"
        cute.compile(kernel.entry(), *kernel.fake_args(), options=options)
        write_facts(kernel, out)
        print(f"[{ARCH}] {config.name}: {time.time() - t0:.2f} s", flush=True)


def other_variants(family: Family, dump: Path) -> list[str]:
    """The registry's other sm_100f variants (--all): every production one, and the comparison schedules the
    library build compiled (with --with-tunes) into dump."""
    own = {v.name for v in family.variants}
    return [
        v.name
        for v in registry.variants(with_tunes=True)
        if ARCH in v.archs and v.name not in own and (v.tune == 0 or (dump / v.name).is_dir())
    ]


def check_built_variant(folder: Path, cuobjdump: str) -> list[str]:
    """Problems of another family's variant the library build compiled into folder (--all): the common
    checks (built for ARCH, no local memory) and at most 255 registers."""
    if not (folder / FACTS).exists():
        return [f"{folder} is missing or incomplete (build the library first: tools/build_library.py)"]
    c = Compiled(folder, cuobjdump)
    problems = c.common_problems()
    if c.registers > 255:
        problems.append(f"{c.registers} registers")
    return problems


def main(family: Family, argv: list[str] | None = None, doc: str | None = None) -> int:
    """The checker's command line: compile (in a worker), check every chosen variant, write or compare the
    table; exit 1 when any variant has a problem or the table differs."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="folder for the cubins and PTX (DIR/<variant>/)")
    ap.add_argument("--only", action="append", help="check only these variants")
    ap.add_argument("--reuse", action="store_true", help="do not recompile variants already in --dump")
    ap.add_argument("--all", action="store_true", help="also check the registry's other sm_100f variants in --dump")
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
    builds = family.builds(names or None)
    if not (args.reuse and all((dump / config.name / FACTS).exists() for _, config in builds)):
        cmd = [args.python, str(family.tool), "--worker", "--dump", str(dump)]
        cmd += [a for n in names for a in ("--only", n)] + (["--reuse"] if args.reuse else [])
        subprocess.run(cmd, check=True, env={**os.environ, "CUTE_DSL_ARCH": ARCH})
    cuobjdump = find_cuobjdump(args.cuobjdump)
    rows, companion_rows, failed = {}, {}, 0
    for fam, config in builds:
        row, problems = fam.check(config, Compiled(dump / config.name, cuobjdump))
        (rows if fam is family else companion_rows)[config.name] = row
        failed += bool(problems)
        status = "ok" if not problems else "FAILED: " + "; ".join(problems)
        print(f"{config.name}{'' if fam is family else ' (companion)'}: {row} {status}")
    if args.all:
        others = other_variants(family, dump)
        for name in others:
            problems = check_built_variant(dump / name, cuobjdump)
            failed += bool(problems)
            if problems:
                print(f"{name}: FAILED: " + "; ".join(problems))
        print(f"{len(others)} other sm_100f variants checked (arch, no local memory, registers)")
    text = family.table(rows, companion_rows)
    if args.write_table:
        Path(args.write_table).write_text(text)
    if args.check_table and Path(args.check_table).read_text() != text:
        print(f"the table differs from {args.check_table}:\n{text}")
        failed += 1
    print(f"{len(rows)} variants checked, {failed} with problems")
    return 1 if failed else 0
