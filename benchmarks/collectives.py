"""Collectives in one LM training step per mesh, with and without FSDP FP8 (quantized) all-gather.

Compiles examples/train_multihost.py's training step on 8 host devices (or the GPUs present) for each mesh
and counts the collectives in the compiled HLO with their bytes. Prints a table and writes JSON.

The second table compares the weight all-gather bytes per step of an FSDP mesh: FP32 (the float32
parameters gathered, measured), BF16 (the same gathers at 2 bytes per element: computed as half the FP32
figure, no run) and MXFP8 (measured: the forward's copy quantized along K and the dgrad's along N, each
1 byte + 1/32 byte per element; parallel/fsdp.py fsdp_mx_dot).

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/collectives.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import jax  # noqa: E402
import train_multihost  # noqa: E402

MESHES = ("data=8", "fsdp=8", "tp=8", "data=2,fsdp=4", "data=2,fsdp=2,tp=2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    rows = []
    for mesh in MESHES:
        for fp8 in (False, True):
            if fp8 and "fsdp" not in mesh:
                continue
            argv = ["--mesh", mesh, "--steps", "1", *(["--fp8-gather"] if fp8 else [])]
            s = train_multihost.run(train_multihost.parse_args(argv))
            by_kind = train_multihost.collectives_by_kind(s["collectives"])
            rows.append(
                {"mesh": mesh, "fp8_gather": fp8, "collectives": by_kind, "all_gather_bytes": s["all_gather_bytes"]}
            )
    print("\n| mesh | FP8 gather | collectives of one training step (count, KiB) | all-gather KiB |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        kinds = "; ".join(f"{k} x{n} {b / 1024:.0f}" for k, (n, b) in sorted(r["collectives"].items())) or "none"
        print(f"| {r['mesh']} | {'yes' if r['fp8_gather'] else 'no'} | {kinds} | {r['all_gather_bytes'] / 1024:.0f} |")
    print("\n| mesh | all-gather KiB per step: FP32 (measured) | BF16 (FP32 / 2, computed) | MXFP8 (measured) |")
    print("| --- | --- | --- | --- |")
    for mesh in MESHES:
        plain = [r for r in rows if r["mesh"] == mesh and not r["fp8_gather"]]
        fp8 = [r for r in rows if r["mesh"] == mesh and r["fp8_gather"]]
        if plain and fp8:
            f32 = plain[0]["all_gather_bytes"] / 1024
            print(f"| {mesh} | {f32:.0f} | {f32 / 2:.0f} | {fp8[0]['all_gather_bytes'] / 1024:.0f} |")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"collectives_{jax.devices()[0].platform}{jax.device_count()}.json")
    with open(path, "w") as f:
        json.dump({"jax": jax.__version__, "devices": str(jax.devices()[0].device_kind), "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
