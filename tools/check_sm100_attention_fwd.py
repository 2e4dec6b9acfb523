#!/usr/bin/env python3
"""Compiles every Blackwell attention forward variant (kernels/sm100/attention_fwd_config.py) for sm_100f and
checks the cubins statically -- no GPU needed, and none of these kernels has run on one. The sibling of
tools/check_sm100.py (the MX GEMM's), whose helpers it reuses.

Per variant:
  arch      the cubin was built with -arch sm_100f (one cubin for cc 10.0 and 10.3)
  mma       UTCQMMA with TMEM scale operands (..., tmem[D], tmem[SFA], idesc, tmem[SFB]): the QK form (A and B
            from shared memory, head_dim / 32 per issue) at its 4 issue sites and the PV form (A = P from
            TMEM, 4 per issue) at its 6 (the MMA warp's start, steady and end steps)
  scales    UTCCP.T.S.4x32dp128bit (tcgen05.cp), 2 per MMA issue site, at exactly the TMEM columns of the
            declared map's scale slots (config.scale_copy_columns)
  local     `cuobjdump -res-usage`: LOCAL 0, STACK 0, no STL / LDL and no CALL but to the DSL's trap stubs
            (no spills, no slow-path subroutine)
  registers REG x 512 threads fits the register file, and the SASS sets exactly the per-role budgets
            (USETMAXREG: softmax TRY_ALLOC, correction and other DEALLOC), whose sum over the 16 warps is
            the 64 K registers of the SM
  smem      the storage struct's size (traced) equals config.smem_bytes; with the static part <= 227 KB
  tmem      the PTX's tcgen05.alloc column count equals the declared map's allocation (512), the map has no
            overlapping live regions (tmem_map.TmemMap.problems), every scale TMEM tensor spans SF_COLS
            columns (traced DSL layouts)
  softmax   MUFU.EX2 for P~ and alpha, F2FP.SATFINITE.E4M3 for P, tcgen05.ld/st (LDTM / STTM) of S and P;
            p_scale "block": the NaN-keeping FMNMX of the block amax
and the per-variant table (registers, shared memory, TMEM, softmax instructions per tile, predicted TFLOP/s
on B200 and GB300 from kernels/sm100/attention_fwd_perf_model.py) is written (--write-table) or compared
(--check-table).

Usage:
  python tools/check_sm100_attention_fwd.py --dump DIR [--only NAME ...] [--reuse] [--write-table F | --check-table F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from check_sm100 import _ALLOC, _RES, _one  # noqa: E402
from compare_sass import find_cuobjdump  # noqa: E402

from jax_mxfp8.kernels.sm100 import attention_fwd_perf_model as model  # noqa: E402 (pure Python, no DSL)
from jax_mxfp8.kernels.sm100.attention_fwd_config import ATTENTION_FWD_SM100_VARIANTS, MMA_K, REGISTERS  # noqa: E402
from jax_mxfp8.kernels.sm100.attention_geometry import ARCH, REGISTER_FILE, SMEM_LIMIT, THREADS  # noqa: E402
from jax_mxfp8.kernels.sm100.attention_tmem import SF_COLS  # noqa: E402

QK_SITES, PV_SITES = 4, 6
"""MMA issue sites in the MMA warp's code (start: pending PV_s + QK_s; steady: PV_s + QK_s; end: PV_s)."""
_MMA = re.compile(
    r"UTCQMMA\s+(gdesc|tmem)\[\w+\],\s*gdesc\[\w+\],\s*tmem\[\w+\],\s*tmem\[\w+\],\s*idesc\[\w+\],\s*tmem\[\w+\]"
)
_CP = re.compile(r"UTCCP\.T\.S\.4x32dp128bit\s+tmem\[\w+(?:\+0x([0-9a-f]+))?\]")
_MAXREG = re.compile(r"USETMAXREG\.(TRY_ALLOC|DEALLOC)\.CTAPOOL\s+(?:UP\d, )?0x([0-9a-f]+)")
_ADDR_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([^;]*)")


