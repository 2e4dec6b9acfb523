#!/usr/bin/env python3
"""Compiles every Blackwell attention forward variant (kernels/sm100/attention_fwd_config.py) for sm_100f and
checks the cubins statically -- no GPU needed, and none of these kernels has run on one. The sibling of
tools/check_sm100.py (the MX GEMM's) on the shared machinery of tools/sm100_static.py.

Per variant:
  arch      the cubin was built with -arch sm_100f (one cubin for cc 10.0 and 10.3)
  mma       UTCQMMA with TMEM scale operands (..., tmem[D], tmem[SFA], idesc, tmem[SFB]): the QK form (A and B
            from shared memory, head_dim / 32 per issue) at its 4 issue sites and the PV form (A = P from
            TMEM, 4 per issue) at its 6 (the MMA warp's start, steady and end steps)
  scales    UTCCP.T.S.4x32dp128bit (tcgen05.cp), 2 per MMA issue site, at exactly the TMEM columns of the
            declared map's scale slots (config.scale_copy_columns)
  local     `cuobjdump -res-usage`: LOCAL 0, STACK 0, no STL / LDL (sm100_static's common checks) and no
            CALL but to the DSL's trap stubs (no slow-path subroutine)
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
  python tools/check_sm100_attention_fwd.py --dump DIR [--only NAME ...] [--reuse] [--all]
      [--write-table F | --check-table F]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sm100_static import Compiled, Family, main  # noqa: E402

from jax_mxfp8.kernels.sm100 import attention_fwd_perf_model as model  # noqa: E402 (pure Python, no DSL)
from jax_mxfp8.kernels.sm100.attention_fwd_config import (  # noqa: E402
    ATTENTION_FWD_SM100_VARIANTS,
    MMA_K,
    REGISTERS,
)
from jax_mxfp8.kernels.sm100.attention_geometry import REGISTER_FILE, SMEM_LIMIT, THREADS  # noqa: E402
from jax_mxfp8.kernels.sm100.attention_tmem import SF_COLS  # noqa: E402

QK_SITES, PV_SITES = 4, 6
"""MMA issue sites in the MMA warp's code (start: pending PV_s + QK_s; steady: PV_s + QK_s; end: PV_s)."""


def softmax_instructions(ins: list[tuple[int, str]]) -> tuple[int, int]:
    """SASS instructions of one softmax tile of one warp, (unmasked, masked): in the softmax region (after the
    USETMAXREG.TRY_ALLOC), from the S load (the first LDTM.x32) to the branch between the two paths (the last
    BRA before the first MUFU.EX2), then each path from its first instruction (the fall-through, the branch
    target) to the end of its P store (its 4th STTM.x8). The masked path is the one with the selects."""
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


def subroutine_calls(c: Compiled) -> int:
    """CALLs into real subroutines (a slow path's calling convention costs registers), not counting the
    DSL's trap stubs (a CALL whose target is BPT.TRAP)."""
    at = {addr: op.split()[0] for addr, op in c.instructions() if op}
    targets = [int(t, 16) for t in re.findall(r"CALL\.\S+\s+0x([0-9a-f]+)", c.sass)]
    return sum(1 for t in targets if at.get(t) != "BPT.TRAP")


def check_variant(config, c: Compiled) -> tuple[dict, list[str]]:
    """(the table row's measured values, problems) of one compiled variant."""
    text, reg, static_smem, facts = c.sass, c.registers, c.static_smem, c.facts
    problems = c.common_problems()
    forms = [a for two, a in c.mma_sites() if not two]
    want = {"gdesc": QK_SITES * config.head_dim // MMA_K, "tmem": PV_SITES * 128 // MMA_K}
    got = {f: forms.count(f) for f in want}
    if got != want or text.count("UTCQMMA") != len(forms):
        problems.append(f"UTCQMMA with TMEM scale operands: {got} (of {text.count('UTCQMMA')}), want {want}")
    copies = sorted(col for two, col in c.scale_copies() if not two)
    declared = config.scale_copy_columns
    if len(copies) != 2 * (QK_SITES + PV_SITES) or set(copies) != set(declared):
        problems.append(f"UTCCP at TMEM columns {copies}: want 2 per MMA issue site, at {declared}")
    calls = subroutine_calls(c)
    if calls:
        problems.append(f"{calls} subroutine calls")
    if reg * THREADS > REGISTER_FILE:
        problems.append(f"{reg} registers x {THREADS} threads > {REGISTER_FILE}")
    budgets = sorted(c.setmaxnreg())
    want_budgets = sorted([("TRY_ALLOC", REGISTERS["softmax"]), ("DEALLOC", REGISTERS["correction"]),
                           ("DEALLOC", REGISTERS["other"])])  # fmt: skip
    if budgets != want_budgets:
        problems.append(f"setmaxnreg budgets {budgets}, want {want_budgets}")
    smem = facts["smem_struct_bytes"]
    if smem != config.smem_bytes:
        problems.append(f"storage struct {smem} B != config.smem_bytes {config.smem_bytes}")
    if smem + static_smem > SMEM_LIMIT:
        problems.append(f"shared memory {smem} + {static_smem} static > {SMEM_LIMIT}")
    if set(facts["stage_bytes"].values()) != set(config.tx_bytes.values()):
        problems.append(f"TMA stage bytes {facts['stage_bytes']} != config.tx_bytes {config.tx_bytes}")
    cols, group = c.tmem_alloc()
    if cols is None or cols != config.tmem_alloc_columns or group != 1:
        problems.append(f"tcgen05.alloc of {cols} columns; the declared map allocates {config.tmem_alloc_columns}")
    problems += config.tmem_map().problems()
    if config.ordered_tmem_map().conflicts(assume_in_order=True):
        problems.append("the ordered TMEM map has overlapping live regions")
    if set(facts["sf_tmem_columns"]) != {SF_COLS}:
        problems.append(f"the DSL's scale TMEM layouts span {facts['sf_tmem_columns']} columns, the map {SF_COLS}")
    for op in ("MUFU.EX2", "F2FP.SATFINITE.E4M3", "LDTM.x32", "STTM.x8"):
        if op not in text:
            problems.append(f"no {op} in the SASS")
    if config.p_scale == "block" and not re.search(r"FMNMX[\w.]*\.NAN", text):
        problems.append("p_scale 'block': no NaN-keeping FMNMX (the block amax)")
    unmasked, masked = softmax_instructions(c.instructions())
    row = {"reg": reg, "smem": smem + static_smem, "tmem": cols, "softmax": unmasked, "masked": masked}
    return row, problems


# -------------------------------------------------------------------------------------------------- table
def table(rows: dict, companion_rows: dict | None = None) -> str:
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


FAMILY = Family(
    tool=Path(__file__).resolve(),
    variants=ATTENTION_FWD_SM100_VARIANTS,
    module=lambda config: "jax_mxfp8.kernels.sm100.attention_fwd",
    check=check_variant,
    table=table,
)


if __name__ == "__main__":
    sys.exit(main(FAMILY, doc=__doc__))
