#!/usr/bin/env python3
"""Forward+backward attention TFLOP/s: ours (MXFP8, kernel path) vs cuDNN BF16 and cuDNN FP8 (per-tensor).

Run as `python benchmarks/attention.py --backward [...]` (or this file directly). Inputs: bf16 q, k, v ~
N(0, 1) in jax.nn's BTNH layout and a random bf16 cotangent ct ~ N(0, 1) of the output (never sum(): XLA
folds a constant cotangent). Timing: benchmarks/harness.py. Every timed function is jit(lambda q, k, v, ct:
jax.vjp(attention, q, k, v)[1](ct)): the forward and the backward with the forward's residuals.

  ours              jax_mxfp8.dot_product_attention(implementation="cuda"): forward kernel, then the backward
                    kernel where a variant covers the call (ops/attention_bwd_kernel.py), else the XLA
                    reference backward (the JSON's `bwd_path` says which one ran). Jagged: on the padded batch
                    with sequence lengths
  ours_varlen       jagged only: jax_mxfp8.varlen_attention(implementation="cuda") on the packed rows (packed
                    once, untimed; cotangent packed the same way)
  ours_dq_fp16      --dq-accum fp32,fp16,fp32_det,fp16_det: `ours` with AttentionConfig(dq_accum="fp16")
  ours_dq_*_det     (and / or deterministic=True): the backward kernel's dQ modes (speed and SQNR study)
  ours_bwd_kernel   the backward call alone (primitives.attention_bwd.attention_bwd) on operands prepared once
                    (FLOPs 2.5x forward), when a backward variant exists
  ours_bwd_sm100    on compute capability 10.x (and --smoke): the Blackwell pre-pass + backward alone
                    (primitives.attention_bwd_sm100) on operands prepared once (FLOPs 2.5x forward); `ours` there
                    is the sm100 forward and backward
  cudnn_bf16        jax.nn.dot_product_attention(implementation="cudnn") (with sequence lengths when jagged)
  cudnn_fp8         jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(use_fp8=True), per-tensor
                    scales 1, inputs and cotangent cast to float8_e4m3fn BEFORE timing; no sequence lengths,
                    so not run on the jagged batch

FLOPs of forward+backward = 3.5x the forward's 4*B*N*T*S*H (x0.5 causal; jagged: sum of 4*N*L^2*H over the
real lengths, the same useful FLOPs for every implementation). Correctness (not asserted): SQNR (dB) of dq,
dk, dv against cuDNN BF16's over valid rows, and a NaN check. Targets (on `ours`): non-causal >= 1.3x
cuDNN BF16 and >= 0.95x cuDNN FP8; causal >= 1.2x; H64 >= 1.2x; jagged >= 1.6x (padded with lengths).

  --smoke        tiny shapes on any backend (CPU): ours via implementation="emulated" (the kernel path with
                 the kernel calls emulated), baselines via jax.nn implementation="xla"; numbers mean nothing
  --quick        four shapes (non-causal B4 T4k, causal B2 T8k, H64, jagged), 10 calls per batch
  --time-budget  shapes not started after this many seconds are skipped (default 280; alias --budget-s)
The JSON (default benchmarks/results/h200_attention_bwd.json) is rewritten after every shape.
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from pathlib import Path

import harness
import jax
import jax.numpy as jnp
import numpy as np
from attention_baselines import FP8_NO_LENGTHS, cudnn_fp8_attention, issue_shapes, shape
from harness import timeit

import jax_mxfp8 as mx
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.ops import attention_core as attn_ops
from jax_mxfp8.primitives import attention_bwd as abwd
from jax_mxfp8.primitives import attention_bwd_sm100 as bwd_sm100
from jax_mxfp8.primitives import attention_fwd as afwd
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.attention_sm100_operands import sm100_operand
from jax_mxfp8.reference.varlen import to_packed, to_padded

TARGETS = {
    "noncausal": [("cudnn_bf16", 1.3), ("cudnn_fp8", 0.95)],
    "causal": [("cudnn_bf16", 1.2)],
    "h64": [("cudnn_bf16", 1.2)],
    "jagged": [("cudnn_bf16", 1.6)],
}
FWD_BWD_FACTOR = 3.5
BWD_FACTOR = 2.5


def shapes_for(mode: str) -> list[dict]:
    if mode == "smoke":
        return [shape(1, 128, 2, 64, True, "causal"), shape(2, 128, 2, 64, False, "jagged", lens_range=(32, 128))]
    return issue_shapes(quick=mode == "quick")


def fwd_bwd(attn):
    """(q, k, v, ct) -> (dq, dk, dv): the forward and its vjp applied to the cotangent."""

    def f(q, k, v, ct):
        out, vjp = jax.vjp(attn, q, k, v)
        return vjp(ct.astype(out.dtype))  # a no-op but for the smoke FP8 stand-in (bf16 output)

    return f


def build_impls(sh, smoke: bool, dq_accums: tuple[str, ...]):
    """name -> (kind, attention fn or None, why skipped). kind: "dense" (q, k, v BTNH, lens), "packed"
    (packed rows, cu), "fp8" (fp8 q, k, v, ct), "bwd_kernel" (prepared BwdOperands)."""
    c, h = sh["causal"], sh["h"]
    scale = 1.0 / math.sqrt(h)
    jagged = sh["lens_range"] is not None
    sm100 = library.gpu_arch() in bwd_sm100.ARCHS
    ours_impl = "emulated" if smoke else "cuda"
    impls = {}

    def cudnn_bf16(lens):
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=c, implementation="xla" if smoke else "cudnn",
            query_seq_lengths=lens, key_value_seq_lengths=lens,
        )  # fmt: skip

    impls["cudnn_bf16"] = ("dense", cudnn_bf16, None)
    for accum in dq_accums:

        def ours(lens, accum=accum):
            cfg = mx.AttentionConfig(dq_accum=accum.removesuffix("_det"), deterministic=accum.endswith("_det"))
            return lambda q, k, v: mx.dot_product_attention(
                q, k, v, is_causal=c, implementation=ours_impl, query_seq_lengths=lens,
                key_value_seq_lengths=lens, config=cfg,
            )  # fmt: skip

        impls["ours" if accum == "fp32" else f"ours_dq_{accum}"] = ("dense", ours, None)
    if jagged:
        t = sh["t"]

        def ours_varlen(cu):
            return lambda q, k, v: mx.varlen_attention(
                q, k, v, cu, cu, max_seqlen_q=t, max_seqlen_k=t, is_causal=c, implementation=ours_impl
            )

        impls["ours_varlen"] = ("packed", ours_varlen, None)
    variant, why = abwd.kernel_variant(head_dim=h, causal=c)
    if variant is not None and not smoke and variant.name not in {n for n, _ in library.kernel_names()}:
        variant, why = None, f"the kernel library has no {variant.name}"
    impls["ours_bwd_kernel"] = ("bwd_kernel", variant, why)
    if sm100 or smoke:
        v100 = bwd_sm100.find_variant(head_dim=h, causal=c)
        why100 = None if v100 is not None else f"no sm100 backward variant for head_dim {h}"
        if v100 is not None and not smoke and not library.has_kernel(v100.name):
            why100 = f"the kernel library has no {v100.name}"
        impls["ours_bwd_sm100"] = ("bwd_sm100", v100, why100)

    fp8_attn = cudnn_fp8_attention(c, scale, smoke)
    skip = FP8_NO_LENGTHS if jagged else None
    impls["cudnn_fp8"] = ("fp8", lambda lens: fp8_attn, skip)
    return impls


@jax.jit
def _sqnr_parts(ref, x, valid):
    """(sum ref^2, sum (x - ref)^2, any NaN in x) over valid rows; ref, x (B, L, heads, H), valid (B, L)."""
    m = valid[:, :, None, None]
    r, xf = ref.astype(jnp.float32), x.astype(jnp.float32)
    return jnp.sum(jnp.where(m, r * r, 0.0)), jnp.sum(jnp.where(m, (xf - r) ** 2, 0.0)), jnp.any(jnp.isnan(xf) & m)


def _bwd_path(decisions) -> str:
    paths = [d.path for d in decisions if d.op == kbwd.OP]
    return paths[0] if paths else "reference (forward not on the kernel path)"


def run_shape(sh, args, smoke, res):
    b, t, n, h, c = sh["b"], sh["t"], sh["n"], sh["h"], sh["causal"]
    key = jax.random.key(1000 * b + t // 32 + n + h + c)
    q, k, v, ct = (jax.random.normal(jax.random.fold_in(key, i), (b, t, n, h), jnp.bfloat16) for i in range(4))
    lens = lens_np = None
    if sh["lens_range"]:
        lo, hi = sh["lens_range"]
        lens_np = np.random.default_rng(0).integers(lo, hi + 1, size=b).astype(np.int32)
        lens = jnp.asarray(lens_np)
        fwd_flops = float(sum(4.0 * n * float(L) ** 2 * h for L in lens_np))
        res["lengths"] = lens_np.tolist()
    else:
        fwd_flops = 4.0 * b * n * t * t * h * (0.5 if c else 1.0)
    res["flops_fwd"], res["flops_fwd_bwd"] = fwd_flops, FWD_BWD_FACTOR * fwd_flops
    valid = jnp.ones((b, t), bool) if lens is None else jnp.arange(t)[None, :] < lens[:, None]
    ref = None
    res["impls"] = {}
    for name, (kind, make, skip) in build_impls(sh, smoke, args.dq_accum).items():
        entry = res["impls"].setdefault(name, {})
        if skip:
            entry["skipped"] = skip
            print(f"  {name:16s} skipped: {skip}", flush=True)
            continue
        try:
            flops = FWD_BWD_FACTOR * fwd_flops
            if kind == "dense":
                fn, call_args = fwd_bwd(make(lens)), (q, k, v, ct)
            elif kind == "fp8":
                fn, call_args = fwd_bwd(make(lens)), tuple(x.astype(jnp.float8_e4m3fn) for x in (q, k, v, ct))
            elif kind == "packed":
                cu = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(lens)]).astype(jnp.int32)
                total = int(np.sum(lens_np))
                packed = tuple(jax.jit(to_packed, static_argnums=3)(x, cu, lens, total) for x in (q, k, v, ct))
                fn, call_args = fwd_bwd(make(cu)), packed
            elif kind == "bwd_sm100":  # the sm100 pre-pass + backward alone on operands prepared once
                flops = BWD_FACTOR * fwd_flops
                fn, call_args = _bwd_sm100(make, q, k, v, ct, lens, c, smoke)
            else:  # the backward call alone on operands prepared once
                flops = BWD_FACTOR * fwd_flops
                fn, call_args = _bwd_kernel(make, q, k, v, ct, lens, c, smoke)
            start = time.perf_counter()
            if name.startswith("ours"):  # decisions are recorded while tracing: a trace cached by an earlier
                jax.clear_caches()  # call of the same op and shapes (another script in this process) records none
            with impl.record() as decisions:
                compiled = jax.jit(fn).lower(*call_args).compile()
            entry["compile_s"] = round(time.perf_counter() - start, 2)
            if name.startswith("ours") and kind not in ("bwd_kernel", "bwd_sm100"):
                entry["bwd_path"] = _bwd_path(decisions)
            grads = jax.block_until_ready(compiled(*call_args))
            if kind == "packed":
                grads = tuple(to_padded(g, cu, lens, t) for g in grads)
            if kind not in ("bwd_kernel", "bwd_sm100"):
                grads = [g.astype(jnp.bfloat16) for g in grads]
                if name == "cudnn_bf16":
                    ref = grads
                    entry["has_nan"] = any(bool(_sqnr_parts(g, g, valid)[2]) for g in grads)
                elif ref is not None:
                    for dname, g, r in zip(("dq", "dk", "dv"), grads, ref, strict=True):
                        sig, err, nan = (float(x) for x in _sqnr_parts(r, g, valid))
                        entry[f"sqnr_{dname}_vs_cudnn_bf16_db"] = 10 * math.log10(sig / max(err, 1e-30))
                        entry["has_nan"] = entry.get("has_nan", False) or bool(nan)
            del grads
            sec = timeit(compiled, call_args, args.calls, args.batches)
            entry["ms"], entry["tflops"] = sec * 1e3, flops / sec / 1e12
            msg = f"{entry['ms']:9.3f} ms {entry['tflops']:7.4g} TFLOP/s"
            sq = [entry.get(f"sqnr_{d}_vs_cudnn_bf16_db") for d in ("dq", "dk", "dv")]
            if None not in sq:
                msg += "  SQNR dq/dk/dv " + "/".join(f"{x:.1f}" for x in sq) + " dB"
            msg += "  NaN!" if entry.get("has_nan") else ""
            msg += f"  bwd: {entry['bwd_path']}" if "bwd_path" in entry else ""
            print(f"  {name:16s} {msg}  (compile {entry['compile_s']} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - record and go on
            traceback.print_exc(limit=4)
            entry["error"] = repr(e)[:800]
            print(f"  {name:16s} ERROR {repr(e)[:200]}", flush=True)
    im = res["impls"]
    res["ratios"] = {
        f"{o}/{base}": im[o]["tflops"] / im[base]["tflops"]
        for o in im
        if o.startswith("ours") and "tflops" in im[o]
        for base in ("cudnn_bf16", "cudnn_fp8")
        if "tflops" in im.get(base, {})
    }
    checks = []
    for base, need in TARGETS[sh["group"]]:
        r = res["ratios"].get(f"ours/{base}")
        checks.append("n/a" if r is None else f"{base} {r:.2f}x {'>=' if r >= need else '<'} {need}")
    res["target"] = "; ".join(checks)


def _bwd_kernel(variant, q, k, v, ct, lens, causal, smoke):
    """The pre-pass run once (untimed) on the forward's residuals; returns (the call alone, its args)."""
    h = q.shape[-1]
    st = attn_ops.AttentionStatic(
        config=mx.AttentionConfig(), scale=h**-0.5, is_causal=causal, is_mx=(False,) * 3,
        out_dtype=np.dtype(jnp.bfloat16), group=1, impl="emulated" if smoke else "cuda",
    )  # fmt: skip

    @jax.jit
    def prepare(q, k, v, ct):
        (o, lse), (quants, *_) = attn_ops.mx_attention_fwd(st, q, k, v, None, None, lens, lens)
        do_q = attn_ops.square_sequence_major(ct, lens, "up", st.impl)
        mxs = (quants[f"{x}:square"] for x in "qkv")
        fp8_path = st.impl if variant.sdp_fp8 else None  # the FP8 copies of an sdp_fp8 variant (production)
        kw = dict(q_len=lens, kv_len=lens, fp8_path=fp8_path, scale=st.scale, path=st.impl, do_f16=variant.dv_f16)
        return abwd.bwd_operands(*mxs, do_q, ct, o, lse, jnp.zeros_like(lse), **kw)

    ops = prepare(q, k, v, ct)
    path = st.impl
    return (lambda ops: abwd.attention_bwd(ops, variant=variant, scale=st.scale, path=path)), (ops,)


