#!/usr/bin/env python3
"""Kernel-only TFLOP/s of the Hopper MX GEMM (primitives/mx_gemm.py) on pre-aligned operands, with baselines.

One process, side by side, y (M, N) = x (M, K) @ w (K, N), bf16 out, for the (M, K, N) of --shape-set:
  default     8192^3, 16384 x 4096 x 14336 and 16384 x 14336 x 4096
  lm          the GEMMs of examples/train_lm.py --preset h200 (16 x 2048 = 32768 tokens, d 1024, 8 query and
              2 KV heads of 128: QKV N = 1536, GELU MLP 1024 -> 4096 -> 1024, not gated): forward, dgrad and
              wgrad of qkv, out, up, down (wgrad: M = output features, K = tokens, N = input features)
  block       the same for benchmarks/train_step.py's TransformerBlock (d 2048, 16 heads, T 4096 x B 4 =
              16384 tokens, QKV N = 6144, MLP 4x)
  Shapes that two GEMMs share run once (the JSON's `gemms` names every GEMM of a shape). In the training step
  some forward GEMMs run the quantize epilogue (registry/gemm_epilogue.py, 128x192 only), not timed here.
Columns:
  bf16        lax.dot_general on bf16 operands
  xla_fp8     lax.dot_general on float8_e4m3fn operands with per-tensor scales (cast before timing)
  torch_fp8   torch._scaled_mm, e4m3 per-tensor scales, bf16 out (operands pre-cast; torch with CUDA only)
  mx_t0       our kernel, production: the tiling chosen by shape (registry.mx_gemm_tile_n; its tile_n is
              in the JSON), on aligned operands made before timing: a (1, M, K), b (1, N, K) e4m3 K-major,
              sa (1, K/128, M), sb (1, K/128, N) powers of two (their quantization pass is not timed)
  mx_n192     production forced to the 128x192 tiling (mx_gemm tile_n=192)
  mx_n128     production forced to the 128x128 tiling (tile_n=128)
  mx_tN       the comparison schedules registry.MX_GEMM_TUNINGS (in the library when built with
              --with-tunes; skipped otherwise)
  With --smoke and no kernel library, the mx columns run the XLA emulation (path "emulated" in the JSON).
FLOPs 2*M*N*K. Timing (benchmarks/harness.py): enqueue --calls calls, block once, divide; median of
--batches batches (torch: the same with torch.cuda.synchronize). Target: mx_t0 >= 1300 TFLOP/s at 8192^3
(with the quantize pass, the end-to-end GEMM at 1.6x bf16).

Usage: python benchmarks/mx_gemm_kernel.py [--shape-set default|lm|block] [--out FILE.json] [--smoke]
       [--only bf16,mx_t0,...] [--time-budget S]
The JSON (default benchmarks/results/h200_mx_gemm_kernel.json; with --shape-set lm or block
h200_mx_gemm_kernel_<set>.json) is rewritten after every shape.
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
TUNINGS = {f"mx_t{v.tune}": v for v in registry.MX_GEMM_TUNINGS}
FORCED = {f"mx_n{t}": t for t in registry.PRODUCTION_TILE_NS}
IMPLS = ("mx_t0", *FORCED, *TUNINGS, "bf16", "xla_fp8", "torch_fp8")
TARGET_TFLOPS = 1300.0


def model_gemms(tokens: int, d: int, qkv: int, ff: int) -> list[tuple[str, int, int, int]]:
    """(name, M, K, N) of every MX GEMM of one pre-norm block's training step: forward y = x w, dgrad
    dx = dy w^T, wgrad dw = x^T dy (M = output features, K = tokens, N = input features) of the projections
    qkv (d -> qkv), out (d -> d), up (d -> ff), down (ff -> d)."""
    out = []
    for layer, k_in, n_out in (("qkv", d, qkv), ("out", d, d), ("up", d, ff), ("down", ff, d)):
        out += [(f"fwd_{layer}", tokens, k_in, n_out), (f"dgrad_{layer}", tokens, n_out, k_in)]
        out.append((f"wgrad_{layer}", n_out, tokens, k_in))
    return out


SHAPE_SETS = {
    "lm": model_gemms(tokens=16 * 2048, d=1024, qkv=(8 + 2 * 2) * 128, ff=4 * 1024),
    "block": model_gemms(tokens=4 * 4096, d=2048, qkv=3 * 2048, ff=4 * 2048),
}
"""The GEMMs of examples/train_lm.py --preset h200 and of benchmarks/train_step.py's block (module docstring)."""