def variants(only: list[str] | None):
    chosen = [v for v in ATTENTION_FWD_SM100_VARIANTS if not only or v.name in only]
    missing = set(only or ()) - {v.name for v in chosen}
    if missing:
        raise SystemExit(f"unknown variants: {sorted(missing)}")
    return chosen


# ------------------------------------------------------------------------------------------------ compile
def compile_worker(dump: Path, names: list[str], reuse: bool) -> None:
    """Runs in a process with CUTE_DSL_ARCH=sm_100f: compiles each variant, keeps cubin and PTX."""
    import cutlass.cute as cute

    from jax_mxfp8.kernels.sm100.attention_fwd import make_kernel

    for config in variants(names):
        out = dump / config.name
        if reuse and (out / "meta.json").exists():
            continue
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*"):
            old.unlink()
        kernel = make_kernel(config)
        t0 = time.time()
        cute.compile(
            kernel.entry(), *kernel.fake_args(), options=f"--gpu-arch {ARCH} --keep-cubin --keep-ptx --dump-dir {out}"
        )
        meta = {
            "smem_struct_bytes": int(kernel.smem_struct_bytes),
            "sf_tmem_columns": kernel.sf_tmem_columns,
            "stage_bytes": kernel.stage_bytes,
            "seconds": round(time.time() - t0, 2),
        }
        (out / "meta.json").write_text(json.dumps(meta))
        print(f"[{ARCH}] {config.name}: {meta['seconds']:.2f} s", flush=True)


def compile_all(dump: Path, names: list[str], reuse: bool, python: str) -> None:
    cmd = [python, __file__, "--worker", "--dump", str(dump)] + [a for n in names for a in ("--only", n)]
    cmd += ["--reuse"] if reuse else []
    subprocess.run(cmd, check=True, env={**os.environ, "CUTE_DSL_ARCH": ARCH})


# ------------------------------------------------------------------------------------------------- checks
def softmax_instructions(sass: list[str]) -> tuple[int, int]:
    """SASS instructions of one softmax tile of one warp, (unmasked, masked): in the softmax region (after the
    USETMAXREG.TRY_ALLOC), from the S load (the first LDTM.x32) to the branch between the two paths (the last
    BRA before the first MUFU.EX2), then each path from its first instruction (the fall-through, the branch
    target) to the end of its P store (its 4th STTM.x8). The masked path is the one with the selects."""
    ins = [(int(m.group(1), 16), m.group(2)) for line in sass if (m := _ADDR_INSTR.match(line))]
    ops, addrs = [op for _, op in ins], [a for a, _ in ins]
    start = next(i for i, op in enumerate(ops) if op.startswith("USETMAXREG.TRY_ALLOC"))
    load = next(i for i in range(start, len(ops)) if ops[i].startswith("LDTM.x32"))
    first_exp = next(i for i in range(load, len(ops)) if ops[i].startswith("MUFU.EX2"))
    branch = max(i for i in range(load, first_exp) if re.search(r"\bBRA\b", ops[i]))
    target = addrs.index(int(re.search(r"0x([0-9a-f]+)", ops[branch]).group(1), 16))

    def path(i: int) -> tuple[int, int]:
        stores = 0
        begin = i
        while stores < 4:
            stores += ops[i].startswith("STTM.x8")
            i += 1
        selects = sum(ops[k].startswith("FSEL") for k in range(begin, i))
        return (branch + 1 - load) + (i - begin), selects

    paths = sorted((path(branch + 1), path(target)), key=lambda p: p[1])
    return paths[0][0], paths[1][0]


