#!/usr/bin/env python3
"""GEMM TFLOP/s: mx_dot_general (the MX GEMM kernel, and the XLA reference) vs BF16 and FP8 per-tensor baselines.

One process, side by side, bf16 inputs x (M, K) ~ N(0,1), w (K, N) ~ N(0,1), y = x @ w (bf16 out):
  bf16            lax.dot_general on bf16 (f32 accumulation inside the GEMM, bf16 out)
  xla_fp8         lax.dot_general on float8_e4m3fn operands (per-tensor scales amax/448, cast BEFORE timing,
                  not counted), preferred_element_type=bf16, output times sx*sw
  xla_fp8_from_bf16  the same with the amax + scale + cast inside the timed function
  torch_bf16      torch.matmul on bf16 CUDA tensors (only where torch with CUDA imports)
  torch_fp8       torch._scaled_mm, e4m3 per-tensor scales, bf16 out, operands pre-cast (torch with CUDA only)
  ours            jax_mxfp8.mx_dot_general(x, w, dn) (implementation=None: on an sm_90 GPU with the kernel
                  library, the producer pass + Hopper MX GEMM kernel, ops/mx_dot_kernel.py; quantization of
                  both operands included)
  ours_ref        the same with implementation="xla": the XLA reference (exact bfloat16 operands)
  ours_f32ref     the same reference with operands="float32" (float32 HIGHEST GEMMs: the old path, for the record)
Forward+backward ("fwdbwd"): jax.value_and_grad of sum(f(x, w) * ct) w.r.t. x and w with a random bf16
cotangent ct (not a plain sum: XLA folds constant cotangents; value_and_grad, not grad: under jax.grad the
forward GEMM's result is unused and XLA removes it, leaving 2 of the 3 GEMMs). Only bf16 and ours* have one.

FLOPs 2*M*N*K forward, 3x that forward+backward. Timing (benchmarks/harness.py):
enqueue --calls calls, block once, divide; median of --batches batches (torch: the same with
torch.cuda.synchronize). Numerics: SQNR (dB) against the float64 product of the bf16 inputs on a
sub-block (first --sqnr-rows rows x first --sqnr-rows output columns, full K: row/column quantization
blocks make it the same values as the full product there); for fwdbwd also dx and dw on sub-blocks.
Targets: ours forward >= 1.6x bf16 and >= 0.8x torch_fp8; ours fwd+bwd >= 1.4x bf16; ours_ref forward
>= 0.85x bf16.

Usage: python benchmarks/gemm.py [--out FILE.json] [--smoke] [--only bf16,ours,...] [--time-budget S]
                                 [--shapes MxKxN,...]
  --smoke   small shapes, 2 calls x 2 batches: proves the script on CPU (numbers mean nothing)
The JSON (default benchmarks/results/h200_gemm.json) is rewritten after every shape.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import traceback
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
import numpy as np
from harness import timeit, timeit_torch
from jax import lax

import jax_mxfp8 as mx
from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.reference import gemm

DN = (((1,), (0,)), ((), ()))
E4M3_MAX = 448.0
# (impl, pass, baseline, ratio): impl's pass time >= ratio x faster than baseline's forward / fwd+bwd
TARGETS = (
    ("ours", "fwd", "bf16", 1.6),
    ("ours", "fwd", "torch_fp8", 0.8),
    ("ours", "fwdbwd", "bf16", 1.4),
    ("ours_ref", "fwd", "bf16", 0.85),
)
FULL_SHAPES = [(8192, 8192, 8192), (16384, 4096, 14336), (16384, 14336, 4096)]  # (M, K, N)
SMOKE_SHAPES = [(128, 256, 192), (256, 128, 64)]
IMPLS = ("bf16", "xla_fp8", "xla_fp8_from_bf16", "torch_bf16", "torch_fp8", "ours", "ours_ref", "ours_f32ref")
HAS_FWDBWD = ("bf16", "ours", "ours_ref", "ours_f32ref")


def _parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'MxKxN,...' -> [(M, K, N), ...]; a malformed item is a usage error naming --shapes."""
    shapes = []
    for item in text.split(","):
        dims = item.strip().lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"not MxKxN with positive integers: {item!r}")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


