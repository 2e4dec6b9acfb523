"""Blackwell MXFP8 attention forward variants (kernels/sm100/attention_fwd.py), sm_100f only. Pure Python (no DSL).

The config class and its resources live next to the kernel (kernels/sm100/attention_fwd_config.py, itself pure
Python); this module is the registry's view of them: the registered variants, which tools/build_kernels.py
compiles and writes into the kernel table (op "attention_fwd_sm100", key head_dim, causal, p_scale, packed,
broadcast_q, tune), which csrc/attention_fwd_sm100.cc checks buffers against and which
primitives/attention_fwd_sm100.py calls. None has run on a Blackwell GPU: compiled and statically checked
(tools/check_sm100_attention_fwd.py), self-tested on first use (primitives/sm100_self_tests.py).
"""

from __future__ import annotations

from jax_mxfp8.kernels.sm100.attention_fwd_config import ATTENTION_FWD_SM100_VARIANTS, AttentionFwdSm100Config

__all__ = ["ATTENTION_FWD_SM100_VARIANTS", "AttentionFwdSm100Config"]
