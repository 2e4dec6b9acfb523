#!/usr/bin/env python3
"""Compiles every Blackwell MX GEMM variant (kernels/registry/gemm_sm100.py) for sm_100f and checks the
cubins statically -- no GPU needed, and none of these kernels has run on one. With --reuse it checks the
cubins a library build already compiled (tools/build_kernels.py dumps each variant's cubin, PTX and
facts.json under <out>/sm_100f/dump/<variant>/) and compiles only the variants missing there.

Per variant:
  arch      the cubin was built with -arch sm_100f (the family target: one cubin for cc 10.0 and 10.3)
  mma       SASS holds UTCQMMA (".2CTA" exactly for cta_group 2) with its two TMEM scale operands
            (gdesc, gdesc, tmem[D], tmem[SFA], idesc, tmem[SFB]), 4 per K tile
  scales    SASS holds UTCCP.T.S[.2CTA].4x32dp128bit at the TMEM columns of the map's sfa and sfb regions
  local     `cuobjdump -res-usage`: LOCAL 0 and STACK 0 (no spills), REG <= 255 and REG * threads <= 64 K
  smem      the storage struct's size (traced) equals config.smem_bytes, and with the static shared memory
            it fits 227 KB
  tmem      the PTX's tcgen05.alloc column count equals the declared map's allocation, <= 512, the map
            has no overlapping live regions, and its accumulator and scale regions are as wide as the DSL's
            TMEM layouts (traced)
  epilogue  no float warp max (CREDUX .F32 ignores NaN); column_amax "redux" variants reduce with the
            integer REDUX/CREDUX.MAX; GELU variants use MUFU.TANH
and the per-variant table (registers, shared memory, TMEM, epilogue instructions, predicted TFLOP/s on B200
and GB300 from kernels/sm100/perf_model.py) is written (--write-table) or compared (--check-table).
With --all, every other registry variant built for sm_100f (the quantize family, the RMSNorm and the GEMM
operand producers: compiled by the library build, found in DIR) is checked too: built with -arch sm_100f, no
local memory (LOCAL 0, STACK 0, no STL / LDL), at most 255 registers.

Usage:
  python tools/check_sm100.py --dump DIR [--only NAME ...] [--reuse] [--all] [--write-table F | --check-table F]
Compiling needs nvidia-cutlass-dsl 4.8.1 in this Python (or --python PY); the compile worker, the cubin
readers, the common checks (arch, no local memory), --reuse, --all and the command line are
tools/sm100_static.py's, shared with the attention checkers. --reuse skips variants whose
DIR/<name>/facts.json exists (e.g. DIR = build/kernels/sm_100f/dump after tools/build_library.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sm100_static import INSTRUCTION, Compiled, Family, main  # noqa: E402

from jax_mxfp8.kernels.registry.gemm_sm100 import (  # noqa: E402
    K_TILE,
    MMA_K,
    MX_GEMM_SM100_VARIANTS,
    SMEM_LIMIT,
    THREADS,
)
from jax_mxfp8.kernels.sm100 import perf_model  # noqa: E402 (pure Python, no DSL)

TABLE_SHAPE = (1, 8192, 8192, 8192)
"""(G, M, N, K) of the table's predictions."""
REGISTER_FILE = 65536


def epilogue_instructions(sass: list[str]) -> int:
    """SASS instructions from the first TMEM load (LDTM) to the last global store after it: one
    epilogue warp's straight-line work for one tile (the 32-column chunks are unrolled)."""
    first = next(i for i, line in enumerate(sass) if "LDTM" in line)
    last = max(i for i, line in enumerate(sass) if i > first and re.search(r"\bSTG\.", line))
    return sum(1 for line in sass[first : last + 1] if INSTRUCTION.match(line))


