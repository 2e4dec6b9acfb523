#!/usr/bin/env python3
"""Multi-device checks and benchmarks in one run (written for 2 GPUs; any device count >= 2 works).

1. train: the LM of examples/train_lm.py (its model, data, optimizer and train_step, placed on meshes with
   examples/train_multihost.py's sharding) at head_dim 128 (d_model 256, 2 heads: the attention kernels'
   size; the GEMMs' shapes are MX-kernel-sized too), trained for a fixed number of steps on the same batches
   from the same initial weights: one device (the reference), data=n, fsdp=n with the MXFP8 (quantized)
   weight all-gather, fsdp=n with the plain FP32 all-gather, tp=n. Per-step losses and the step-1 gradient
   against the one-device run, under the tolerances explained at FORWARD_RTOL (multi_gpu_train.py).
2. ring: context-parallel MXFP8 ring attention over n devices (jax_mxfp8.parallel.ring_attention), forward
   and backward, against one device: the MXFP8 XLA reference and implementation=None (the attention forward
   and backward kernels where the device has them), on the same bf16 inputs, B=1, T=32768, N=8, H=128,
   causal (zigzag) and non-causal: SQNR of O, LSE, dQ, dK, dV between them and of each against unquantized
   float32 attention and its gradients; forward and forward + backward wall times.
3. fsdp_gather: a bigger LM (d_model 2048) on the fsdp=n mesh, MXFP8 weight all-gather (forward AND
   backward: fsdp_mx_dot) vs the FP32 one and vs BF16 kernels (float32 master weights rounded to bfloat16
   on the shard, the usual mixed-precision FSDP: bf16_kernel_step): median step time over timed steps after
   warm-up, and the all-gather bytes of one step counted in the compiled HLO (train_multihost.step_collectives,
   as benchmarks/collectives.py), those of the FP8 variant's forward alone beside them.
4. multihost: examples/train_multihost.py as n processes of one device each through jax.distributed on
   localhost (FSDP with the FP8 gather, head_dim 128), against the same script as one process over the n
   devices (multi_gpu_multihost.py).

Every MXFP8 op runs with implementation=None: our CUDA kernels where the library and GPU allow, else XLA.
Each part records the library's kernel calls in its compiled programs (kernel_targets, per FFI target;
empty = the XLA reference path, e.g. on CPU, where no kernel runs or is emulated). The parts live in
multi_gpu_train.py, multi_gpu_ring.py, multi_gpu_fsdp.py and multi_gpu_multihost.py (the LM on a mesh that
parts 1 and 3 share: multi_gpu_mesh.py); this file holds the sizes, the command line and the report.

Run (device machine, 2 GPUs; docs/distributed.md gives the full command and its time estimate):
                       PYTHONPATH=$PWD python benchmarks/multi_gpu.py --time-budget 480 --out $OUT/multi_gpu.json
CPU smoke test:        XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
                           python benchmarks/multi_gpu.py --smoke --out $OUT/multi_gpu.json
Writes the JSON after every part (partial results survive a timeout; with --time-budget the parts not started
in time are skipped), prints markdown tables, and exits 1 if a correctness check fails (2 if a part raised).
"""

from __future__ import annotations

import os

# NVLink SHARP (multicast) stays off on the device machines; never unset it, only default it.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import argparse  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import harness  # noqa: E402
import jax  # noqa: E402
from multi_gpu_fsdp import part_fsdp_gather  # noqa: E402
from multi_gpu_mesh import log  # noqa: E402
from multi_gpu_multihost import part_multihost  # noqa: E402
from multi_gpu_ring import part_ring  # noqa: E402
from multi_gpu_train import part_train  # noqa: E402

sys.path.insert(0, str(harness.ROOT / "examples"))

import train_lm  # noqa: E402

# head_dim = d_model / heads: 128 (GPU) and 64 (smoke), both sizes the attention kernels cover
GPU_SIZES = dict(
    train=dict(steps=30, batch=16, seq_len=128, d_model=256, layers=2, heads=2),
    ring=dict(t=32768, heads=8, head_dim=128, calls=3, batches=3, exact_chunk=2048),
    bench=dict(batch=8, seq_len=512, d_model=2048, layers=4, heads=16, warmup=3, timed=20),
    multihost=dict(mesh="fsdp", fp8_gather=True, steps=20, batch=16, seq_len=128, d_model=256, layers=2, heads=2,
                   policy="mxfp8", timeout_s=300),
)  # fmt: skip
SMOKE_SIZES = dict(
    train=dict(steps=6, batch=8, seq_len=64, d_model=128, layers=1, heads=2),
    ring=dict(t=1024, heads=2, head_dim=64, calls=1, batches=1, exact_chunk=512),
    # the model and step count of `train`: its two fsdp steps come from the compilation cache
    bench=dict(batch=8, seq_len=64, d_model=128, layers=1, heads=2, warmup=2, timed=4),
    multihost=dict(mesh="fsdp", fp8_gather=True, steps=3, batch=8, seq_len=32, d_model=128, layers=1, heads=2,
                   policy="mxfp8", timeout_s=400),
)  # fmt: skip
PARTS = ("train", "ring", "fsdp_gather", "multihost")


