"""Blackwell attention backward variants (sm_100f): the backward kernel (kernels/sm100/attention_bwd.py) and
its dO / Delta pre-pass (kernels/sm100/attention_bwd_prepass.py). Pure Python (no DSL).

The configs and their variant lists are defined next to the kernels' other compile-time facts
(kernels/sm100/attention_bwd_config.py: warp roles, shared memory, the TMEM map) and registered here:

  AttentionBwdSm100Config (op "attention_bwd_sm100")       ATTENTION_BWD_SM100_VARIANTS: per head_dim (64,
      128) x causal the production variants (p_scale const / block, dQ float32 / float16, deterministic,
      packed, MX dK / dV) and one comparison schedule (H128, a 3-deep Q / dO ring, tune 1)
  AttentionBwdPrepassConfig (op "attention_bwd_prepass_sm100")   ATTENTION_BWD_PREPASS_VARIANTS: head_dim x
      dO / O dtype (bfloat16, float32) x dense / packed

FFI handlers: csrc/attention_bwd_sm100.cc; primitives: primitives/attention_bwd_sm100.py; operands:
docs/interfaces.md "sm100 attention". NOT RUN ON HARDWARE: compiled for sm_100f and checked statically
(tools/check_sm100_attention_bwd.py).
"""

from __future__ import annotations

from jax_mxfp8.kernels.sm100.attention_bwd_config import (
    ATTENTION_BWD_PREPASS_VARIANTS,
    ATTENTION_BWD_SM100_VARIANTS,
    DKV_OUTPUTS,
    AttentionBwdPrepassConfig,
    AttentionBwdSm100Config,
)

__all__ = [
    "ATTENTION_BWD_PREPASS_VARIANTS",
    "ATTENTION_BWD_SM100_VARIANTS",
    "DKV_OUTPUTS",
    "AttentionBwdPrepassConfig",
    "AttentionBwdSm100Config",
]