def _bwd_sm100(variant, q, k, v, ct, lens, causal, smoke):
    """The sm100 pre-pass + backward on the forward's O and LSE (the reference forward, run once, untimed) and
    the square-block operands with both scale orientations; returns (the calls, their args)."""
    h, path = q.shape[-1], "emulated" if smoke else "cuda"
    b, t = q.shape[:2]
    tables = jnp.stack([jnp.full((b,), t, jnp.int32) if lens is None else lens] * 2)

    @jax.jit
    def prepare(q, k, v):
        o, lse = mx.dot_product_attention(
            q, k, v, is_causal=causal, query_seq_lengths=lens, key_value_seq_lengths=lens, implementation="xla",
            return_residual="lse",
        )  # fmt: skip
        ops = tuple(sm100_operand(attn_ops.square_sequence_major(x, lens, "up", path)) for x in (q, k, v))
        return ops, o, lse

    ops, o, lse = prepare(q, k, v)

    def run(ops, o, lse, ct):
        do_op, delta = bwd_sm100.bwd_prepass_sm100(ct, o, jnp.zeros_like(lse), tables, path=path)
        return bwd_sm100.attention_bwd_sm100(
            *ops, do_op, lse, delta, tables, variant=variant, scale=h**-0.5, path=path
        )  # fmt: skip

    return run, (ops, o, lse, ct)


