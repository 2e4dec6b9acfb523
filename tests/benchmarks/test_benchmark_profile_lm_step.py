"""benchmarks/profile_lm_step.py: the kernel categories it reports (benchmarks/gpu_trace.py) on real kernel
names (from our ncu logs and XLA's GPU naming), and a CPU smoke run that writes the JSON (a CPU trace has no
GPU planes: zero kernel time)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("profile_lm_step", ROOT / "benchmarks" / "profile_lm_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name, want",
    [
        # benchmarks/results/ncu/attention_fwd_b4t4k.txt
        ("kernel_cutlass_kernel_jax_mxfp8kernelssm90attention_fwdAttentionForwardSm90_object_at__TiledMMA_0",
         "ours:attention_fwd"),
        ("kernel_cutlass_kernel_jax_mxfp8kernelssm90mx_gemmMXGemmSm90_object_at_0", "ours:mx_gemm"),
        ("kernel_cutlass_kernel_jax_mxfp8kernelscommongemm_operandsGemmOperands_0", "ours:gemm_operands"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "cublas"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "cublas"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "cudnn"),
        ("loop_multiply_fusion_3", "xla"),
        ("input_reduce_fusion_12", "xla"),
        ("Memcpy DtoD (Device -> Device)", "memcpy"),
        ("some_custom_thing", "other"),
    ],
)  # fmt: skip
def test_kernel_categories(bench, name, want):
    import gpu_trace  # on sys.path through the bench fixture; the profile scripts share its categories

    assert gpu_trace.category(name) == want


def test_cpu_smoke_writes_the_json(bench, tmp_path):
    out = tmp_path / "p.json"
    argv = ["--smoke", "--configs", "bf16:float32", "--calls", "1", "--batches", "1", "--trace-steps", "1"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert (r["policy"], r["dtype"], r["d_model"], r["layers"]) == ("bf16", "float32", 64, 1)
    assert r["step_ms"] > 0 and r["tokens_per_s"] > 0 and r["gpu_ms"] == 0.0  # no GPU planes on a CPU
    with pytest.raises(ValueError, match="--configs"):
        bench.main(["--smoke", "--configs", "fp8:float32", "--out", str(out)])
