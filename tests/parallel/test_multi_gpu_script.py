"""benchmarks/multi_gpu.py --smoke runs on 2 of 8 CPU host devices and writes the JSON the GPU run will write.

The script is meant for one device call on 2 GPUs; this runs all three of its parts at tiny sizes in a
subprocess (it needs its own XLA_FLAGS), about 40 s on the 2-core CI machine, most of it XLA compiling the
five training steps (--xla_backend_optimization_level=0 halves that; numerics are not at stake here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
    assert r["passed"] is True and r["checks"] == {"train": True, "ring": True, "fsdp_gather": True}
    meta = r["meta"]
    assert meta["device_count"] == 8 and meta["devices_used"] == 2 and meta["platform"] == "cpu"
    assert meta["env"]["NCCL_NVLS_ENABLE"] == "0"  # defaulted by the script, never unset
    for key in ("device_kind", "jax", "python", "kernels", "args", "sizes"):
        assert key in meta, key

    train = r["train"]
    steps = train["config"]["steps"]
    assert set(train["meshes"]) == {"single", "data=2", "fsdp=2 fp8-gather", "fsdp=2", "tp=2"}
    for name, m in train["meshes"].items():
        assert m["passed"] and all(m["checks"].values()), (name, m["checks"])
        assert len(m["losses"]) == steps and m["steps_on_initial_weights"] == 2, name
        for key in ("grad_sqnr_db", "max_rel_diff", "initial_weights_max_rel_diff", "all_gather_bytes", "collectives"):
            assert key in m, (name, key)
    # The FP8 gather moves fewer bytes than the FP32 one; data parallelism gathers no weights.
    assert 0 < train["meshes"]["fsdp=2 fp8-gather"]["all_gather_bytes"] < train["meshes"]["fsdp=2"]["all_gather_bytes"]
    assert train["meshes"]["data=2"]["all_gather_bytes"] == 0
    assert any(k.startswith("all-reduce") for k in train["meshes"]["data=2"]["collectives"])

    ring = r["ring"]
    assert [c["causal"] for c in ring["cases"]] == [False, True]
    for c in ring["cases"]:
        assert c["passed"], c
        for key in ("o_ring_vs_single", "lse_ring_vs_single", "o_ring_vs_exact", "o_single_vs_exact"):
            assert key in c["sqnr_db"], key
        assert c["times"]["ring"]["ms"] > 0 and c["times"]["single"]["ms"] > 0

    bench = r["fsdp_gather"]
    assert bench["passed"] and all(bench["checks"].values())
    fp8, f32 = bench["variants"]["fp8_gather"], bench["variants"]["f32_gather"]
    assert fp8["all_gather_bytes"] < f32["all_gather_bytes"]
    assert fp8["step_time_ms"]["median"] > 0 and f32["step_time_ms"]["median"] > 0
    assert any("u8" in k or "u32" in k for k in fp8["collectives"])  # the FP8 bytes travel as integers
