#!/usr/bin/env python3
"""Kernel-only TFLOP/s of the Blackwell MX GEMM (primitives/mx_gemm_sm100.py) on pre-made operands, with baselines.

NOT YET RUN ON A BLACKWELL GPU: written for the first run on a B200 / GB300 (compute capability 10.0 / 10.3).
One process, side by side, y (M, N) = x (M, K) @ w (K, N), for (M, K, N) in 8192^3, an MLP up (16384 x 2048
x 8192) and down (16384 x 8192 x 2048) projection and 1024^3:
  bf16          lax.dot_general on bf16 operands (cuBLAS), bf16 out
  cudnn_mxfp8   jax.nn.scaled_matmul on the same E4M3 operands and E8M0 scales (cuDNN's block-scaled GEMM,
                natural scale layout), bf16 out
  sm100         our kernel, plain epilogue, bf16 out: a (1, M, K), b (1, N, K) E4M3 K-major, blocked scales
  sm100_fused   our kernel with the training forward's epilogue: + bias, GELU, both MX orientations and the
                bf16 pre-activation (rowcol + bias + gelu + pre), the output the next GEMM consumes
  sm100_t1      the comparison schedule of sm100_fused (column amaxes by REDUX; --with-tunes libraries only)
The operands (random E4M3, power-of-two scales in [2^-2, 2^2]) are made before timing: kernel only. FLOPs
2*M*N*K. Timing (benchmarks/harness.py): enqueue --calls calls, block once, divide; median of --batches batches.
The model's predictions for these shapes are in docs/perf/blackwell_gemm_variants.md.

Usage: python benchmarks/mx_gemm_sm100.py [--out FILE.json] [--smoke] [--only bf16,sm100,...] [--time-budget S]
--smoke runs tiny shapes anywhere (our kernel emulated where it cannot run: the numbers mean nothing).
The JSON (default benchmarks/results/b200_mx_gemm_sm100.json) is rewritten after every shape.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
from harness import timeit
from jax import lax

from jax_mxfp8.formats import to_blocked_scales
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import mx_gemm_sm100 as sm100

FULL_SHAPES = [(8192, 8192, 8192), (16384, 2048, 8192), (16384, 8192, 2048), (1024, 1024, 1024)]  # (M, K, N)
SMOKE_SHAPES = [(256, 256, 256)]
IMPLS = ("bf16", "cudnn_mxfp8", "sm100", "sm100_fused", "sm100_t1")


def operands(key, m: int, k: int, n: int):
    """(a (1, M, K), b (1, N, K) E4M3, natural scales (1, M, K/32), (1, N, K/32) uint8 in [2^-2, 2^2])."""
    ka, kb, ksa, ksb = jax.random.split(key, 4)
    a = jax.random.normal(ka, (1, m, k), jnp.bfloat16).astype(jnp.float8_e4m3fn)
    b = jax.random.normal(kb, (1, n, k), jnp.bfloat16).astype(jnp.float8_e4m3fn)
    sa = jax.random.randint(ksa, (1, m, k // 32), 125, 130).astype(jnp.uint8)
    sb = jax.random.randint(ksb, (1, n, k // 32), 125, 130).astype(jnp.uint8)
    return a, b, sa, sb


def _sm100_fn(n: int, path: str, epilogue: str, tune: int):
    bias = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32) if epilogue != "plain" else None
    kw = dict(out_dtype=jnp.bfloat16, path=path, epilogue=epilogue, tune=tune)
    if epilogue != "plain":
        kw["activation"] = "gelu"
    return jax.jit(lambda a, b, sa, sb: sm100.mx_gemm_sm100(a, b, sa, sb, bias, **kw))


def run_shape(m, k, n, args, res, path: str) -> None:
    a, b, sa, sb = operands(jax.random.PRNGKey(0), m, k, n)
    blocked = (a, b, to_blocked_scales(sa), to_blocked_scales(sb))
    flops = 2 * m * n * k
    for name in args.only.split(",") if args.only else IMPLS:
        out = res.setdefault(name, {})
        try:
            if name == "bf16":
                x, w = a[0].astype(jnp.bfloat16), b[0].astype(jnp.bfloat16)
                f = jax.jit(lambda x, w: lax.dot_general(x, w, (((1,), (1,)), ((), ()))))
                t = timeit(f, (x, w), args.calls, args.batches)
            elif name == "cudnn_mxfp8":
                if jax.default_backend() != "gpu":
                    out["skipped"] = "jax.nn.scaled_matmul runs on a GPU only"
                    continue
                e8 = (sa.view(jnp.float8_e8m0fnu), sb.view(jnp.float8_e8m0fnu))
                f = jax.jit(lambda a, b, x, y: jax.nn.scaled_matmul(a, b, x, y, preferred_element_type=jnp.bfloat16))
                t = timeit(f, (a, b, *e8), args.calls, args.batches)
            elif name.startswith("sm100"):
                fused = name != "sm100"
                tune = 1 if name == "sm100_t1" else 0
                variant = sm100.find_variant(
                    a.dtype, b.dtype, "bfloat16", fused, "rowcol" if fused else "plain", "gelu" if fused else "",
                    sm100.choose_cta_group(m, "rowcol" if fused else "plain"), tune,
                )  # fmt: skip
                if variant is None or (path == "cuda" and not library.has_kernel(variant.name)):
                    out["skipped"] = f"{name} is not in the library (tools/build_library.py --with-tunes for t1)"
                    continue
                t = timeit(_sm100_fn(n, path, variant.epilogue, tune), blocked, args.calls, args.batches)
            else:
                raise ValueError(f"unknown impl {name}")
            out["s"] = t
            out["tflops"] = round(flops / t / 1e12, 1)
            print(f"  {name:12s} {t * 1e3:8.3f} ms  {out['tflops']:7.1f} TFLOP/s", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded, the next impl runs
            traceback.print_exc()
            out["error"] = repr(e)[:800]


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/b200_mx_gemm_sm100.json",
        smoke="a small shape anywhere (our kernel emulated where it cannot run; numbers mean nothing)",
        time_budget=None,
        calls="calls per batch (default 20; smoke 2)",
        batches="batches (default 3; smoke 2)",
    )
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(IMPLS)}")
    args = harness.parse(ap, argv)
    harness.counts(args, calls={"full": 20, "quick": 20, "smoke": 2}, batches={"full": 3, "quick": 3, "smoke": 2})
    ok, why = library.kernels_runnable(registry.MXGemmSm100Config.archs)
    if not ok and not args.smoke:
        print(f"the Blackwell MX GEMM cannot run here: {why} (--smoke runs its emulation)", file=sys.stderr)
        return 1
    path = "cuda" if ok else "emulated"
    meta = harness.metadata(
        args, kernels=registry.MXGemmSm100Config.archs, flops="2*M*N*K", path=path, impls=__doc__.split("\n\n")[1]
    )
    print(f"device: {meta['device_kind']}, jax {meta['jax']}, our kernel: {path}")
    budget = harness.TimeBudget(args.time_budget)
    results = []
    for m, k, n in SMOKE_SHAPES if args.smoke else FULL_SHAPES:
        res = dict(name=f"{m}x{k}x{n}", m=m, k=k, n=n)
        results.append(res)
        skip = budget.exceeded()
        if skip:
            res["skipped"] = skip
            continue
        print(f"{res['name']}  [{budget.elapsed():.0f} s]", flush=True)
        run_shape(m, k, n, args, res, path)
        harness.write_json(Path(args.out), meta, results=results)
    rows = [[r["name"], *(harness.fmt(r.get(i, {}).get("tflops")) for i in IMPLS)] for r in results]
    print("\nTFLOP/s (kernel only)\n" + harness.markdown_table(["shape", *IMPLS], rows))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
