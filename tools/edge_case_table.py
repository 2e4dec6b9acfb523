"""Prints a markdown table of MXFP8 edge cases: input -> (element value, scale byte), computed by jax_mxfp8.

Each row quantizes one block of 32 float32 values (row blocks, under jax.jit on the default backend) and shows
the probed element's FP8 value and the block's E8M0 scale byte, for E4M3 / E5M2 and scale_rounding
"up" / "floor". Unless the row says otherwise the probed value sits at index 0 and the other 31 are zero.

    python tools/edge_case_table.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8 as mx

F32_MAX = float(np.finfo(np.float32).max)


def _ulps(v: float, n: int) -> float:
    x = np.float32(v)
    for _ in range(n):
        x = np.nextafter(x, np.float32(np.inf))
    return float(x)


def _block(first: float, rest: float = 0.0) -> np.ndarray:
    b = np.full(32, rest, np.float32)
    b[0] = first
    return b


# (label, block, probed index)
CASES = [
    ("0 (all-zero block)", _block(0.0), 0),
    ("448", _block(448.0), 0),
    ("449", _block(449.0), 0),
    ("464", _block(464.0), 0),
    ("480", _block(480.0), 0),
    ("-449", _block(-449.0), 0),
    ("1.0", _block(1.0), 0),
    ("57344", _block(57344.0), 0),
    ("float32 max", _block(F32_MAX), 0),
    ("448·2^-127", _block(448 * 2.0**-127), 0),
    ("448·2^-127 + 1 ulp", _block(_ulps(448 * 2.0**-127, 1)), 0),
    ("448·2^-127 + 2 ulp", _block(_ulps(448 * 2.0**-127, 2)), 0),
    ("448·2^-126", _block(448 * 2.0**-126), 0),
    ("57344·2^-127", _block(57344 * 2.0**-127), 0),
    ("57344·2^-127 + 1 ulp", _block(_ulps(57344 * 2.0**-127, 1)), 0),
    ("57344·2^-127 + 2 ulp", _block(_ulps(57344 * 2.0**-127, 2)), 0),
    ("2^-126 (min normal)", _block(2.0**-126), 0),
    ("2^-130 (subnormal input)", _block(2.0**-130), 0),
    ("2^-120 with a 2^-130 neighbour [the 2^-130]", np.array([2.0**-120, 2.0**-130] + [0.0] * 30, np.float32), 1),
    ("NaN (rest 1.0)", _block(np.nan, 1.0), 0),
    ("+Inf (rest 1.0)", _block(np.inf, 1.0), 0),
    ("-Inf (rest 1.0)", _block(-np.inf, 1.0), 0),
    ("outlier 2^20 (rest 1.0)", _block(2.0**20, 1.0), 0),
    ("1.0 next to a 2^20 outlier", _block(2.0**20, 1.0), 1),
    ("-1.0 next to a 2^20 outlier", _block(2.0**20, -1.0), 1),
]
CONFIGS = [
    ("E4M3 up", jnp.float8_e4m3fn, "up"),
    ("E4M3 floor", jnp.float8_e4m3fn, "floor"),
    ("E5M2 up", jnp.float8_e5m2, "up"),
    ("E5M2 floor", jnp.float8_e5m2, "floor"),
]


def _fmt_value(v: float) -> str:
    if np.isnan(v):
        return "NaN"
    if v == 0:
        return "-0" if np.signbit(v) else "0"
    return f"{v:g}"


def table() -> str:
    x = np.stack([blk for _, blk, _ in CASES])
    cols = []
    for _, dtype, sr in CONFIGS:
        q = jax.jit(lambda v, dtype=dtype, sr=sr: mx.quantize(v, dtype=dtype, scale_rounding=sr))(x)
        data = np.asarray(q.data).astype(np.float32)
        scale = np.asarray(q.scale)[:, 0]
        cols.append([(float(data[i, idx]), int(scale[i])) for i, (_, _, idx) in enumerate(CASES)])
    lines = [
        "| input | " + " | ".join(name for name, _, _ in CONFIGS) + " |",
        "|---|" + "---|" * len(CONFIGS),
    ]
    for i, (label, _, _) in enumerate(CASES):
        cells = [f"{_fmt_value(v)}, {b}" + (" (NaN)" if b == 255 else "") for v, b in (c[i] for c in cols)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    print(f"Cells: element value, scale byte (scale = 2^(byte-127)); jax {jax.__version__}, {jax.default_backend()}")
    print()
    print(table())


if __name__ == "__main__":
    main()
