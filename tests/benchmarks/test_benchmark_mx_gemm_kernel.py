"""benchmarks/mx_gemm_kernel.py: its shape sets are the models' GEMMs (worked out here from the model sizes), and
--smoke runs every column end to end (on CPU the mx columns run the XLA emulation; the numbers mean nothing)."""

from __future__ import annotations

import json

from tests.benchmarks.benchmark_loader_testutil import load_benchmark


def _bench(monkeypatch):
    return load_benchmark(monkeypatch, "mx_gemm_kernel")


def test_lm_and_block_shape_sets(monkeypatch):
    bench = _bench(monkeypatch)
    t = 32768  # the LM preset: 16 x 2048 tokens, d 1024, QKV 12 heads of 128 = 1536, MLP 4096
    lm = dict(bench.shape_list("lm", smoke=False))
    assert lm == {
        (t, 1024, 1536): ["fwd_qkv"],
        (t, 1536, 1024): ["dgrad_qkv"],
        (1536, t, 1024): ["wgrad_qkv"],
        (t, 1024, 1024): ["fwd_out", "dgrad_out"],
        (1024, t, 1024): ["wgrad_out"],
        (t, 1024, 4096): ["fwd_up", "dgrad_down"],
        (t, 4096, 1024): ["dgrad_up", "fwd_down"],
        (4096, t, 1024): ["wgrad_up"],
        (1024, t, 4096): ["wgrad_down"],
    }
    block = dict(bench.shape_list("block", smoke=False))  # 16384 tokens, d 2048, QKV 6144, MLP 8192
    assert block[(16384, 2048, 6144)] == ["fwd_qkv"] and block[(2048, 16384, 8192)] == ["wgrad_down"]
    assert len(block) == 9 and sum(map(len, block.values())) == 12


def test_smoke_runs_every_column(monkeypatch, tmp_path):
    bench = _bench(monkeypatch)
    out = tmp_path / "k.json"
    assert bench.main(["--smoke", "--calls", "1", "--batches", "1", "--only", "mx_t0,mx_n192,mx_n128,bf16", "--out",
                       str(out)]) == 0  # fmt: skip
    (shape,) = json.loads(out.read_text())["shapes"]
    for name in ("mx_t0", "mx_n192", "mx_n128", "bf16"):
        assert shape[name]["tflops"] >= 0 and "error" not in shape[name], (name, shape[name])
    assert shape["mx_n192"]["tile_n"] == 192 and shape["mx_n128"]["tile_n"] == 128
    assert shape["mx_n128"]["kernel"] == "mx_gemm_e4m3_e4m3_bf16_n128"
    # M 256, N 384: one cluster tile row; 2 tiles of 192 or 3 of 128, one wave each: 128 (area 128 < 192)
    assert shape["mx_t0"]["tile_n"] == 128
