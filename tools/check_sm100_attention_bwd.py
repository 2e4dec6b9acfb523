#!/usr/bin/env python3
"""Compiles every Blackwell attention-backward variant and its pre-pass (kernels/sm100/attention_bwd_config.py)
for sm_100f and checks the cubins statically -- no GPU needed, and none of these kernels has run on one. The
sibling of tools/check_sm100.py (the MX GEMM's) on the shared machinery of tools/sm100_static.py.

Per backward variant:
  arch      built with -arch sm_100f (one cubin for cc 10.0 and 10.3)
  mma       6 UTCQMMA sites (S^T in the prologue and the loop, dP^T, dV, dK, dQ; the K loop is a run-time
            loop), each with its two TMEM scale operands, none .2CTA, exactly 2 reading A from TMEM (dV, dK)
  scales    12 UTCCP.T.S.4x32dp128bit, at exactly the TMEM columns of the map's scale slots (SFA, SFB of S^T
            twice, dP^T, dV, dK, dQ)
  amax      CREDUX.MAXABS.F32.NAN for the dS blocks (2 per step: one per 32 x 32 block of the warp) and no
            float warp max without .NAN; dkv "mx": the integer column maxes (CREDUX.MAX) of the epilogue
  math      MUFU.EX2 (P), F2FP.SATFINITE.E4M3 (P, dS)
  local     LOCAL 0, STACK 0, no LDL / STL (sm100_static's common checks)
  registers launch REG * 512 threads <= 64 K, and the setmaxnreg values are the config's per warpgroup
  smem      the storage struct's size (traced) equals config.smem_bytes; with the static part <= 227 KB
  tmem      the PTX's tcgen05.alloc column count equals the declared map's allocation (<= 512), the map is
            sound, and the DSL's accumulator / scale layouts are as wide as the map's regions
  loads     4 TMA tile loads (K, V, Q, dO) and 7 bulk scale-chunk copies
  dQ        fp32: a bulk reduce-add .F32; fp16: .F16; deterministic: the semaphore (an acquire load and a
            release add at GPU scope); fp16 deterministic: no bulk reduce, strong 16-byte loads and stores
Per pre-pass variant: arch, no local memory, one integer warp max per 32-column block, the E4M3 packs.
The per-variant table (registers, shared memory, TMEM, SASS size, predicted TFLOP/s from
kernels/sm100/attention_bwd_perf_model.py) is written (--write-table) or compared (--check-table). Its
forward + backward predictions take the forward's model at the compiled forward variant's softmax
instruction counts: the forward variants of the backward variants' keys are compiled and checked alongside
(tools/check_sm100_attention_fwd.py's hooks; "companion" lines).

Usage:
  python tools/check_sm100_attention_bwd.py --dump DIR [--only NAME ...] [--reuse] [--all]
      [--write-table F | --check-table F]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_sm100_attention_fwd import FAMILY as FORWARD  # noqa: E402
from sm100_static import INSTRUCTION, Compiled, Family, main  # noqa: E402

from jax_mxfp8.kernels.sm100 import attention_bwd_perf_model as pm  # noqa: E402 (pure Python)
from jax_mxfp8.kernels.sm100.attention_bwd_config import (  # noqa: E402
    ATTENTION_BWD_PREPASS_VARIANTS,
    ATTENTION_BWD_SM100_VARIANTS,
    REGISTERS,
    AttentionBwdPrepassConfig,
    sf_slot,
)
from jax_mxfp8.kernels.sm100.attention_geometry import REGISTER_FILE, SMEM_LIMIT, THREADS  # noqa: E402
from jax_mxfp8.kernels.sm100.perf_model import B200, GB300  # noqa: E402

_COLUMN_MAX = re.compile(r"CREDUX\.MAX\s")
"""The integer warp max (redux.sync.max.u32 of |x| bits): CREDUX.MAX without ABS / F32."""
SITES = ("S", "S", "dP", "dV", "dK", "dQ")
"""The GEMM issue sites of the MMA warp (S^T in the prologue and in the loop)."""


# ---------------------------------------------------------------------------------------------- compile
def _module(config) -> str:
    prepass = isinstance(config, AttentionBwdPrepassConfig)
    return f"jax_mxfp8.kernels.sm100.attention_bwd{'_prepass' if prepass else ''}"


def _companions(configs) -> list:
    """The forward variants whose instruction counts the forward + backward predictions take."""
    return [(FORWARD, pm.forward_config(c)) for c in configs if not isinstance(c, AttentionBwdPrepassConfig)]


# ------------------------------------------------------------------------------------------------ checks
def check_bwd(config, c: Compiled) -> tuple[dict, list[str]]:
    """(the table row's measured values, problems) of one backward variant."""
    sass, reg, static_smem, facts = c.sass, c.registers, c.static_smem, c.facts
    problems = c.common_problems()
    mmas = c.mma_sites()
    if len(mmas) != len(SITES) or any(two for two, _ in mmas) or [a for _, a in mmas].count("tmem") != 2:
        problems.append(f"UTCQMMA sites {mmas}: want {len(SITES)} with TMEM scales, 2 with A from TMEM, no .2CTA")
    copies = c.scale_copies()
    want = sorted(col for gemm in SITES for col in sf_slot(config.head_dim, gemm))
    if sorted(col for _, col in copies) != want or any(two for two, _ in copies):
        problems.append(f"UTCCP scale copies at {[col for _, col in copies]}: want the slots {want}")
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
    setmax = sorted(value for _, value in c.setmaxnreg())
    if setmax != sorted(REGISTERS.values()):
        problems.append(f"setmaxnreg {setmax}: want {sorted(REGISTERS.values())}")
    smem = facts["smem_struct_bytes"]
    if smem != config.smem_bytes or smem + static_smem > SMEM_LIMIT:
        problems.append(f"storage struct {smem} B (config {config.smem_bytes}) + {static_smem} static vs {SMEM_LIMIT}")
    tmem = config.tmem_map()
    cols, group = c.tmem_alloc()
    if cols is None or cols != tmem.alloc_columns or cols > 512 or group != 1:
        problems.append(f"tcgen05.alloc of {cols} columns (cta_group {group}); map: {tmem.alloc_columns}")
    problems += tmem.problems()
    widths = {r.name.split("@")[0]: r.cols for r in tmem.regions}
    region = {"S": "S^T", "dP": "dP^T", "dV": "dV", "dK": "dK", "dQ": "dQ"}
    for gemm, name in region.items():
        layout = facts["tmem_layout_columns"]
        scale_cols = layout[f"sfa_{gemm}"] + layout[f"sfb_{gemm}"]
        if layout[f"acc_{gemm}"] != widths[name] or scale_cols != widths[f"SF_{gemm}"]:
            problems.append(f"{gemm}: the DSL's TMEM layouts {layout} vs the map's {name}, SF_{gemm}")
    if sass.count("UTMALDG") != 4 or sass.count("UBLKCP") != 7:
        loads = f"{sass.count('UTMALDG')} TMA tile loads (want 4), {sass.count('UBLKCP')} bulk copies (want 7)"
        problems.append(loads)
    problems += _dq_problems(config, sass)
    return {"reg": reg, "smem": smem + static_smem, "tmem": cols, "sass": _instructions(c)}, problems


def _instructions(c: Compiled) -> int:
    return sum(1 for line in c.sass_lines if INSTRUCTION.match(line))


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


def check_prepass(config, c: Compiled) -> tuple[dict, list[str]]:
    sass, reg, static_smem = c.sass, c.registers, c.static_smem
    problems = c.common_problems()
    blocks = config.head_dim // 32
    if len(_COLUMN_MAX.findall(sass)) != blocks:
        problems.append(f"want {blocks} integer warp maxes (one per 32-column block)")
    if sass.count("F2FP.SATFINITE.E4M3") != config.head_dim // 2:
        problems.append(f"want {config.head_dim // 2} E4M3 packs (two elements each)")
    return {"reg": reg, "smem": static_smem, "sass": _instructions(c)}, problems


def check_variant(config, c: Compiled) -> tuple[dict, list[str]]:
    return (check_prepass if isinstance(config, AttentionBwdPrepassConfig) else check_bwd)(config, c)


# ------------------------------------------------------------------------------------------------- table
def _pred(config, gpu, forward: dict) -> str:
    """ "backward / forward + backward" TFLOP/s; forward: the companion forward variant's row."""
    shape = pm.table_shape(config)
    train = pm.predict_train(config, shape, gpu, (forward["softmax"], forward["masked"]))
    return f"{pm.predict_bwd(config, shape, gpu):.0f} / {train:.0f}"


def table(rows: dict, companion_rows: dict) -> str:
    out = [
        "# Blackwell MXFP8 attention backward variants: resources and predicted throughput",
        "",
        "Compiled for sm_100f and checked by tools/check_sm100_attention_bwd.py; the model is",
        "kernels/sm100/attention_bwd_perf_model.py ([blackwell-attention.md](blackwell-attention.md) section 6).",
        "NOT RUN ON HARDWARE: every TFLOP/s figure here is a prediction.",
        "",
        "## Backward",
        "",
        f"setmaxnreg per warpgroup: reduce {REGISTERS['reduce']}, compute {REGISTERS['compute']}, MMA / load "
        f"{REGISTERS['other']} (every variant). Predictions: backward / forward + backward TFLOP/s at B2 T = S = "
        "8192 N = K = 16 (packed: 64 sequences of 512 .. 16384, N = K = 4); the forward term is the built "
        "forward's model (kernels/sm100/attention_fwd_perf_model.py) for the forward variant of the same "
        "head_dim, causal, p_scale and packed, at its compiled softmax instruction counts "
        "([blackwell_attention_fwd_variants.md](blackwell_attention_fwd_variants.md)).",
        "",
        "| variant | registers at launch | shared memory (B) | TMEM columns | SASS instructions | "
        "predicted B200 | predicted GB300 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in ATTENTION_BWD_SM100_VARIANTS:
        if config.name in rows:
            r, forward = rows[config.name], companion_rows[pm.forward_config(config).name]
            used = config.tmem_map().used_columns
            out.append(
                f"| {config.name} | {r['reg']} | {r['smem']} | {used} of {r['tmem']} | {r['sass']} | "
                f"{_pred(config, B200, forward)} | {_pred(config, GB300, forward)} |"
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
        "Generated by tools/check_sm100_attention_bwd.py from the compiled cubins and the model. Predictions, not "
        "measurements: none of these kernels has run on a GPU.",
    ]
    return "\n".join(out) + "\n"


FAMILY = Family(
    tool=Path(__file__).resolve(),
    variants=(*ATTENTION_BWD_SM100_VARIANTS, *ATTENTION_BWD_PREPASS_VARIANTS),
    module=_module,
    check=check_variant,
    table=table,
    companions=_companions,
)


if __name__ == "__main__":
    sys.exit(main(FAMILY, doc=__doc__))
