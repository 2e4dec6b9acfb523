#!/usr/bin/env python3
"""Compiles every Blackwell attention-backward variant and its pre-pass (kernels/sm100/attention_bwd_config.py)
for sm_100f and checks the cubins statically -- no GPU needed, and none of these kernels has run on one. The
sibling of tools/check_sm100.py (the MX GEMM's), whose cubin helpers it shares.

Per backward variant:
  arch      built with -arch sm_100f (one cubin for cc 10.0 and 10.3)
  mma       6 UTCQMMA sites (S^T in the prologue and the loop, dP^T, dV, dK, dQ; the K loop is a run-time
            loop), each with its two TMEM scale operands, none .2CTA, exactly 2 reading A from TMEM (dV, dK)
  scales    12 UTCCP.T.S.4x32dp128bit, at exactly the TMEM columns of the map's scale slots (SFA, SFB of S^T
            twice, dP^T, dV, dK, dQ)
  amax      CREDUX.MAXABS.F32.NAN for the dS blocks (2 per step: one per 32 x 32 block of the warp) and no
            float warp max without .NAN; dkv "mx": the integer column maxes (CREDUX.MAX) of the epilogue
  math      MUFU.EX2 (P), F2FP.SATFINITE.E4M3 (P, dS)
  local     LOCAL 0, STACK 0, no LDL / STL
  registers launch REG * 512 threads <= 64 K, and the setmaxnreg values are the config's per warpgroup
  smem      the storage struct's size (traced) equals config.smem_bytes; with the static part <= 227 KB
  tmem      the PTX's tcgen05.alloc column count equals the declared map's allocation (<= 512), the map is
            sound, and the DSL's accumulator / scale layouts are as wide as the map's regions
  loads     4 TMA tile loads (K, V, Q, dO) and 7 bulk scale-chunk copies
  dQ        fp32: a bulk reduce-add .F32; fp16: .F16; deterministic: the semaphore (an acquire load and a
            release add at GPU scope); fp16 deterministic: no bulk reduce, strong 16-byte loads and stores
Per pre-pass variant: arch, no local memory, one integer warp max per 32-column block, the E4M3 packs.
The per-variant table (registers, shared memory, TMEM, SASS size, predicted TFLOP/s from
kernels/sm100/attention_bwd_perf_model.py) is written (--write-table) or compared (--check-table).

Usage:
  python tools/check_sm100_attention.py --dump DIR [--only NAME ...] [--reuse] [--write-table F | --check-table F]
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

from check_sm100 import _RES, _one  # noqa: E402
from compare_sass import find_cuobjdump  # noqa: E402

from jax_mxfp8.kernels.sm100 import attention_bwd_perf_model as pm  # noqa: E402 (pure Python)
from jax_mxfp8.kernels.sm100.attention_bwd_config import (  # noqa: E402
    ATTENTION_BWD_PREPASS_VARIANTS,
    ATTENTION_BWD_SM100_VARIANTS,
    REGISTERS,
    sf_slot,
)
from jax_mxfp8.kernels.sm100.attention_geometry import ARCH, REGISTER_FILE, SMEM_LIMIT, THREADS  # noqa: E402
from jax_mxfp8.kernels.sm100.perf_model import B200, GB300  # noqa: E402

_UTCQMMA = re.compile(
    r"UTCQMMA(\.2CTA)?\s+(gdesc|tmem)\[\w+\],\s*gdesc\[\w+\],\s*tmem\[\w+\],\s*tmem\[\w+\],\s*idesc\[\w+\],\s*tmem\[\w+\]"
)
_UTCCP = re.compile(r"UTCCP\.T\.S(\.2CTA)?\.4x32dp128bit\s+tmem\[\w+(?:\+0x([0-9a-f]+))?\]")
_SETMAXREG = re.compile(r"USETMAXREG\.\w+\.CTAPOOL\s+(?:U?P\w+,\s*)?(0x[0-9a-f]+)")
_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/")
_ALLOC = re.compile(
    r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32\s+\[%r\d+(?:\+\d+)?\],\s*(%r\d+|\d+);"
)
_COLUMN_MAX = re.compile(r"CREDUX\.MAX\s")
"""The integer warp max (redux.sync.max.u32 of |x| bits): CREDUX.MAX without ABS / F32."""
SITES = ("S", "S", "dP", "dV", "dK", "dQ")
"""The GEMM issue sites of the MMA warp (S^T in the prologue and in the loop)."""
TABLE = ROOT / "docs" / "perf" / "blackwell_attention_bwd_variants.md"


def _variants(only):
    chosen = [v for v in (*ATTENTION_BWD_SM100_VARIANTS, *ATTENTION_BWD_PREPASS_VARIANTS) if not only or v.name in only]
    missing = set(only or ()) - {v.name for v in chosen}
    if missing:
        raise SystemExit(f"unknown variants: {sorted(missing)}")
    return chosen


# ---------------------------------------------------------------------------------------------- compile
def compile_worker(dump: Path, names: list[str], reuse: bool) -> None:
    """Runs in a process with CUTE_DSL_ARCH=sm_100f: compiles each variant, keeps cubin and PTX."""
    import cutlass.cute as cute

    from jax_mxfp8.kernels.sm100 import attention_bwd, attention_bwd_prepass

    for config in _variants(names):
        out = dump / config.name
        if reuse and (out / "meta.json").exists():
            continue
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*"):
            old.unlink()
        prepass = config in ATTENTION_BWD_PREPASS_VARIANTS
        kernel = (attention_bwd_prepass if prepass else attention_bwd).make_kernel(config)
        t0 = time.time()
        cute.compile(
            kernel.entry(), *kernel.fake_args(), options=f"--gpu-arch {ARCH} --keep-cubin --keep-ptx --dump-dir {out}"
        )
        meta = {"seconds": round(time.time() - t0, 2)}
        if not prepass:
            meta["smem_struct_bytes"] = int(kernel.smem_struct_bytes)
            meta["tmem_layout_columns"] = kernel.tmem_layout_columns
        (out / "meta.json").write_text(json.dumps(meta))
        print(f"[{ARCH}] {config.name}: {meta['seconds']:.2f} s", flush=True)


def compile_all(dump: Path, names: list[str], reuse: bool, python: str) -> None:
    cmd = [python, __file__, "--worker", "--dump", str(dump)] + [a for n in names for a in ("--only", n)]
    cmd += ["--reuse"] if reuse else []
    subprocess.run(cmd, check=True, env={**os.environ, "CUTE_DSL_ARCH": ARCH})


# ------------------------------------------------------------------------------------------------ checks
def _common(folder: Path, cuobjdump: str):
    """(sass text, ptx text, meta, (reg, stack, static smem, local), problems) of one compiled variant."""
    cubin, ptx_text = _one(folder, "*.cubin"), _one(folder, "*.ptx").read_text()
    run = lambda *a: subprocess.run([cuobjdump, *a, str(cubin)], capture_output=True, text=True, check=True)  # noqa: E731
    sass = run("-sass").stdout
    usage = tuple(map(int, _RES.search(run("-res-usage").stdout).groups()))
    problems = []
    if f"-arch {ARCH}" not in run("-elf").stdout:
        problems.append(f"cubin not built for {ARCH}")
    reg, stack, _, local = usage
    if local or stack or re.search(r"\b(LDL|STL)\b", sass):
        problems.append(f"LOCAL {local}, STACK {stack}: registers spill")
    meta = json.loads((folder / "meta.json").read_text())
    return sass, ptx_text, meta, usage, problems


def _alloc_columns(ptx_text: str) -> int | None:
    alloc = _ALLOC.search(ptx_text)
    if not alloc:
        return None
    value = alloc.group(1)
    if value.startswith("%"):
        mov = re.search(rf"mov\.(?:b|u)32\s+{re.escape(value)},\s*(\d+);", ptx_text)
        return int(mov.group(1)) if mov else None
    return int(value)


def check_bwd(config, dump: Path, cuobjdump: str) -> tuple[dict, list[str]]:
    """(the table row's measured values, problems) of one backward variant."""
    sass, ptx_text, meta, (reg, _, static_smem, _), problems = _common(dump / config.name, cuobjdump)
    mmas = _UTCQMMA.findall(sass)
    if len(mmas) != len(SITES) or any(two for two, _ in mmas) or [a for _, a in mmas].count("tmem") != 2:
        problems.append(f"UTCQMMA sites {mmas}: want {len(SITES)} with TMEM scales, 2 with A from TMEM, no .2CTA")
    copies = _UTCCP.findall(sass)
    want = sorted(col for gemm in SITES for col in sf_slot(config.head_dim, gemm))
    if sorted(int(off or "0", 16) for _, off in copies) != want or any(two for two, _ in copies):
        problems.append(f"UTCCP scale copies at {[off for _, off in copies]}: want the slots {want}")
    if sass.count("CREDUX.MAXABS.F32.NAN") != 2 or re.search(r"CREDUX\.MAX\w*\.F32(?!\.NAN)", sass):
        problems.append("dS block amax: want 2 CREDUX.MAXABS.F32.NAN and no NaN-dropping float warp max")
    columns = len(_COLUMN_MAX.findall(sass))
    if columns != (config.head_dim if config.dkv == "mx" else 0):
        problems.append(f"{columns} integer column warp maxes (dkv {config.dkv!r}: want {config.head_dim})")
    for op in ("MUFU.EX2", "F2FP.SATFINITE.E4M3"):
        if op not in sass:
            problems.append(f"no {op}")
    if reg * THREADS > REGISTER_FILE:
        problems.append(f"{reg} registers x {THREADS} threads at launch")
    setmax = sorted(int(x, 16) for x in _SETMAXREG.findall(sass))
    if setmax != sorted(REGISTERS.values()):
        problems.append(f"setmaxnreg {setmax}: want {sorted(REGISTERS.values())}")
    smem = meta["smem_struct_bytes"]
    if smem != config.smem_bytes or smem + static_smem > SMEM_LIMIT:
        problems.append(f"storage struct {smem} B (config {config.smem_bytes}) + {static_smem} static vs {SMEM_LIMIT}")
    tmem = config.tmem_map()
    cols = _alloc_columns(ptx_text)
    if cols != tmem.alloc_columns or cols > 512:
        problems.append(f"tcgen05.alloc of {cols} columns; map: {tmem.alloc_columns}")
    problems += tmem.problems()
    widths = {r.name.split("@")[0]: r.cols for r in tmem.regions}
    region = {"S": "S^T", "dP": "dP^T", "dV": "dV", "dK": "dK", "dQ": "dQ"}
    for gemm, name in region.items():
        layout = meta["tmem_layout_columns"]
        scale_cols = layout[f"sfa_{gemm}"] + layout[f"sfb_{gemm}"]
        if layout[f"acc_{gemm}"] != widths[name] or scale_cols != widths[f"SF_{gemm}"]:
            problems.append(f"{gemm}: the DSL's TMEM layouts {layout} vs the map's {name}, SF_{gemm}")
    if sass.count("UTMALDG") != 4 or sass.count("UBLKCP") != 7:
        loads = f"{sass.count('UTMALDG')} TMA tile loads (want 4), {sass.count('UBLKCP')} bulk copies (want 7)"
        problems.append(loads)
    problems += _dq_problems(config, sass)
    return {"reg": reg, "smem": smem + static_smem, "tmem": cols, "sass": _instructions(sass)}, problems


def _instructions(sass: str) -> int:
    return len([ln for ln in sass.splitlines() if _INSTR.match(ln)])


def _dq_problems(config, sass: str) -> list[str]:
    reduce_f32, reduce_f16 = "UBLKRED.G.S.ADD.F32" in sass, "UBLKRED.G.S.ADD.F16" in sass
    ordered = "LDG.E.STRONG.GPU" in sass and "REDG.E.ADD.S32.STRONG.GPU" in sass
    f16_rmw = "LDG.E.128.STRONG.GPU" in sass and "STG.E.128.STRONG.GPU" in sass
    want = {
        ("fp32", False): (True, False, False, False),
        ("fp16", False): (False, True, False, False),
        ("fp32", True): (True, False, True, False),
        ("fp16", True): (False, False, True, True),
    }[(config.dq_accum, config.deterministic)]
    got = (reduce_f32, reduce_f16, ordered, f16_rmw)
    if got == want:
        return []
    return [f"dQ path (f32 reduce, f16 reduce, semaphore, f16 read-add-write) {got}, want {want}"]


def check_prepass(config, dump: Path, cuobjdump: str) -> tuple[dict, list[str]]:
    sass, _, _, (reg, _, static_smem, _), problems = _common(dump / config.name, cuobjdump)
    blocks = config.head_dim // 32
    if len(_COLUMN_MAX.findall(sass)) != blocks:
        problems.append(f"want {blocks} integer warp maxes (one per 32-column block)")
    if sass.count("F2FP.SATFINITE.E4M3") != config.head_dim // 2:
        problems.append(f"want {config.head_dim // 2} E4M3 packs (two elements each)")
    return {"reg": reg, "smem": static_smem, "sass": _instructions(sass)}, problems


# ------------------------------------------------------------------------------------------------- table
def _pred(config, gpu) -> str:
    problem = pm.table_problem(config)
    return f"{pm.predict_bwd(config, problem, gpu):.0f} / {pm.predict_train(config, problem, gpu):.0f}"


def table(rows: dict) -> str:
    out = [
        "# Blackwell MXFP8 attention backward variants: resources and predicted throughput",
        "",
        "Compiled for sm_100f and checked by tools/check_sm100_attention.py; the model is",
        "kernels/sm100/attention_bwd_perf_model.py ([blackwell-attention.md](blackwell-attention.md) section 6).",
        "NOT RUN ON HARDWARE: every TFLOP/s figure here is a prediction.",
        "",
        "## Backward",
        "",
        f"setmaxnreg per warpgroup: reduce {REGISTERS['reduce']}, compute {REGISTERS['compute']}, MMA / load "
        f"{REGISTERS['other']} (every variant). Predictions: backward / forward + backward TFLOP/s at B2 T = S = "
        "8192 N = K = 16 (packed: 64 sequences of 512 .. 16384, N = K = 4).",
        "",
        "| variant | registers at launch | shared memory (B) | TMEM columns | SASS instructions | "
        "predicted B200 | predicted GB300 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in ATTENTION_BWD_SM100_VARIANTS:
        if config.name in rows:
            r = rows[config.name]
            used = config.tmem_map().used_columns
            out.append(
                f"| {config.name} | {r['reg']} | {r['smem']} | {used} of {r['tmem']} | {r['sass']} | "
                f"{_pred(config, B200)} | {_pred(config, GB300)} |"
            )
    out += ["", "## Pre-pass (dO quantize + Delta)", ""]
    out.append("| variant | registers | static shared memory (B) | SASS instructions |")
    out.append("| --- | --- | --- | --- |")
    for config in ATTENTION_BWD_PREPASS_VARIANTS:
        if config.name in rows:
            r = rows[config.name]
            out.append(f"| {config.name} | {r['reg']} | {r['smem']} | {r['sass']} |")
    out += [
        "",
        "Generated by tools/check_sm100_attention.py from the compiled cubins and the model. Predictions, not "
        "measurements: none of these kernels has run on a GPU.",
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
    for config in _variants(names):
        check = check_prepass if config in ATTENTION_BWD_PREPASS_VARIANTS else check_bwd
        rows[config.name], problems = check(config, dump, cuobjdump)
        failed += bool(problems)
        print(f"{config.name}: {rows[config.name]} " + ("ok" if not problems else "FAILED: " + "; ".join(problems)))
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
