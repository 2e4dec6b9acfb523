#!/usr/bin/env python3
"""Summarizes an Nsight Compute source-page CSV (per-SASS-instruction warp stall samples).

  ncu --import REPORT.ncu-rep --page source --csv --print-source sass > sass.csv
  python benchmarks/ncu_stall_summary.py sass.csv [--top 25]

Prints the stall reasons' shares of all samples and the instructions with the most samples (with their two
largest reasons). Accepts .csv or .csv.gz.
"""

from __future__ import annotations

import collections
import csv
import gzip
import io

import harness


def summarize(path: str, top: int) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    header, data = rows[1], [r for r in rows[2:] if len(r) >= len(rows[1])]
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = "Warp Stall Sampling (All Samples)"
    total = sum(int(r[col[samples]] or 0) for r in data)
    by_reason = collections.Counter()
    for r in data:
        for c in reasons:
            by_reason[c] += int(r[col[c]] or 0)
    out = [f"{path}: {total} warp stall samples over {len(data)} SASS instructions", "", "reason shares:"]
    out += [f"  {c:22s} {v:8d} {100 * v / total:5.1f}%" for c, v in by_reason.most_common()]
    out += ["", f"top {top} instructions (samples, share, address, SASS, two largest reasons):"]
    for r in sorted(data, key=lambda r: -int(r[col[samples]] or 0))[:top]:
        s = int(r[col[samples]] or 0)
        two = sorted(((int(r[col[c]] or 0), c) for c in reasons), reverse=True)[:2]
        sass = r[col["Source"]].strip()[:58]
        out.append(f"  {s:6d} {100 * s / total:4.1f}% {r[col['Address']][-5:]} {sass:58s} {two}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = harness.parser(__doc__, __file__)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = harness.parse(ap, argv)
    print(summarize(args.csv, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