def per_tensor_fp8(x):
    """(float8_e4m3fn of x / s, s) with s = amax(|x|) / 448 (float32 scalar)."""
    s = jnp.maximum(jnp.max(jnp.abs(x)).astype(jnp.float32), 1e-30) / E4M3_MAX
    return (x.astype(jnp.float32) / s).astype(jnp.float8_e4m3fn), s


def fp8_dot(x8, w8, sx, sw):
    return lax.dot_general(x8, w8, DN, preferred_element_type=jnp.bfloat16) * (sx * sw).astype(jnp.bfloat16)


def fp8_dot_from_bf16(x, w):
    (x8, sx), (w8, sw) = per_tensor_fp8(x), per_tensor_fp8(w)
    return fp8_dot(x8, w8, sx, sw)


def reference_dot(operands: str):
    """mx_dot_general's XLA reference for 2-D x @ w with the GEMM operand dtype forced (custom_vjp like ops/)."""
    config = MXDotConfig()

    def fwd(x, w):
        y = gemm.mx_dot_forward(x[None], w.T[None], config, lhs_q3=None, rhs_q3=None, operands=operands)
        return y[0].astype(x.dtype), (x, w)

    def bwd(res, g):
        x, w = res
        dx, dw = gemm.mx_dot_backward(x[None], w.T[None], g[None], config, None, operands=operands)
        return dx[0].astype(x.dtype), dw[0].T.astype(w.dtype)

    f = jax.custom_vjp(lambda x, w: fwd(x, w)[0])
    f.defvjp(fwd, bwd)
    return f


JAX_FWD = {
    "bf16": lambda x, w: lax.dot_general(x, w, DN),
    "ours": lambda x, w: mx.mx_dot_general(x, w, DN),
    "ours_ref": lambda x, w: mx.mx_dot_general(x, w, DN, implementation="xla"),
    "ours_f32ref": reference_dot("float32"),
}


def fwdbwd(f):
    """value_and_grad of sum(f(x, w) * ct) w.r.t. (x, w), summed in float32."""
    return jax.value_and_grad(lambda x, w, ct: jnp.sum(f(x, w) * ct, dtype=jnp.float32), argnums=(0, 1))