def shape_list(shape_set: str, smoke: bool) -> list[tuple[tuple[int, int, int], list[str]]]:
    """((M, K, N), the names of the GEMMs of that shape) in first-use order, each shape once."""
    if smoke:
        return [(s, [f"smoke_{i}"]) for i, s in enumerate(SMOKE_SHAPES)]
    if shape_set == "default":
        return [(s, [f"{s[0]}x{s[1]}x{s[2]}"]) for s in FULL_SHAPES]
    merged: dict[tuple[int, int, int], list[str]] = {}
    for name, m, k, n in SHAPE_SETS[shape_set]:
        merged.setdefault((m, k, n), []).append(name)
    return list(merged.items())


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
            elif name.startswith("mx_"):
                kw = mx_call(name, m, n, args.smoke, out)
                if kw is None:
                    continue
                f = jax.jit(lambda a, b, sa, sb, kw=kw: mg.mx_gemm(a, b, sa, sb, out_dtype=jnp.bfloat16, **kw))
                t = timeit(f, ops, args.calls, args.batches)
            else:
                raise ValueError(f"unknown impl {name}")
            out["s"] = t
            out["tflops"] = round(flops / t / 1e12, 1)
            print(f"  {name:10s} {t * 1e3:8.3f} ms  {out['tflops']:7.1f} TFLOP/s", flush=True)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            out["error"] = repr(e)[:800]


def mx_call(name: str, m: int, n: int, smoke: bool, out: dict) -> dict | None:
    """mx_gemm's keywords (path, tune, tile_n) for column `name`, recorded in `out`; None (and out["skipped"])
    when its kernel is not in the library (smoke: the emulation runs instead)."""
    if name in TUNINGS:
        kw, variant = dict(tune=TUNINGS[name].tune), TUNINGS[name]
    elif name in FORCED or name == "mx_t0":
        tile_n = FORCED.get(name) or mg.tile_n_for(m=m, n=n)
        kw = dict(tile_n=FORCED[name]) if name in FORCED else {}
        variant = registry.find(registry.MXGemmConfig, tile_n=tile_n)
        out["tile_n"] = tile_n
    else:
        raise ValueError(f"unknown impl {name}")
    on_gpu = jax.default_backend() == "gpu"  # a built library on a CPU machine registers no handler for the host
    kw["path"] = "cuda" if on_gpu and library.has_kernel(variant.name) else "emulated" if smoke else None
    if kw["path"] is None:
        out["skipped"] = f"{variant.name}: no GPU, or not in the library (tools/build_library.py [--with-tunes])"
        return None
    out.update(kernel=variant.name, path=kw["path"])
    return kw


def print_table(results) -> None:
    names = [i for i in IMPLS if any(i in r for r in results)]
    print("\nTFLOP/s (kernel only; bf16 out); choice = mx_t0's tile_n")
    print(f"{'shape':>20s} {'gemms':>24s} {'choice':>6s} " + " ".join(f"{nm:>9s}" for nm in names))
    for r in results:
        cells = [f"{r.get(nm, {}).get('tflops', float('nan')):9.1f}" for nm in names]
        choice = r.get("mx_t0", {}).get("tile_n", "")
        print(f"{r['name']:>20s} {','.join(r['gemms']):>24s} {choice!s:>6s} " + " ".join(cells))


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
    ap.add_argument("--shape-set", default="default", choices=("default", *SHAPE_SETS), help="which shapes")
    args = harness.parse(ap, argv)
    if args.shape_set != "default" and args.out == ap.get_default("out"):
        args.out = args.out.replace(".json", f"_{args.shape_set}.json")
    harness.counts(args, calls={"full": 20, "smoke": 2}, batches={"full": 3, "smoke": 2})
    out_path = Path(args.out)
    torch, args.torch_reason = import_torch()
    meta = harness.metadata(
        args,
        kernels=True,
        torch=None if torch is None else torch.__version__,
        torch_skipped=args.torch_reason,
        flops="2*M*N*K",
        shape_set=args.shape_set,
        tunings={
            **{f"mx_n{t}": repr(registry.find(registry.MXGemmConfig, tile_n=t)) for t in FORCED.values()},
            **{name: repr(v) for name, v in TUNINGS.items()},
        },
        target=f"mx_t0 >= {TARGET_TFLOPS} TFLOP/s at 8192^3",
        impls=__doc__.split("\n\n")[1],
    )
    print(f"device: {meta['device_kind']}, jax {meta['jax']}, torch: {args.torch_reason or 'yes'}")
    shapes = shape_list(args.shape_set, args.smoke)[: args.shapes]
    budget = harness.TimeBudget(args.time_budget)
    results = []
    for (m, k, n), gemms in shapes:
        res = dict(name=f"{m}x{k}x{n}", m=m, k=k, n=n, gemms=gemms)
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
