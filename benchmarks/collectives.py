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

import os
import sys

import harness
import jax

sys.path.insert(0, str(harness.ROOT / "examples"))

import train_multihost  # noqa: E402

MESHES = ("data=8", "fsdp=8", "tp=8", "data=2,fsdp=4", "data=2,fsdp=2,tp=2")


def main(argv=None) -> int:
    p = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results",
        out_help="folder for collectives_<platform><device count>.json (default benchmarks/results)",
    )
    args = harness.parse(p, argv)
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
    table = []
    for r in rows:
        kinds = "; ".join(f"{k} x{n} {b / 1024:.0f}" for k, (n, b) in sorted(r["collectives"].items())) or "none"
        table.append([r["mesh"], "yes" if r["fp8_gather"] else "no", kinds, f"{r['all_gather_bytes'] / 1024:.0f}"])
    head = ["mesh", "FP8 gather", "collectives of one training step (count, KiB)", "all-gather KiB"]
    print("\n" + harness.markdown_table(head, table))
    table = []
    for mesh in MESHES:
        plain = [r for r in rows if r["mesh"] == mesh and not r["fp8_gather"]]
        fp8 = [r for r in rows if r["mesh"] == mesh and r["fp8_gather"]]
        if plain and fp8:
            f32 = plain[0]["all_gather_bytes"] / 1024
            table.append([mesh, f"{f32:.0f}", f"{f32 / 2:.0f}", f"{fp8[0]['all_gather_bytes'] / 1024:.0f}"])
    head = ["mesh", "all-gather KiB per step: FP32 (measured)", "BF16 (FP32 / 2, computed)", "MXFP8 (measured)"]
    print("\n" + harness.markdown_table(head, table))
    path = os.path.join(args.out, f"collectives_{jax.devices()[0].platform}{jax.device_count()}.json")
    harness.write_json(path, harness.metadata(args), rows=rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