def subroutine_calls(sass: list[str]) -> int:
    """CALLs into real subroutines (a slow path's calling convention costs registers), not counting the
    DSL's trap stubs (a CALL whose target is BPT.TRAP)."""
    at = {}
    for line in sass:
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(\S+)", line)
        if m:
            at[int(m.group(1), 16)] = m.group(2)
    targets = [int(t, 16) for t in re.findall(r"CALL\.\S+\s+0x([0-9a-f]+)", "\n".join(sass))]
    return sum(1 for t in targets if at.get(t) != "BPT.TRAP")


def check_variant(config, dump: Path, cuobjdump: str) -> tuple[dict, list[str]]:
    """(the table row's measured values, problems) of one compiled variant."""
    folder = dump / config.name
    cubin, ptx_text = _one(folder, "*.cubin"), _one(folder, "*.ptx").read_text()
    meta = json.loads((folder / "meta.json").read_text())
    run = lambda *args: subprocess.run([cuobjdump, *args, str(cubin)], capture_output=True, text=True, check=True)  # noqa: E731
    sass = run("-sass").stdout.splitlines()
    text = "\n".join(sass)
    reg, stack, static_smem, local = map(int, _RES.search(run("-res-usage").stdout).groups())
    problems = []
    if f"-arch {ARCH}" not in run("-elf").stdout:
        problems.append(f"cubin not built for {ARCH}")
    forms = _MMA.findall(text)
    want = {"gdesc": QK_SITES * config.head_dim // MMA_K, "tmem": PV_SITES * 128 // MMA_K}
    got = {f: forms.count(f) for f in want}
    if got != want or text.count("UTCQMMA") != len(forms):
        problems.append(f"UTCQMMA with TMEM scale operands: {got} (of {text.count('UTCQMMA')}), want {want}")
    copies = sorted(int(off or "0", 16) for off in _CP.findall(text))
    declared = config.scale_copy_columns
    if len(copies) != 2 * (QK_SITES + PV_SITES) or set(copies) != set(declared):
        problems.append(f"UTCCP at TMEM columns {copies}: want 2 per MMA issue site, at {declared}")
    spills = len(re.findall(r"\b(STL|LDL)\b", text))
    calls = subroutine_calls(sass)
    if local or stack or spills or calls:
        problems.append(f"LOCAL {local}, STACK {stack}, {spills} STL/LDL, {calls} subroutine calls")
    if reg * THREADS > REGISTER_FILE:
        problems.append(f"{reg} registers x {THREADS} threads > {REGISTER_FILE}")
    budgets = sorted((kind, int(v, 16)) for kind, v in _MAXREG.findall(text))
    want_budgets = sorted([("TRY_ALLOC", REGISTERS["softmax"]), ("DEALLOC", REGISTERS["correction"]),
                           ("DEALLOC", REGISTERS["other"])])  # fmt: skip
    if budgets != want_budgets:
        problems.append(f"setmaxnreg budgets {budgets}, want {want_budgets}")
    smem = meta["smem_struct_bytes"]
    if smem != config.smem_bytes:
        problems.append(f"storage struct {smem} B != config.smem_bytes {config.smem_bytes}")
    if smem + static_smem > SMEM_LIMIT:
        problems.append(f"shared memory {smem} + {static_smem} static > {SMEM_LIMIT}")
    if set(meta["stage_bytes"].values()) != set(config.tx_bytes.values()):
        problems.append(f"TMA stage bytes {meta['stage_bytes']} != config.tx_bytes {config.tx_bytes}")
    alloc = _ALLOC.search(ptx_text)
    cols = None
    if alloc:
        value = alloc.group(2)
        if value.startswith("%"):
            mov = re.search(rf"mov\.(?:b|u)32\s+{re.escape(value)},\s*(\d+);", ptx_text)
            value = mov.group(1) if mov else None
        cols = int(value) if value else None
    if cols is None or cols != config.tmem_alloc_columns or int(alloc.group(1)) != 1:
        problems.append(f"tcgen05.alloc of {cols} columns; the declared map allocates {config.tmem_alloc_columns}")
    problems += config.tmem_map().problems()
    if config.ordered_tmem_map().conflicts(assume_in_order=True):
        problems.append("the ordered TMEM map has overlapping live regions")
    if set(meta["sf_tmem_columns"]) != {SF_COLS}:
        problems.append(f"the DSL's scale TMEM layouts span {meta['sf_tmem_columns']} columns, the map {SF_COLS}")
    for op in ("MUFU.EX2", "F2FP.SATFINITE.E4M3", "LDTM.x32", "STTM.x8"):
        if op not in text:
            problems.append(f"no {op} in the SASS")
    if config.p_scale == "block" and not re.search(r"FMNMX[\w.]*\.NAN", text):
        problems.append("p_scale 'block': no NaN-keeping FMNMX (the block amax)")
    unmasked, masked = softmax_instructions(sass)
    row = {"reg": reg, "smem": smem + static_smem, "tmem": cols, "softmax": unmasked, "masked": masked}
    return row, problems


# -------------------------------------------------------------------------------------------------- table
def table(rows: dict) -> str:
    """The generated Markdown table of every checked variant."""
    budget = f"{REGISTERS['softmax']} / {REGISTERS['correction']} / {REGISTERS['other']}"
    out = [
        "# Blackwell MXFP8 attention forward variants: resources and predicted throughput",
        "",
        "Compiled for sm_100f and checked by tools/check_sm100_attention_fwd.py; the model and its assumptions are",
        "kernels/sm100/attention_fwd_perf_model.py and [blackwell-attention.md](blackwell-attention.md) section 6.",
        "NOT RUN ON HARDWARE: every TFLOP/s figure here is a prediction.",
        "",
        f"Registers: REG is the launch allocation (512 threads); the warp roles run with setmaxnreg budgets "
        f"softmax / correction / other = {budget} per thread.",
        "",
        "| variant | registers | shared memory (B) | TMEM columns | softmax instr / tile (masked) | "
        "predicted TFLOP/s B200 | predicted TFLOP/s GB300 | shape |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in ATTENTION_FWD_SM100_VARIANTS:
        if config.name not in rows:
            continue
        r = rows[config.name]
        shape = model.table_shape(config)
        instructions = (r["softmax"], r["masked"])
        preds = [model.describe(model.predict_fwd(config, shape, gpu, instructions)) for gpu in model.GPUS]
        heads, _, batch, lengths = shape
        where = f"N{heads} {'64 x U[512, 16k]' if config.packed else f'B{batch} T{lengths[0]}'}"
        out.append(
            f"| {config.name} | {r['reg']} | {r['smem']} | {config.tmem_map().used_columns} of {r['tmem']} | "
            f"{r['softmax']} ({r['masked']}) | {preds[0]} | {preds[1]} | {where} |"
        )
    out += [
        "",
        "In parentheses what bounds a unit (one Q tile against one KV tile): mma, mufu (the exponentials) or issue "
        "(the softmax warps' instructions).",
        "Generated by tools/check_sm100_attention_fwd.py from the compiled cubins; predictions, not measurements.",
    ]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
        compile_worker(dump, names, args.reuse)
        return 0
    compile_all(dump, names, args.reuse, args.python)
    cuobjdump = find_cuobjdump(args.cuobjdump)
    rows, failed = {}, 0
    for config in variants(names):
        rows[config.name], problems = check_variant(config, dump, cuobjdump)
        status = "ok" if not problems else "FAILED: " + "; ".join(problems)
        failed += bool(problems)
        print(f"{config.name}: {rows[config.name]} {status}")
    text = table(rows)
    if args.write_table:
        Path(args.write_table).write_text(text)
    if args.check_table and Path(args.check_table).read_text() != text:
        print(f"the table differs from {args.check_table}:\n{text}")
        failed += 1
    print(f"{len(rows)} variants checked, {failed} with problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
