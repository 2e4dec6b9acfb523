"""What benchmarks/attention.py (forward) and benchmarks/attention_bwd.py (forward+backward) share: the
issue's shapes and JAX's cuDNN FP8 attention baseline (per-tensor scales of 1).

  shape(b, t, n, h, causal, group, lens_range=None) -> dict (name, b, t, n, h, causal, group, lens_range)
  issue_shapes(quick) -> the issue-17/10 table: quick = four shapes, else all eight
  cudnn_fp8_attention(causal, scale, smoke) -> fp8_attn(q8, k8, v8) -> O, on float8_e4m3fn BTNH inputs
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

FP8_PARAM_KEYS = (
    "amax_dQ amax_dK amax_dV amax_dP descale_q descale_k descale_v descale_s scale_s scale_o descale_o "
    "descale_dO descale_dP scale_dQ scale_dK scale_dV scale_dP"
).split()
FP8_NO_LENGTHS = "cuDNN FP8 attention takes no sequence lengths (q_seqlen/kv_seqlen)"


def shape(b, t, n, h, causal, group, lens_range=None) -> dict:
    tag = f"{t // 1024}k" if t >= 1024 else str(t)
    name = f"B{b} T{tag} N{n} H{h}{' causal' if causal else ''}"
    if lens_range:
        name = f"jagged {b}x U[{lens_range[0]},{lens_range[1]}] pad T{tag} N{n} H{h}"
    return dict(name=name, b=b, t=t, n=n, h=h, causal=causal, group=group, lens_range=lens_range)


def issue_shapes(quick: bool) -> list[dict]:
    """N16 H128 non-causal and causal (B, T) in {(4, 4k), (2, 8k), (1, 16k)}, H64 B4 T8k, jagged 64 x U[512, 16k]
    N4 H128; quick: the first of each group."""
    if quick:
        return [
            shape(4, 4096, 16, 128, False, "noncausal"),
            shape(2, 8192, 16, 128, True, "causal"),
            shape(4, 8192, 16, 64, False, "h64"),
            shape(64, 16384, 4, 128, False, "jagged", lens_range=(512, 16384)),
        ]
    return [
        *(shape(b, t, 16, 128, False, "noncausal") for b, t in ((4, 4096), (2, 8192), (1, 16384))),
        *(shape(b, t, 16, 128, True, "causal") for b, t in ((4, 4096), (2, 8192), (1, 16384))),
        shape(4, 8192, 16, 64, False, "h64"),
        shape(64, 16384, 4, 128, False, "jagged", lens_range=(512, 16384)),
    ]


def cudnn_fp8_attention(causal: bool, scale: float, smoke: bool):
    """JAX's cuDNN FP8 attention (per-tensor scales 1) on float8_e4m3fn q8, k8, v8 (B, T, N, H); smoke: a CPU
    stand-in, jax.nn's XLA attention on the fp8-rounded inputs (numbers mean nothing)."""
    if smoke:

        def fp8_attn(q8, k8, v8):
            q, k, v = (x.astype(jnp.bfloat16) for x in (q8, k8, v8))
            return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")

        return fp8_attn
    from jax._src.cudnn import fused_attention_stablehlo as fa  # no public API for FP8 attention yet

    mask_type = fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK
    params = {key: jnp.ones((1, 1, 1, 1), jnp.float32) for key in FP8_PARAM_KEYS}

    def fp8_attn(q8, k8, v8):
        return fa.dot_product_attention(q8, k8, v8, fp8_params=params, scale=scale, mask_type=mask_type, use_fp8=True)[
            0
        ]

    return fp8_attn