def tables(results: dict) -> str:
    lines = []
    tr = results.get("train")
    if tr and "meshes" in tr:
        lines += [
            f"\n### LM training, head_dim {tr['config'].get('head_dim')}, {tr['config']['steps']} steps, vs the single "
            "device (tolerances: initial weights "
            f"rtol {tr['tolerance']['initial_weights_rtol']:g}, gradient >= {tr['tolerance']['grad_sqnr_floor_db']:g} "
            f"dB, trajectory rtol {tr['tolerance']['trajectory_rtol']:g})\n",
            "| mesh | final loss | initial weights rel diff | gradient SQNR dB | trajectory max rel diff "
            "| last-10 mean rel diff | step ms | all-gather KiB | kernel calls | pass |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, m in tr["meshes"].items():
            if "skipped" in m:
                lines.append(f"| {name} | skipped: {m['skipped']} | | | | | | | | |")
                continue
            lines.append(
                f"| {name} | {m['losses'][-1]:.5f} | {m['initial_weights_max_rel_diff']:.1e} "
                f"| {m['grad_sqnr_db']:.1f} | {m['max_rel_diff']:.1e} | {m['final10_rel_diff']:.1e} "
                f"| {m['step_time_ms']:.1f} | {m['all_gather_bytes'] / 1024:.0f} | {m['kernel_custom_calls']} "
                f"| {'yes' if m['passed'] else 'NO'} |"
            )
    rg = results.get("ring")
    if rg and "cases" in rg:
        c = rg["config"]
        lines += [
            f"\n### Ring attention over {c['devices']} devices, B{c['B']} T{c['T']} N{c['N']} H{c['H']} bf16, forward "
            "and backward (SQNR dB; single = one device, XLA reference; default = one device, implementation=None)\n",
            "| masking | ring vs single: O / LSE / dQ / dK / dV | ring vs default: O / dQ / dK / dV "
            "| vs f32, ring / single / default: O | dQ | dK | dV | fwd ms ring / single / default "
            "| fwd+bwd ms ring / single / default | default's kernels | pass |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        who3 = ("ring", "single_xla", "single_default")
        for case in rg["cases"]:
            s, t = case["sqnr_db"], case["times"]
            vs = lambda key, s=s: " / ".join(f"{s[f'{key}_{who}_vs_exact']:.2f}" for who in who3)
            tm = lambda key, t=t: " / ".join(f"{t[who][key]:.1f}" if key in t[who] else "same" for who in who3)
            calls = case["kernel_custom_calls"]["single_default"]["forward_backward"]
            lines.append(
                f"| {'causal zigzag' if case['causal'] else 'non-causal'} | "
                + " / ".join(f"{s[f'{k}_ring_vs_single']:.1f}" for k in ("o", "lse", "dq", "dk", "dv"))
                + " | "
                + " / ".join(f"{s[f'{k}_ring_vs_single_default']:.1f}" for k in ("o", "dq", "dk", "dv"))
                + f" | {vs('o')} | {vs('dq')} | {vs('dk')} | {vs('dv')} | {tm('forward_ms')} "
                f"| {tm('forward_backward_ms')} | {', '.join(calls) or 'none (XLA reference)'} "
                f"| {'yes' if case['passed'] else 'NO'} |"
            )
    fg = results.get("fsdp_gather")
    if fg and "variants" in fg:
        c = fg["config"]
        lines += [
            f"\n### FSDP all-gather, fsdp={c['mesh']['fsdp']}, d_model {c['d_model']}, {c['layers']} layers, "
            f"batch {c['batch']} x {c['seq_len']}\n",
            "| weight all-gather | params | median step ms (min-max) | all-gather MiB | collectives of one step |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, v in fg["variants"].items():
            colls = "; ".join(
                f"{k} x{x['count']} {x['bytes'] / 2**20:.2f}" for k, x in sorted(v["collectives"].items())
            )
            st = v["step_time_ms"]
            lines.append(
                f"| {name.replace('_gather', '').upper()} | {v['params'] / 1e6:.1f}M | {st['median']:.2f} "
                f"({st['min']:.2f}-{st['max']:.2f}) | {v['all_gather_bytes'] / 2**20:.2f} | {colls} |"
            )
        lines.append(
            f"\nall-gather bytes FP32/FP8 = {fg['all_gather_ratio_f32_over_fp8']}x, BF16/FP8 = "
            f"{fg['all_gather_ratio_bf16_over_fp8']}x; step time FP32/FP8 = {fg['step_time_ratio_f32_over_fp8']}x, "
            f"BF16/FP8 = {fg['step_time_ratio_bf16_over_fp8']}x; checks: {fg['checks']}"
        )
    mh = results.get("multihost")
    if mh and "config" in mh:
        c = mh["config"]
        title = f"examples/train_multihost.py as {c['processes']} processes of one device (jax.distributed)"
        lines.append(f"\n### {title}\n")
        if "losses_processes" in mh:
            lines.append(
                f"final loss {mh['losses_processes'][-1]:.5f} ({c['processes']} processes) vs "
                f"{mh['losses_one_process'][-1]:.5f} (one process); max rel diff {mh['max_rel_diff']:.1e}; "
                f"all-gather bytes {mh['all_gather_bytes']}; checks: {mh['checks']}"
            )
        else:
            lines.append(f"runs failed: exit codes {[mh['one_process']['rc']] + [p['rc'] for p in mh['processes']]}")
    for part, r in results.items():
        if isinstance(r, dict) and "error" in r:
            lines.append(f"\n{part}: ERROR {r['error']}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = harness.parser(
        __doc__,
        __file__,
        out="benchmarks/results/multi_gpu.json",
        smoke="tiny sizes (CPU test)",
        time_budget=None,
    )
    p.add_argument("--devices", type=int, default=2, help="use the first N devices (N >= 2)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--policy", default="mxfp8-head-bf16", choices=sorted(train_lm.POLICIES))
    p.add_argument("--train-steps", type=int, default=None, help="override part 1's step count")
    p.add_argument("--ring-t", type=int, default=None, help="override part 2's sequence length")
    p.add_argument("--bench-d-model", type=int, default=None, help="override part 3's d_model")
    p.add_argument("--bench-layers", type=int, default=None, help="override part 3's layer count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compile-cache", default=None, help="persistent XLA compilation cache folder (--smoke: a temporary one)"
    )
    return harness.parse(p, argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}; choose from {PARTS}")
    if args.devices < 2 or args.devices > jax.device_count():
        raise SystemExit(f"--devices {args.devices}: need 2 <= N <= {jax.device_count()} (visible devices)")
    devices = jax.devices()[: args.devices]
    cache = args.compile_cache or (tempfile.mkdtemp(prefix="multi_gpu_xla_cache_") if args.smoke else None)
    if cache:
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    sizes = {k: dict(v) for k, v in (SMOKE_SIZES if args.smoke else GPU_SIZES).items()}
    if args.train_steps:
        sizes["train"]["steps"] = args.train_steps
    if args.ring_t:
        sizes["ring"]["t"] = args.ring_t
    if args.bench_d_model:
        sizes["bench"]["d_model"] = args.bench_d_model
    if args.bench_layers:
        sizes["bench"]["layers"] = args.bench_layers
    n = len(devices)
    for part in ("train", "bench", "multihost"):  # every kernel shard whole MX blocks; batch splits n ways
        sizes[part]["d_model"] = -(-sizes[part]["d_model"] // (32 * n)) * 32 * n
        sizes[part]["batch"] = -(-sizes[part]["batch"] // n) * n
        sizes[part]["head_dim"] = sizes[part]["d_model"] // sizes[part]["heads"]
    meta = harness.metadata(
        args,
        kernels=True,
        devices_used=len(devices),
        env={k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "XLA_FLAGS", "JAX_PLATFORMS")},
        args=vars(args),
        sizes=sizes,
    )
    kernels = meta["kernels"]
    log(
        f"{len(devices)} x {meta['device_kind']} ({jax.device_count()} visible), jax {jax.__version__}, "
        f"kernels: {kernels['available'] or kernels['why_not']}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    budget = harness.TimeBudget(args.time_budget)
    runners = {
        "train": lambda: part_train(sizes["train"], devices, args.policy, args.seed),
        "ring": lambda: part_ring(sizes["ring"], devices, args.seed),
        "fsdp_gather": lambda: part_fsdp_gather(sizes["bench"], devices, args.policy, args.seed),
        "multihost": lambda: part_multihost(sizes["multihost"], devices, args.seed, out.parent),
    }
    results, errors = {}, False
    for part in parts:
        t0 = time.perf_counter()
        skip = budget.exceeded()
        if skip:
            results[part] = {"skipped": skip, "passed": False}
            log(f"part {part}: skipped ({skip})")
            continue
        log(f"part {part} ...")
        try:
            results[part] = runners[part]()
        except Exception as e:  # noqa: BLE001 - recorded, the other parts still run
            traceback.print_exc()
            results[part] = {"error": f"{type(e).__name__}: {e}", "passed": False}
            errors = True
        results[part]["seconds"] = round(time.perf_counter() - t0, 1)
        results["passed"] = all(results[p]["passed"] for p in PARTS if p in results)
        harness.write_json(out, meta, **results)
        log(f"part {part}: {'passed' if results[part]['passed'] else 'FAILED'} in {results[part]['seconds']}s")
    results["checks"] = {p: results[p]["passed"] for p in parts}
    results["passed"] = all(results["checks"].values())
    harness.write_json(out, meta, **results)
    print(tables(results))
    print(f"\n{'ALL CHECKS PASSED' if results['passed'] else 'CHECKS FAILED'}; wrote {out}", flush=True)
    if cache and not args.compile_cache:
        shutil.rmtree(cache, ignore_errors=True)
    return 0 if results["passed"] else (2 if errors else 1)


if __name__ == "__main__":
    sys.exit(main())