def check_variant(config, c: Compiled) -> tuple[dict, list[str]]:
    """(the table row's measured values, problems) of one compiled variant."""
    text, reg, static_smem = c.sass, c.registers, c.static_smem
    problems = c.common_problems()
    mmas = c.mma_sites()
    two = config.cta_group == 2
    if mmas != [(two, "gdesc")] * (K_TILE // MMA_K):
        problems.append(f"UTCQMMA with TMEM scale operands: {len(mmas)} found ({mmas}), want {K_TILE // MMA_K}")
    tmem = config.tmem_map()
    copies = c.scale_copies()
    want = sorted([tmem.region("sfa").start, tmem.region("sfb").start])
    if len(copies) != 2 or any(s != two for s, _ in copies) or sorted(col for _, col in copies) != want:
        problems.append(f"UTCCP scale copies {copies}: want 2 at TMEM columns {want}")
    if reg > 255 or reg * THREADS > REGISTER_FILE:
        problems.append(f"{reg} registers x {THREADS} threads")
    smem = c.facts["smem_struct_bytes"]
    if smem != config.smem_bytes:
        problems.append(f"storage struct {smem} B != config.smem_bytes {config.smem_bytes}")
    if smem + static_smem > SMEM_LIMIT:
        problems.append(f"shared memory {smem} + {static_smem} static > {SMEM_LIMIT}")
    cols, group = c.tmem_alloc()
    if cols is None or cols != tmem.alloc_columns or cols > 512 or group != config.cta_group:
        problems.append(f"tcgen05.alloc of {cols} columns (cta_group {group}); map: {tmem.alloc_columns}")
    problems += tmem.problems()
    layout_cols = c.facts["tmem_layout_columns"]
    declared = {"acc": tmem.region("acc0").cols, "sfa": tmem.region("sfa").cols, "sfb": tmem.region("sfb").cols}
    if layout_cols != declared:
        problems.append(f"the DSL's TMEM layouts span {layout_cols} columns; the map declares {declared}")
    if re.search(r"CREDUX\.MAX\w*\.F32", text):
        problems.append("a float warp max (CREDUX .F32) ignores NaN: amaxes must be integer maxes of |x| bits")
    if config.epilogue in ("col", "rowcol") and config.column_amax == "redux":
        if not re.search(r"\b(CREDUX|REDUX)\.MAX\b", text):
            problems.append("column_amax 'redux': no integer warp reduction (REDUX/CREDUX.MAX) in the SASS")
    if (config.activation == "gelu") != ("MUFU.TANH" in text):
        problems.append("MUFU.TANH present iff activation == 'gelu'")
    row = {"reg": reg, "smem": smem + static_smem, "tmem": cols, "epi": epilogue_instructions(c.sass_lines)}
    return row, problems


# -------------------------------------------------------------------------------------------------- table
SWEEP_SHAPES = ((1, 8192, 8192, 8192), (1, 4096, 4096, 4096), (1, 2048, 2048, 2048), (1, 1024, 1024, 1024),
                (1, 16384, 8192, 2048), (1, 16384, 2048, 8192))  # fmt: skip
"""(G, M, N, K) of the shape sweep: cubes, and a transformer MLP's up (K = d = 2048) and down (N = 2048)."""
SWEEP_VARIANTS = (
    "mx_gemm_sm100_2cta_e4m3_e4m3_bf16",
    "mx_gemm_sm100_2cta_e4m3_e4m3_mxrow_bias_gelu_prebf16",
    "mx_gemm_sm100_2cta_e4m3_e4m3_mxrowcol_bias_gelu_prebf16",
    "mx_gemm_sm100_1cta_e4m3_e4m3_bf16",
)
L2_SENSITIVITY = (48, 64, 96, 128)


def _pred(config, shape, gpu, epi, l2=perf_model.L2_BYTES_PER_CLK_PER_SM) -> str:
    p = perf_model.predict(config, shape, gpu, epi, l2)
    return f"{p.tflops:.0f} ({p.bound})"


def table(rows: dict, companion_rows: dict | None = None) -> str:
    """The generated Markdown: the per-variant table, a shape sweep, the L2 sensitivity."""
    gpus = (perf_model.B200, perf_model.GB300)
    by_name = {c.name: c for c in MX_GEMM_SM100_VARIANTS}
    out = [
        "# Blackwell MX GEMM variants: resources and predicted throughput",
        "",
        "Compiled for sm_100f and checked by tools/check_sm100.py; the model and its assumptions are in",
        "[blackwell.md](blackwell.md). NOT RUN ON HARDWARE: every TFLOP/s figure here is a prediction.",
        "",
        "## Variants",
        "",
        "| variant | CTAs | epilogue | registers | shared memory (B) | TMEM columns | epilogue instr / tile | "
        "predicted TFLOP/s B200 | predicted TFLOP/s GB300 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in MX_GEMM_SM100_VARIANTS:
        if config.name in rows:
            r = rows[config.name]
            preds = " | ".join(_pred(config, TABLE_SHAPE, gpu, r["epi"]) for gpu in gpus)
            out.append(
                f"| {config.name} | {config.cta_group} | {config.epilogue} | {r['reg']} | {r['smem']} | "
                f"{config.tmem_map().used_columns} of {r['tmem']} | {r['epi']} | {preds} |"
            )
    out += ["", f"Predictions at (G, M, N, K) = {TABLE_SHAPE}; in parentheses what bounds the call.", ""]
    sweep = [n for n in SWEEP_VARIANTS if n in rows]
    if sweep:
        out += ["## Shapes", "", "| (G, M, N, K) | " + " | ".join(f"{n} {g.name}" for n in sweep for g in gpus) + " |"]
        out.append("| --- |" + " --- |" * (len(sweep) * len(gpus)))
        for shape in SWEEP_SHAPES:
            cells = [_pred(by_name[n], shape, g, rows[n]["epi"]) for n in sweep for g in gpus]
            out.append(f"| {shape} | " + " | ".join(cells) + " |")
        out += ["", "## L2 -> SM fill rate (assumed) vs prediction, B200, " + str(TABLE_SHAPE), ""]
        out.append("| variant | " + " | ".join(f"{b} B/clk/SM" for b in L2_SENSITIVITY) + " |")
        out.append("| --- |" + " --- |" * len(L2_SENSITIVITY))
        for n in sweep:
            cells = [_pred(by_name[n], TABLE_SHAPE, perf_model.B200, rows[n]["epi"], b) for b in L2_SENSITIVITY]
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        out.append("")
    fused = [("mx_gemm_sm100_2cta_e4m3_e4m3_mxrow_bias_gelu_prebf16", 1),
             ("mx_gemm_sm100_2cta_e4m3_e4m3_mxrowcol_bias_gelu_prebf16", 2)]  # fmt: skip
    plain = by_name["mx_gemm_sm100_2cta_e4m3_e4m3_bf16"]
    if plain.name in rows and all(n in rows for n, _ in fused):
        out += ["## Fused quantize epilogue vs a bf16 GEMM + separate quantize passes, B200, TFLOP/s", ""]
        out.append("| (G, M, N, K) | " + " | ".join(f"{n}: fused / unfused" for n, _ in fused) + " |")
        out.append("| --- |" + " --- |" * len(fused))
        for shape in SWEEP_SHAPES:
            cells = []
            for n, orientations in fused:
                p = perf_model.predict(by_name[n], shape, perf_model.B200, rows[n]["epi"])
                u = perf_model.unfused_seconds(plain, shape, perf_model.B200, rows[plain.name]["epi"], orientations)
                cells.append(f"{p.tflops:.0f} / {p.flops / u / 1e12:.0f}")
            out.append(f"| {shape} | " + " | ".join(cells) + " |")
        out.append("")
    out.append(
        "Generated by tools/check_sm100.py from the compiled cubins and kernels/sm100/perf_model.py "
        "(assumptions: docs/perf/blackwell.md). Predictions, not measurements: none of these kernels has run "
        "on a GPU."
    )
    return "\n".join(out) + "\n"


FAMILY = Family(
    tool=Path(__file__).resolve(),
    variants=MX_GEMM_SM100_VARIANTS,
    module=lambda config: "jax_mxfp8.kernels.sm100.mx_gemm",
    check=check_variant,
    table=table,
)


if __name__ == "__main__":
    sys.exit(main(FAMILY, doc=__doc__))
