#!/usr/bin/env python3
"""Shows how XLA's GPU backend compiles the RMSNorm reference (jax_mxfp8.reference.rms_norm.rms_norm):
the optimized HLO's arithmetic and the PTX's float instructions (division, rsqrt, FMA), so that the
fused kernel's operation order can be checked against it. Needs a GPU; writes the dump under --dump.

Usage: python tools/inspect_xla_rms_norm.py [--dump DIR] [--d 4096] [--dtype bfloat16]
(--dump: where XLA writes its dump; default a new temporary folder, printed)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", default=None, help="XLA dump folder (default: a new temporary folder)")
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    args.dump = args.dump or tempfile.mkdtemp(prefix="xla_rms_dump_")
    print(f"XLA dump: {args.dump}")
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={args.dump} --xla_dump_hlo_as_text"
    ).strip()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import jax
    import jax.numpy as jnp

    from jax_mxfp8.reference.rms_norm import rms_norm

    x = jnp.ones((args.m, args.d), args.dtype)
    w = jnp.ones((args.d,), jnp.float32)
    f = jax.jit(lambda a, b: rms_norm(a, b, 1e-6))
    compiled = f.lower(x, w).compile()
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}, x {args.m}x{args.d} {args.dtype}")
    print("== optimized HLO (arithmetic lines)")
    for line in compiled.as_text().splitlines():
        if re.search(r"\b(divide|multiply|rsqrt|reduce|add|convert|fusion)\(", line):
            print("  " + line.strip()[:200])
    ptx = [p for p in Path(args.dump).glob("*.ptx")]
    print(f"== PTX files: {[p.name for p in ptx]}")
    for p in ptx:
        text = p.read_text()
        counts = {}
        for op in (
            "rsqrt.approx",
            "sqrt",
            "div.rn",
            "div.full",
            "div.approx",
            "rcp",
            "fma.rn",
            "mul.rn",
            "add.rn",
            "mul.f32",
            "add.f32",
            "fma.rn.ftz",
            "ftz",
            "shfl.sync",
            "cvt.rn.bf16",
        ):
            counts[op] = text.count(op)
        print(f"  {p.name}: {counts}")
        for line in text.splitlines():
            if re.search(r"rsqrt|div\.|rcp\.|sqrt", line):
                print("    " + line.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
