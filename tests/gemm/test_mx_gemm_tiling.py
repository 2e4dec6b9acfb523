"""The MX GEMM's choice of production tiling (registry.mx_gemm_tile_n, primitives/mx_gemm.py tile_n_for).

CPU only: the estimate (waves of cluster tiles over the 66 cluster pairs of the 132-CTA grid, times the padded
area of one cluster tile) against numbers worked out by hand below, the tie rule, the forcing keyword and
environment variable, and the errors. The kernels of both tilings run against the float64 formula (and against
each other, bit for bit) in tests/gemm/test_mx_gemm_kernel.py (GPU).
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import mx_gemm as mg

CLUSTERS = 132 // 2  # cluster pairs of the persistent grid
ROWS = 2 * 128  # rows of one cluster tile (two CTAs of 128 rows)

# (g, m, n, waves at 192, waves at 128, the expected tile_n), waves worked out by hand:
#   items(t) = g * ceil(m / 256) * ceil(n / t), waves = ceil(items / 66), estimate = waves * t (x 256 rows)
HAND_CASES = [
    # the LM preset (16 x 2048 tokens, d 1024): N = 1024: 128 x 6 = 768 items -> 12 waves x 192 = 2304;
    # 128 x 8 = 1024 -> 16 waves x 128 = 2048: 128
    (1, 32768, 1024, 12, 16, 128),
    # N = 1536 (QKV, 8 + 2 x 2 heads of 128): 128 x 8 = 1024 -> 16 x 192 = 3072; 128 x 12 = 1536 -> 24 x 128
    # = 3072: a tie, 192
    (1, 32768, 1536, 16, 24, 192),
    # N = 4096 (MLP up): 128 x 22 = 2816 -> 43 x 192 = 8256; 128 x 32 = 4096 -> 63 x 128 = 8064: 128
    (1, 32768, 4096, 43, 63, 128),
    # 8192^3: 32 x 43 = 1376 -> 21 x 192 = 4032; 32 x 64 = 2048 -> 32 x 128 = 4096: 192
    (1, 8192, 8192, 21, 32, 192),
    # LM wgrad of the QKV weight (M = 1536 features, N = 1024): 6 x 6 = 36 -> 1 x 192; 6 x 8 = 48 -> 1 x 128
    (1, 1536, 1024, 1, 1, 128),
    # block step MLP up (16384 tokens, N = 8192): 64 x 43 = 2752 -> 42 x 192 = 8064; 64 x 64 = 4096 -> 63 x
    # 128 = 8064: a tie, 192
    (1, 16384, 8192, 42, 63, 192),
    # batch: g = 3, M = 128 (one half-empty cluster tile), N = 192: 3 x 1 x 1 = 3 -> 1 x 192; 3 x 2 = 6 -> 1 x 128
    (3, 128, 192, 1, 1, 128),
    # M = 132 cluster tiles, N = 384 = 2 x 192 = 3 x 128: 132 x 2 = 264 items -> 4 waves x 192 = 768;
    # 132 x 3 = 396 -> 6 x 128 = 768: a tie, 192
    (1, 66 * 2 * 256, 384, 4, 6, 192),
]


@pytest.mark.parametrize("case", HAND_CASES, ids=lambda c: f"g{c[0]}_m{c[1]}_n{c[2]}")
def test_tile_choice_matches_hand_estimate(case):
    g, m, n, waves192, waves128, want = case
    assert (ROWS, CLUSTERS) == (2 * registry.MXGemmConfig(**registry.PRODUCTION_TILINGS[192]).tile_m, 66)
    # the hand waves are consistent with the hand rule the docstring states (recomputed here independently)
    assert waves192 == -(-(g * -(-m // ROWS) * -(-n // 192)) // CLUSTERS)
    assert waves128 == -(-(g * -(-m // ROWS) * -(-n // 128)) // CLUSTERS)
    assert registry.mx_gemm_tile_n(m, n, g) == want
    assert mg.tile_n_for(m=m, n=n, g=g) == want


def test_production_tilings_share_features():
    """192 first (ties go to it: the N = 1536 and 16384 x 8192 cases above), both with the cluster pair, the
    unrolled ring and uniform descriptors, each within shared memory."""
    assert registry.PRODUCTION_TILE_NS == (192, 128)
    for t in registry.PRODUCTION_TILE_NS:
        c = registry.MXGemmConfig(**registry.PRODUCTION_TILINGS[t])
        assert (c.tile_n, c.cluster_m, c.unroll_stages, c.uniform_desc) == (t, 2, True, True)
        assert c.smem_bytes <= 227 * 1024
    assert registry.MXGemmConfig(**registry.PRODUCTION_TILINGS[128]).stages == 6


def test_forcing_keyword_and_environment(monkeypatch):
    monkeypatch.delenv(mg.TILE_N_ENV, raising=False)
    assert mg.tile_n_for(m=32768, n=1024) == 128
    assert mg.tile_n_for(m=32768, n=1024, tile_n=192) == 192
    monkeypatch.setenv(mg.TILE_N_ENV, "192")
    assert mg.tile_n_for(m=32768, n=1024) == 192
    assert mg.tile_n_for(m=32768, n=1024, tile_n=128) == 128  # the keyword wins
    monkeypatch.setenv(mg.TILE_N_ENV, "256")
    with pytest.raises(ValueError, match=mg.TILE_N_ENV):
        mg.tile_n_for(m=32768, n=1024)
    monkeypatch.setenv(mg.TILE_N_ENV, "wide")  # not an integer: the same ValueError, naming the variable
    with pytest.raises(ValueError, match=f"{mg.TILE_N_ENV}='wide'"):
        mg.tile_n_for(m=32768, n=1024)
    monkeypatch.setenv(mg.TILE_N_ENV, "")
    assert mg.tile_n_for(m=8192, n=8192) == 192


def test_mx_gemm_tile_n_errors():
    for bad in [dict(m=0, n=1024), dict(m=128, n=-16), dict(m=128, n=128, g=0), dict(m=1.5, n=128)]:
        with pytest.raises(ValueError, match="mx_gemm_tile_n"):
            registry.mx_gemm_tile_n(**bad)


def test_mx_gemm_tile_n_keyword_errors():
    a = jnp.zeros((1, 32, 128), jnp.float8_e4m3fn)
    s = jnp.ones((1, 1, 32), jnp.float32)
    with pytest.raises(ValueError, match="tile_n=256"):
        mg.mx_gemm(a, a, s, s, out_dtype="bfloat16", path="emulated", tile_n=256)
    with pytest.raises(ValueError, match="comparison schedule"):
        mg.mx_gemm(a, a, s, s, out_dtype="bfloat16", path="emulated", tune=1, tile_n=128)
