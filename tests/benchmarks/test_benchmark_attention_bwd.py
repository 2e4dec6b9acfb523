"""benchmarks/attention.py --backward (benchmarks/attention_bwd.py) runs end to end on CPU with --smoke shapes (the
sm100 backward alone, ours_bwd_sm100, included):
ours on the kernel path with the kernel calls emulated, the baselines through jax.nn's XLA attention. The
numbers mean nothing; the test checks that every column is produced, that ours took the backward kernel
path, and that its gradients agree with the BF16 baseline's (a wrong transpose or slice would not)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.benchmark_loader_testutil import load_benchmark


def _bench(monkeypatch):
    return load_benchmark(monkeypatch, "attention")


def _run(monkeypatch, tmp_path, only: str) -> dict:
    out = tmp_path / "bwd.json"
    assert _bench(monkeypatch).main(["--backward", "--smoke", "--only", only, "--batches", "1", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def _check_columns(shape: dict, names: tuple[str, ...]) -> None:
    im = shape["impls"]
    for name in names:
        assert "tflops" in im[name] and im[name]["tflops"] > 0, (name, im[name])
        assert not im[name].get("has_nan"), name
    assert im["ours"]["bwd_path"] == "emulated"  # the backward kernel path (emulated), not the reference
    for d in ("dq", "dk", "dv"):  # MXFP8 vs BF16 gradients: ~20-30 dB on N(0, 1) inputs
        assert im["ours"][f"sqnr_{d}_vs_cudnn_bf16_db"] > 12.0, (d, im["ours"])
    assert shape["flops_fwd_bwd"] == 3.5 * shape["flops_fwd"]


def test_backward_benchmark_smoke(monkeypatch, tmp_path):
    data = _run(monkeypatch, tmp_path, "causal")
    assert data["meta"]["command"] and data["meta"]["mode"] == "smoke"
    (shape,) = data["shapes"]
    _check_columns(shape, ("ours", "cudnn_bf16", "cudnn_fp8", "ours_bwd_kernel", "ours_bwd_sm100"))
    assert "cudnn_bf16" in shape["target"]


@pytest.mark.slow
def test_backward_benchmark_smoke_jagged(monkeypatch, tmp_path):
    (shape,) = _run(monkeypatch, tmp_path, "jagged")["shapes"]
    _check_columns(shape, ("ours", "ours_varlen", "cudnn_bf16", "ours_bwd_kernel", "ours_bwd_sm100"))
    assert "skipped" in shape["impls"]["cudnn_fp8"]
    assert shape["flops_fwd"] == sum(4.0 * 2 * n**2 * 64 for n in shape["lengths"])
