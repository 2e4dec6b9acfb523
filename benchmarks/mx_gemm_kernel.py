#!/usr/bin/env python3
"""Kernel-only TFLOP/s of the Hopper MX GEMM (primitives/mx_gemm.py) on pre-aligned operands, with baselines.

One process, side by side, y (M, N) = x (M, K) @ w (K, N), bf16 out, for (M, K, N) in 8192^3,
16384 x 4096 x 14336 and 16384 x 14336 x 4096:
  bf16        lax.dot_general on bf16 operands
  xla_fp8     lax.dot_general on float8_e4m3fn operands with per-tensor scales (cast before timing)
  torch_fp8   torch._scaled_mm, e4m3 per-tensor scales, bf16 out (operands pre-cast; torch with CUDA only)
  mx_tN       our kernel, tune N (mx_t0 = production; registry.MX_GEMM_TUNINGS: the comparison schedules,
              in the library when built with --with-tunes), on aligned operands made before timing:
              a (1, M, K), b (1, N, K) e4m3 K-major, sa (1, K/128, M), sb (1, K/128, N) powers of two
              (the quantization pass that makes them is not timed: kernel only)
FLOPs 2*M*N*K. Timing (benchmarks/harness.py): enqueue --calls calls, block once, divide; median of
--batches batches (torch: the same with torch.cuda.synchronize). Target: mx_t0 >= 1300 TFLOP/s at 8192^3
(with the quantize pass, the end-to-end GEMM at 1.6x bf16).

Usage: python benchmarks/mx_gemm_kernel.py [--out FILE.json] [--smoke] [--only bf16,mx_t0,...] [--time-budget S]
The JSON (default benchmarks/results/h200_mx_gemm_kernel.json) is rewritten after every shape.
"""

from __future__ import annotations

import functools
import sys
import traceback
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
from gemm import DN, fp8_dot, import_torch, per_tensor_fp8  # benchmarks/gemm.py
from harness import timeit, timeit_torch
from jax import lax

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives import mx_gemm as mg

FULL_SHAPES = [(8192, 8192, 8192), (16384, 4096, 14336), (16384, 14336, 4096)]  # (M, K, N)
SMOKE_SHAPES = [(256, 512, 384)]
TUNES = (0, *(v.tune for v in registry.MX_GEMM_TUNINGS))
IMPLS = (*(f"mx_t{t}" for t in TUNES), "bf16", "xla_fp8", "torch_fp8")
TARGET_TFLOPS = 1300.0