def print_table(results):
    cols = sorted({x for r in results for x in r.get("impls", {})}, key=lambda x: (not x.startswith("ours"), x))
    print("\nTFLOP/s forward+backward (FLOPs 3.5x forward; ours_bwd_kernel: backward call alone, 2.5x)\n")
    head = ["shape", *cols, "ours/BF16", "ours/FP8", "SQNR ours dq/dk/dv vs BF16 (dB)", "ours bwd", "target"]
    rows = []
    for r in results:
        im, ra = r.get("impls", {}), r.get("ratios", {})
        cells = [r["name"]]
        for col in cols:
            e = im.get(col, {})
            x = e.get("tflops")
            cells.append(("-" if "error" not in e else "err") if x is None else f"{x:{'.1f' if x >= 10 else '.3g'}}")
        for base in ("cudnn_bf16", "cudnn_fp8"):
            x = ra.get(f"ours/{base}")
            cells.append("-" if x is None else f"{x:.2f}x")
        o = im.get("ours", {})
        sq = [o.get(f"sqnr_{d}_vs_cudnn_bf16_db") for d in ("dq", "dk", "dv")]
        cells.append("-" if None in sq else "/".join(f"{x:.1f}" for x in sq))
        cells += [o.get("bwd_path", "-"), r.get("target", "-")]
        rows.append(cells)
    print(harness.markdown_table(head, rows))
    for r in results:
        for name, e in r.get("impls", {}).items():
            if "error" in e:
                print(f"ERROR {r['name']} {name}: {e['error'][:300]}")


