"""Static checks of the Hopper MX GEMM cubins (both production tilings of every key): no local memory, stack or
spill traffic, registers within the 384-thread CTA's register file, the setmaxnreg split of the warp
specialization. Reads the library build's sm_90a dump (build/kernels/sm_90a/dump, or JAX_MXFP8_SM90_KERNEL_DUMP:
tools/build_library.py --build-dir DIR writes DIR/kernels/sm_90a/dump) and cuobjdump; skips without them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jax_mxfp8.kernels import registry

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from compare_sass import find_cuobjdump  # noqa: E402

DUMP = Path(os.environ.get("JAX_MXFP8_SM90_KERNEL_DUMP", ROOT / "build" / "kernels" / "sm_90a" / "dump"))
THREADS = 384  # producer + two consumer warpgroups (kernels/sm90/mx_gemm.py)
RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
SPILLS_KNOWN = {
    v.name for v in registry.MX_GEMM_VARIANTS if v.tile_n == 192 and v.out_dtype == "float32" and not v.has_bias
}
"""128x192 with float32 output and no bias: ptxas keeps a 40-byte stack frame (32 STL / LDL) in these four; open,
marked xfail (strict) so that a fix or a new spill shows."""


def _mark(v):
    return (
        pytest.param(v, marks=pytest.mark.xfail(strict=True, reason="known 40-byte stack"))
        if v.name in SPILLS_KNOWN
        else v
    )


def _cuobjdump() -> str:
    try:
        return find_cuobjdump(None)
    except SystemExit as e:
        pytest.skip(str(e))


@pytest.mark.slow
@pytest.mark.parametrize("variant", [_mark(v) for v in registry.MX_GEMM_VARIANTS], ids=lambda v: v.name)
def test_mx_gemm_cubin_resources(variant):
    cubins = sorted((DUMP / variant.name).glob("*.cubin"))
    if not cubins:
        pytest.skip(f"no sm_90a build dump of {variant.name} under {DUMP} (run tools/build_library.py)")
    cuobjdump = _cuobjdump()
    (cubin,) = cubins
    usage = RES.search(subprocess.run([cuobjdump, "-res-usage", str(cubin)], capture_output=True, text=True).stdout)
    reg, stack, _, local = map(int, usage.groups())
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    spills = len(re.findall(r"\b(STL|LDL)\b", sass))
    assert (local, stack, spills) == (0, 0, 0), f"{variant.name}: LOCAL {local}, STACK {stack}, {spills} STL/LDL"
    assert reg * THREADS <= 65536, f"{variant.name}: {reg} registers x {THREADS} threads"
    maxnreg = sorted({int(v, 16) for v in re.findall(r"USETMAXREG\.\w+(?:\.\w+)*\s+(?:\w+,\s*)?0x([0-9a-f]+)", sass)})
    assert maxnreg == [40, 232], f"{variant.name}: setmaxnreg {maxnreg} (producer 40, consumers 232)"
    assert variant.smem_bytes <= 227 * 1024