def aligned_operands(key, m: int, k: int, n: int):
    """Aligned e4m3 operands (docs/interfaces.md) with power-of-two scales in [2^-2, 2^2]."""
    ka, kb, ksa, ksb = jax.random.split(key, 4)
    a = jax.random.normal(ka, (1, m, k), jnp.bfloat16).astype(jnp.float8_e4m3fn)
    b = jax.random.normal(kb, (1, n, k), jnp.bfloat16).astype(jnp.float8_e4m3fn)
    sa = jnp.exp2(jax.random.randint(ksa, (1, k // 128, m), -2, 3).astype(jnp.float32))
    sb = jnp.exp2(jax.random.randint(ksb, (1, k // 128, n), -2, 3).astype(jnp.float32))
    return a, b, sa, sb


def run_shape(m, k, n, args, res, torch) -> None:
    key = jax.random.PRNGKey(0)
    kx, kw, kq = jax.random.split(key, 3)
    x = jax.random.normal(kx, (m, k), jnp.bfloat16)
    w = jax.random.normal(kw, (k, n), jnp.bfloat16)
    ops = aligned_operands(kq, m, k, n)
    flops = 2 * m * n * k
    impls = args.only.split(",") if args.only else IMPLS
    for name in impls:
        out = res.setdefault(name, {})
        try:
            if name == "bf16":
                t = timeit(jax.jit(lambda x, w: lax.dot_general(x, w, DN)), (x, w), args.calls, args.batches)
            elif name == "xla_fp8":
                (x8, sx), (w8, sw) = per_tensor_fp8(x), per_tensor_fp8(w)
                t = timeit(jax.jit(fp8_dot), (x8, w8, sx, sw), args.calls, args.batches)
            elif name == "torch_fp8":
                if torch is None:
                    out["skipped"] = args.torch_reason
                    continue
                xt = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                wt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                sx = (xt.abs().max().float() / 448.0).reshape(())
                sw = (wt.abs().max().float() / 448.0).reshape(())
                x8 = (xt.float() / sx).to(torch.float8_e4m3fn)
                w8 = (wt.float() / sw).to(torch.float8_e4m3fn).t()  # (K, N) column-major
                fn = functools.partial(torch._scaled_mm, x8, w8, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
                t = timeit_torch(torch, fn, args.calls, args.batches)
            elif name.startswith("mx_t"):
                tune = int(name[4:])
                variant = registry.find(registry.MXGemmConfig, tune=tune)
                if variant is None or not library.has_kernel(variant.name):
                    out["skipped"] = f"tune {tune} is not in the library (tools/build_library.py --with-tunes)"
                    continue
                f = jax.jit(lambda a, b, sa, sb, tune=tune: mg.mx_gemm(a, b, sa, sb, out_dtype=jnp.bfloat16,
                                                                     path="cuda", tune=tune))  # fmt: skip
                t = timeit(f, ops, args.calls, args.batches)
            else:
                raise ValueError(f"unknown impl {name}")
            out["s"] = t
            out["tflops"] = round(flops / t / 1e12, 1)
            print(f"  {name:10s} {t * 1e3:8.3f} ms  {out['tflops']:7.1f} TFLOP/s", flush=True)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            out["error"] = repr(e)[:800]


def print_table(results) -> None:
    names = [i for i in IMPLS if any(i in r for r in results)]
    print("\nTFLOP/s (kernel only; bf16 out)")
    print(f"{'shape':>18s} " + " ".join(f"{nm:>10s}" for nm in names))
    for r in results:
        cells = [f"{r.get(nm, {}).get('tflops', float('nan')):10.1f}" for nm in names]
        print(f"{r['name']:>18s} " + " ".join(cells))


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/h200_mx_gemm_kernel.json",
        smoke="a small shape (numbers mean nothing; proves the script where the kernel runs)",
        time_budget=None,
        calls="calls per batch (default 20; smoke 2)",
        batches="batches (default 3; smoke 2)",
    )
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--shapes", type=int, default=None, help="only the first N shapes")
    args = harness.parse(ap, argv)
    harness.counts(args, calls={"full": 20, "smoke": 2}, batches={"full": 3, "smoke": 2})
    out_path = Path(args.out)
    torch, args.torch_reason = import_torch()
    meta = harness.metadata(
        args,
        kernels=True,
        torch=None if torch is None else torch.__version__,
        torch_skipped=args.torch_reason,
        flops="2*M*N*K",
        tunings={f"mx_t{v.tune}": repr(v) for v in (registry.find(registry.MXGemmConfig), *registry.MX_GEMM_TUNINGS)},
        target=f"mx_t0 >= {TARGET_TFLOPS} TFLOP/s at 8192^3",
        impls=__doc__.split("\n\n")[1],
    )
    print(f"device: {meta['device_kind']}, jax {meta['jax']}, torch: {args.torch_reason or 'yes'}")
    shapes = SMOKE_SHAPES if args.smoke else FULL_SHAPES[: args.shapes]
    budget = harness.TimeBudget(args.time_budget)
    results = []
    for m, k, n in shapes:
        res = dict(name=f"{m}x{k}x{n}", m=m, k=k, n=n)
        results.append(res)
        skip = budget.exceeded()
        if skip:
            res["skipped"] = skip
            continue
        print(f"{res['name']}  [{budget.elapsed():.0f} s]", flush=True)
        run_shape(m, k, n, args, res, torch)
        meta["elapsed_s"] = round(budget.elapsed(), 1)
        harness.write_json(out_path, meta, shapes=results)
    print_table(results)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