def main(argv=None) -> int:
    ap = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/h200_attention_bwd.json",
        quick="four shapes, 10 calls per batch",
        smoke="tiny shapes on any backend (kernel calls emulated; numbers mean nothing)",
        smoke_aliases=("--cpu-smoke",),
        time_budget=280.0,
        calls="calls per batch (default 30; 10 quick; 1 smoke)",
        batches="batches (default 3)",
    )
    ap.add_argument("--only", default=None, help="run only shapes whose name contains this substring")
    ap.add_argument(
        "--dq-accum", default="fp32", help="comma list of dQ-mode columns for ours: fp32,fp16,fp32_det,fp16_det"
    )
    args = harness.parse(ap, argv)
    args.dq_accum = tuple(dict.fromkeys(a.strip() for a in args.dq_accum.split(",")))
    if not set(args.dq_accum) <= {"fp32", "fp16", "fp32_det", "fp16_det"}:
        ap.error(f"--dq-accum {args.dq_accum}: each must be fp32, fp16, fp32_det or fp16_det")
    harness.counts(args, calls={"smoke": 1, "quick": 10, "full": 30}, batches=3)
    budget = harness.TimeBudget(args.time_budget)
    out_path = Path(args.out)
    kernel_ok, why = library.kernels_runnable(afwd.ARCHS)
    meta = harness.metadata(
        args,
        kernels=afwd.ARCHS,
        timing="jit(jax.vjp(attention, q, k, v)[1](ct)), random bf16 cotangent ct ~ N(0, 1) (fp8 for cuDNN FP8)",
        flops="forward+backward = 3.5 x 4*B*N*T*S*H (x0.5 causal; jagged: real lengths); backward alone 2.5x",
        targets={g: [dict(baseline=b, min_ratio=r) for b, r in v] for g, v in TARGETS.items()},
    )
    print(f"device: {meta['device_kind']}, jax {meta['jax']}, mode {args.mode}, kernel: {kernel_ok or why}", flush=True)
    results = []
    for sh in shapes_for(args.mode):
        if args.only and args.only not in sh["name"]:
            continue
        res = dict(sh)
        results.append(res)
        skip = budget.exceeded()
        if skip:
            res["skipped"] = skip
            continue
        print(f"{sh['name']}  [{budget.elapsed():.0f} s]", flush=True)
        try:
            run_shape(sh, args, args.mode == "smoke", res)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res["error"] = repr(e)[:800]
        meta["elapsed_s"] = round(budget.elapsed(), 1)
        harness.write_json(out_path, meta, shapes=results)
    print_table([r for r in results if "impls" in r])
    print(f"wrote {out_path} ({meta.get('elapsed_s', 0)} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