def import_torch():
    """(torch, None) when torch with a CUDA device imports, else (None, why not)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return None, f"torch not importable: {e!r}"
    if not torch.cuda.is_available():
        return None, "torch has no CUDA device"
    return torch, None


def sqnr_sub(ref64, got) -> float:
    return round(float(sqnr_db(ref64, np.asarray(got, np.float64))), 2)


def run_shape(m, k, n, args, res, torch):
    calls, batches, r = args.calls, args.batches, args.sqnr_rows
    kx, kw, kc = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(kw, (k, n), jnp.float32).astype(jnp.bfloat16)
    ct = jax.random.normal(kc, (m, n), jnp.float32).astype(jnp.bfloat16)
    rr, rc, rk = min(r, m), min(r, n), min(r, k)
    f64 = functools.partial(np.asarray, dtype=np.float64)  # of device slices: no full-size host copies
    ref_y = f64(x[:rr]) @ f64(w[:, :rc])
    ref_dx = f64(ct[:rr]) @ f64(w[:rk]).T  # dx[:rr, :rk]
    ref_dw = f64(x[:, :rk]).T @ f64(ct[:, :rc])  # dw[:rk, :rc]
    flops = 2.0 * m * n * k
    res.update(flops_fwd=flops, flops_fwdbwd=3 * flops)
    impls = res.setdefault("impls", {})
    wanted = [i for i in IMPLS if not args.only or i in args.only.split(",")]
    for name in wanted:
        out = impls.setdefault(name, {})
        try:
            if name.startswith("torch"):
                if torch is None:
                    out["skipped"] = args.torch_reason
                    continue
                xt = torch.from_numpy(np.asarray(x.astype(jnp.float32))).cuda().to(torch.bfloat16)
                wt = torch.from_numpy(np.asarray(w.astype(jnp.float32))).cuda().to(torch.bfloat16)
                if name == "torch_bf16":
                    fn = functools.partial(torch.matmul, xt, wt)
                else:
                    sx = (xt.abs().max().float() / E4M3_MAX).reshape(())
                    sw = (wt.abs().max().float() / E4M3_MAX).reshape(())
                    x8 = (xt.float() / sx).to(torch.float8_e4m3fn)
                    w8 = (wt.float() / sw).to(torch.float8_e4m3fn).t().contiguous().t()  # column-major (K, N)
                    fn = functools.partial(torch._scaled_mm, x8, w8, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
                y = fn()
                out["fwd_s"] = timeit_torch(torch, fn, calls, batches)
                out["sqnr_fwd_db"] = sqnr_sub(ref_y, y[:rr, :rc].float().cpu().numpy())
                del xt, wt, y, fn
            elif name.startswith("xla_fp8"):
                (x8, sx), (w8, sw) = per_tensor_fp8(x), per_tensor_fp8(w)
                if name == "xla_fp8":
                    f, fargs = jax.jit(fp8_dot), (x8, w8, sx, sw)
                else:
                    f, fargs = jax.jit(fp8_dot_from_bf16), (x, w)
                y = f(*fargs)
                out["fwd_s"] = timeit(f, fargs, calls, batches)
                out["sqnr_fwd_db"] = sqnr_sub(ref_y, y[:rr, :rc])
            else:
                f = jax.jit(JAX_FWD[name])
                y = f(x, w)
                out["fwd_s"] = timeit(f, (x, w), calls, batches)
                out["sqnr_fwd_db"] = sqnr_sub(ref_y, y[:rr, :rc])
                if name in HAS_FWDBWD:
                    g = jax.jit(fwdbwd(JAX_FWD[name]))
                    _, (dx, dw) = g(x, w, ct)
                    out["fwdbwd_s"] = timeit(g, (x, w, ct), calls, batches)
                    out["sqnr_dx_db"] = sqnr_sub(ref_dx, dx[:rr, :rk])
                    out["sqnr_dw_db"] = sqnr_sub(ref_dw, dw[:rk, :rc])
                    out["finite"] = bool(jnp.isfinite(y).all() & jnp.isfinite(dx).all() & jnp.isfinite(dw).all())
                    del g, dx, dw
            out["fwd_tflops"] = round(flops / out["fwd_s"] / 1e12, 3)
            if "fwdbwd_s" in out:
                out["fwdbwd_tflops"] = round(3 * flops / out["fwdbwd_s"] / 1e12, 3)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            out["error"] = repr(e)[:800]
        print(f"  {name:18s} {json.dumps(out)}", flush=True)
    base = impls.get("bf16", {})
    for out in impls.values():
        for key in ("fwd", "fwdbwd"):
            if f"{key}_s" in out and f"{key}_s" in base:
                out[f"{key}_vs_bf16"] = round(base[f"{key}_s"] / out[f"{key}_s"], 3)
    if "ours" in impls and "ours_f32ref" in impls and "fwd_s" in impls["ours"] and "fwd_s" in impls["ours_f32ref"]:
        res["ours_fwd_speedup_vs_f32ref"] = round(impls["ours_f32ref"]["fwd_s"] / impls["ours"]["fwd_s"], 2)
    res["targets"] = {}
    for name, key, baseline, want in TARGETS:
        mine, theirs = impls.get(name, {}).get(f"{key}_s"), impls.get(baseline, {}).get(f"{key}_s")
        ratio = None if mine is None or theirs is None else round(theirs / mine, 3)
        res["targets"][f"{name} {key} >= {want}x {baseline}"] = {"ratio": ratio, "pass": ratio and ratio >= want}


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def print_table(results):
    print(
        "\n| shape (M x K x N) | impl | fwd ms | fwd TFLOP/s | vs bf16 | fwd+bwd ms | fwd+bwd TFLOP/s | vs bf16 | "
        "SQNR fwd / dx / dw (dB) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for res in results:
        for name, o in res.get("impls", {}).items():
            if "skipped" in o or "error" in o:
                print(f"| {res['name']} | {name} | {o.get('skipped') or 'ERROR ' + o['error'][:60]} |" + " |" * 6)
                continue
            sq = " / ".join(fmt(o.get(f"sqnr_{t}_db"), ".1f") for t in ("fwd", "dx", "dw"))
            print(
                f"| {res['name']} | {name} | {fmt(o.get('fwd_s', 0) * 1e3, '.3f')} | {fmt(o.get('fwd_tflops'), '.4g')} "
                f"| {fmt(o.get('fwd_vs_bf16'), '.3f')} | "
                f"{fmt(o['fwdbwd_s'] * 1e3, '.3f') if 'fwdbwd_s' in o else '-'} | {fmt(o.get('fwdbwd_tflops'), '.4g')} "
                f"| {fmt(o.get('fwdbwd_vs_bf16'), '.3f')} | {sq} |"
            )
        for target, t in res.get("targets", {}).items():
            print(f"| {res['name']} | target: {target} | {t['ratio']} | {t['pass']} |" + " |" * 5)


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/h200_gemm.json",
        smoke="small shapes, 2 calls x 2 batches: proves the script on CPU (numbers mean nothing)",
        time_budget=200.0,
        calls="calls per batch (default 30; smoke 2)",
        batches="batches (default 3; smoke 2)",
    )
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--sqnr-rows", type=int, default=256)
    ap.add_argument(
        "--shapes",
        type=_parse_shapes,
        default=None,
        help="comma-separated MxKxN (x (M, K) @ w (K, N)) instead of the three default shapes, e.g. the LM "
        "example's GEMMs: 32768x1024x1536,32768x1024x1024,32768x1024x4096,32768x4096x1024",
    )
    args = harness.parse(ap, argv)
    harness.counts(args, calls={"full": 30, "smoke": 2}, batches={"full": 3, "smoke": 2})
    budget = harness.TimeBudget(args.time_budget)
    out_path = Path(args.out)
    torch, args.torch_reason = import_torch()
    meta = harness.metadata(
        args,
        kernels=True,
        torch=None if torch is None else torch.__version__,
        torch_skipped=args.torch_reason,
        flops="2*M*N*K forward; 3x that forward+backward (value_and_grad: all three GEMMs run)",
        inputs="x (M, K), w (K, N) bf16 N(0,1); cotangent ct (M, N) bf16 N(0,1)",
        sqnr=f"vs float64 product of the bf16 inputs on the first {args.sqnr_rows} rows/cols (full contraction)",
        impls=__doc__.split("\n\n")[1],
    )
    print(f"device: {meta['device_kind']}, backend {meta['backend']}, jax {meta['jax']}, "
          f"torch: {args.torch_reason or 'yes'}")  # fmt: skip
    results = []
    shapes = args.shapes or (SMOKE_SHAPES if args.smoke else FULL_SHAPES)
    for m, k, n in shapes:
        res = dict(name=f"{m}x{k}x{n}", m=m, k=k, n=n)
        results.append(res)
        skip = budget.exceeded()
        if skip:
            res["skipped"] = skip
            print(f"{res['name']}: skipped", flush=True)
            continue
        print(f"{res['name']}  [{budget.elapsed():.0f} s]", flush=True)
        try:
            run_shape(m, k, n, args, res, torch)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res["error"] = repr(e)[:800]
        meta["elapsed_s"] = round(budget.elapsed(), 1)
        harness.write_json(out_path, meta, shapes=results)
    print_table(results)
    print(f"wrote {out_path} ({meta.get('elapsed_s')} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
