"""Part 4 of benchmarks/multi_gpu.py: examples/train_multihost.py as n processes of one device each, joined by
jax.distributed on localhost, against the same script as one process over the same n devices.

Each run is a subprocess (its own XLA client: the parent's holds the devices it measured parts 1-3 on):
  GPU: process i sees one GPU (CUDA_VISIBLE_DEVICES = the i-th of the parent's), the one-process reference
       sees all n; none preallocates (XLA_PYTHON_CLIENT_PREALLOCATE=false), since the parent already holds
       most of every GPU's memory. Collectives go through NCCL (NCCL_NVLS_ENABLE as the parent's: 0).
  CPU: process i holds one CPU device (--xla_force_host_platform_device_count=1), the reference n; the
       processes' collectives go through gloo (train_multihost sets jax_cpu_collectives_implementation).
Both runs train the same model on the same batches from the same initial weights on a mesh of the same
shape, so the losses agree up to the order of float32 sums (the tolerances of part 1: multi_gpu_train.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import harness
import numpy as np
from multi_gpu_mesh import log
from multi_gpu_train import FORWARD_RTOL, TRAJECTORY_RTOL

SCRIPT = harness.ROOT / "examples" / "train_multihost.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def child_env(platform: str, devices: list[str], count: int) -> dict[str, str]:
    """The environment of a subprocess that sees `count` devices: on GPU the CUDA ids `devices`, on CPU
    `count` host devices (the parent's --xla_force_host_platform_device_count replaced)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(harness.ROOT), os.environ.get("PYTHONPATH", "")]))
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device")]
    if platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        flags.append(f"--xla_force_host_platform_device_count={count}")
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def cuda_ids(n: int) -> list[str]:
    """The CUDA ids of the parent's first n GPUs (its CUDA_VISIBLE_DEVICES order when set)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else [str(i) for i in range(n)]
    if len(ids) < n:
        raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r} names fewer than {n} GPUs")
    return ids[:n]


def launch(argv_list: list[list[str]], envs: list[dict], timeout: float) -> list[dict]:
    """Starts one subprocess per argv (all at once: the processes of one jax.distributed job must meet),
    waits for all; [{"rc", "seconds", "output_tail"}] in order. A process past `timeout` is killed."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for argv, env in zip(argv_list, envs, strict=True)
    ]
    out = []
    for p in procs:
        try:
            text = p.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t0)))[0]
        except subprocess.TimeoutExpired:
            p.kill()
            text = p.communicate()[0] + f"\n[killed after {timeout:.0f} s]"
        out.append({"rc": p.returncode, "seconds": round(time.perf_counter() - t0, 1), "output_tail": text[-3000:]})
    return out


def part_multihost(cfg: dict, devices, seed: int, out_dir) -> dict:
    n = len(devices)
    platform = devices[0].platform
    ids = cuda_ids(n) if platform == "gpu" else [str(i) for i in range(n)]
    args = [
        *("--mesh", f"{cfg['mesh']}={n}", "--steps", str(cfg["steps"]), "--batch", str(cfg["batch"])),
        *("--seq-len", str(cfg["seq_len"]), "--d-model", str(cfg["d_model"]), "--layers", str(cfg["layers"])),
        *("--heads", str(cfg["heads"]), "--policy", cfg["policy"], "--seed", str(seed)),
        *(["--fp8-gather"] if cfg["fp8_gather"] else []),
    ]
    one_out = os.path.join(out_dir, "multihost_one_process.json")
    log(f"multihost: one process over {n} devices ...")
    one = launch([[*args, "--out", one_out]], [child_env(platform, ids, n)], cfg["timeout_s"])[0]
    port = free_port()
    many_out = os.path.join(out_dir, "multihost_process0.json")
    argvs, envs = [], []
    for i in range(n):
        dist = ["--num-processes", str(n), "--process-id", str(i), "--coordinator", f"localhost:{port}"]
        argvs.append([*args, *dist, *(["--out", many_out] if i == 0 else [])])
        envs.append(child_env(platform, [ids[i]], 1))
    log(f"multihost: {n} processes of one device each (jax.distributed, coordinator localhost:{port}) ...")
    many = launch(argvs, envs, cfg["timeout_s"])
    rec = {
        "config": {**cfg, "seed": seed, "processes": n, "devices_per_process": 1, "platform": platform},
        "command": f"python examples/train_multihost.py {' '.join(args)} --num-processes {n} --process-id I "
        f"--coordinator localhost:PORT (I = 0..{n - 1}, each with one device)",
        "one_process": one,
        "processes": many,
    }
    ok_runs = one["rc"] == 0 and all(p["rc"] == 0 for p in many)
    if not ok_runs:
        rec.update(checks={"processes_exit_0": False}, passed=False)
        return rec
    with open(one_out) as f:
        ref = json.load(f)
    with open(many_out) as f:
        got = json.load(f)
    rel = np.abs(np.subtract(got["losses"], ref["losses"])) / np.abs(ref["losses"])
    # steps 1 and 2 run on the initial weights: make_optimizer's warm-up gives step 1 learning rate 0
    rec.update(
        losses_one_process=ref["losses"],
        losses_processes=got["losses"],
        processes_seen=got["processes"],
        all_gather_bytes={"one_process": ref["all_gather_bytes"], "processes": got["all_gather_bytes"]},
        initial_weights_rel_diff=float(rel[:2].max()),
        max_rel_diff=float(rel.max()),
    )
    rec["checks"] = {
        "processes_exit_0": True,
        "ran_as_n_processes": got["processes"] == n and ref["processes"] == 1,
        "finite": bool(np.all(np.isfinite(got["losses"]))),
        "initial_weights": rec["initial_weights_rel_diff"] <= FORWARD_RTOL,
        "trajectory": rec["max_rel_diff"] <= TRAJECTORY_RTOL,
        "same_all_gather_bytes": ref["all_gather_bytes"] == got["all_gather_bytes"],
    }
    rec["passed"] = all(rec["checks"].values())
    log(
        f"multihost: {n} processes vs one: losses rel diff {rec['max_rel_diff']:.1e} "
        f"(initial weights {rec['initial_weights_rel_diff']:.1e}), final {got['losses'][-1]:.5f}"
    )
    return rec
