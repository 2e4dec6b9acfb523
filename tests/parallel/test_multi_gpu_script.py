"""benchmarks/multi_gpu.py --smoke runs on 2 of 8 CPU host devices and writes the JSON the GPU run will write.

The script is meant for one device call on 2 GPUs; this runs all four of its parts at tiny sizes in a
subprocess (it needs its own XLA_FLAGS), most of the time XLA compiling the training steps
(--xla_backend_optimization_level=0 halves that; numerics are not at stake here). On CPU every op runs its
XLA reference (no kernel is emulated), which the JSON records as empty kernel_targets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "multi_gpu.py")


@pytest.mark.slow
def test_multi_gpu_smoke(tmp_path):
    out = tmp_path / "multi_gpu.json"
    env = {
        **{k: v for k, v in os.environ.items() if k != "NCCL_NVLS_ENABLE"},
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "ALL CHECKS PASSED" in proc.stdout and "### Ring attention" in proc.stdout
    r = json.loads(out.read_text())
    assert r["passed"] is True
    assert r["checks"] == {"train": True, "ring": True, "fsdp_gather": True, "multihost": True}
    meta = r["meta"]
    assert meta["device_count"] == 8 and meta["devices_used"] == 2 and meta["platform"] == "cpu"
    assert meta["env"]["NCCL_NVLS_ENABLE"] == "0"  # defaulted by the script, never unset
    for key in ("device_kind", "jax", "python", "kernels", "args", "sizes"):
        assert key in meta, key

    assert meta["sizes"]["train"]["head_dim"] == 64  # a size the attention kernels cover (128 on GPUs)

    train = r["train"]
    steps = train["config"]["steps"]
    assert set(train["meshes"]) == {"single", "data=2", "fsdp=2 fp8-gather", "fsdp=2", "tp=2"}
    for name, m in train["meshes"].items():
        assert m["passed"] and all(m["checks"].values()), (name, m["checks"])
        assert len(m["losses"]) == steps and m["steps_on_initial_weights"] == 2, name
        for key in ("grad_sqnr_db", "max_rel_diff", "initial_weights_max_rel_diff", "all_gather_bytes", "collectives"):
            assert key in m, (name, key)
        assert m["kernel_targets"] == {}, name  # CPU: the XLA reference path
    # The FP8 gather moves fewer bytes than the FP32 one; data parallelism gathers no weights.
    assert 0 < train["meshes"]["fsdp=2 fp8-gather"]["all_gather_bytes"] < train["meshes"]["fsdp=2"]["all_gather_bytes"]
    assert train["meshes"]["data=2"]["all_gather_bytes"] == 0
    assert any(k.startswith("all-reduce") for k in train["meshes"]["data=2"]["collectives"])

    ring = r["ring"]
    assert [c["causal"] for c in ring["cases"]] == [False, True]
    for c in ring["cases"]:
        assert c["passed"], c
        for grad in ("o", "dq", "dk", "dv"):
            for key in ("ring_vs_single", "ring_vs_single_default", "ring_vs_exact", "single_xla_vs_exact"):
                assert np.isfinite(c["sqnr_db"][f"{grad}_{key}"]), (grad, key)
            assert c["checks"][f"{grad}_ring_vs_exact"], grad
        for grad in ("dq", "dk", "dv"):
            assert c["checks"][f"{grad}_ring_vs_single"], grad
        for who in ("ring", "single_xla"):
            assert 0 < c["times"][who]["forward_ms"] and 0 < c["times"][who]["forward_backward_ms"], who
        # CPU: implementation=None compiles to no kernel call, so it is single_xla's program
        assert c["kernel_custom_calls"]["single_default"] == {"forward": {}, "forward_backward": {}}
        assert c["times"]["single_default"] == {"same_program_as": "single_xla"}

    bench = r["fsdp_gather"]
    assert bench["passed"] and all(bench["checks"].values())
    fp8, f32 = bench["variants"]["fp8_gather"], bench["variants"]["f32_gather"]
    assert fp8["all_gather_bytes"] < f32["all_gather_bytes"]
    assert fp8["step_time_ms"]["median"] > 0 and f32["step_time_ms"]["median"] > 0
    assert any("u8" in k or "u32" in k for k in fp8["collectives"])  # the FP8 bytes travel as integers
    # the backward gathers MXFP8 too: the step's 8-bit gather bytes are twice the forward's alone
    assert bench["checks"]["backward_gathers_fp8"]
    step_int = sum(b for d, b in fp8["all_gather_bytes_by_dtype"].items() if d in ("u8", "u32"))
    fwd_int = sum(b for d, b in fp8["forward_only"]["all_gather_bytes_by_dtype"].items() if d in ("u8", "u32"))
    assert step_int == 2 * fwd_int > 0

    mh = r["multihost"]
    assert mh["passed"] and all(mh["checks"].values()), mh.get("checks")
    assert mh["processes_seen"] == 2 and [p["rc"] for p in mh["processes"]] == [0, 0]
    assert len(mh["losses_processes"]) == mh["config"]["steps"] == len(mh["losses_one_process"])
    assert "--num-processes 2" in mh["command"]
