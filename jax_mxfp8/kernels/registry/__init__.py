"""The ahead-of-time kernel variants: one frozen config per compiled kernel.

Pure Python (no CuTe DSL import), so the primitives layer, the build tool and the tests all read the
same list. `tools/build_kernels.py` compiles every variant in `PRODUCTION_VARIANTS` (with `--with-tunes`,
every one in `VARIANTS`: the comparison schedules too) for every arch in its config's `archs`, with the
kernel class its config names for that arch (`KernelConfig.kernels`), and writes one table row per
(variant, arch): name, arch, op and the named integer parameters `config.key`. The FFI
handlers in csrc/ run the variant whose name the caller passes (FFI attribute `kernel` = `config.name`)
and check the buffers against its parameters, so adding a variant here is the only change needed to ship it.

One module per op family: `quantize` (quantize, dequantize), `rms_norm_quantize`, `gemm_operands` (quantize +
align128 for the Hopper MX GEMM), `gemm` (the Hopper MX GEMM), `gemm_sm100` (the Blackwell MX GEMM),
`blocked_operands` (its operand producer), `attention` (forward and realign), `attention_bwd` (backward),
`attention_bwd_sm100` (the Blackwell backward and its pre-pass),
`attention_fwd_sm100` (the Blackwell attention forward), `attention_operands_sm100` (its operand producer);
`base` holds the config interface and the shared value sets and codes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from jax_mxfp8.kernels.registry.attention import (
    ATTENTION_FWD_VARIANTS,
    ATTENTION_REALIGN_VARIANTS,
    LOG2_E4M3_MAX,
    P_CONST_OFFSET,
    P_OFFSET_MAX,
    AttentionFwdConfig,
    AttentionRealignConfig,
    pv_permutation,
)
from jax_mxfp8.kernels.registry.attention_bwd import ATTENTION_BWD_VARIANTS, AttentionBwdConfig
from jax_mxfp8.kernels.registry.attention_bwd_sm100 import (
    ATTENTION_BWD_PREPASS_VARIANTS,
    ATTENTION_BWD_SM100_VARIANTS,
    AttentionBwdPrepassConfig,
    AttentionBwdSm100Config,
)
from jax_mxfp8.kernels.registry.attention_fwd_sm100 import ATTENTION_FWD_SM100_VARIANTS, AttentionFwdSm100Config
from jax_mxfp8.kernels.registry.attention_operands_sm100 import (
    ATTENTION_OPERANDS_SM100_VARIANTS,
    AttentionOperandsSm100Config,
)
from jax_mxfp8.kernels.registry.base import (
    ARCH_CCS,
    ARCH_MAJOR,
    ARCHS,
    DEQUANTIZE_BLOCKS,
    DEQUANTIZE_OUT_DTYPES,
    DTYPE_CODE,
    ELEM_DTYPES,
    IN_DTYPES,
    MODE_CODE,
    P_SCALE_CODE,
    P_SCALES,
    QUANTIZE_MODES,
    ROUNDING_CODE,
    SCALE_ROUNDINGS,
    UNSUPPORTED_CCS,
    KernelConfig,
    arch_for_cc,
    cc_name,
)
from jax_mxfp8.kernels.registry.blocked_operands import BLOCKED_OPERANDS_VARIANTS, BlockedOperandsConfig
from jax_mxfp8.kernels.registry.gemm import (
    GEMM_ALIGN,
    GEMM_K_TILE,
    GEMM_OUT_DTYPES,
    MX_GEMM_TUNINGS,
    MX_GEMM_VARIANTS,
    PRODUCTION_TILE_NS,
    PRODUCTION_TILINGS,
    MXGemmConfig,
    mx_gemm_tile_n,
)
from jax_mxfp8.kernels.registry.gemm_epilogue import (
    EPILOGUE_ACTIVATIONS,
    MX_EPILOGUE_ELEM,
    MX_GEMM_EPILOGUE_VARIANTS,
    MXGemmEpilogueConfig,
)
from jax_mxfp8.kernels.registry.gemm_operands import GEMM_OPERANDS_TUNINGS, GEMM_OPERANDS_VARIANTS, GemmOperandsConfig
from jax_mxfp8.kernels.registry.gemm_sm100 import MX_GEMM_SM100_VARIANTS, MXGemmSm100Config
from jax_mxfp8.kernels.registry.quantize import (
    DEQUANTIZE_VARIANTS,
    QUANTIZE_VARIANTS,
    TUNING_VARIANTS,
    DequantizeConfig,
    QuantizeConfig,
)
from jax_mxfp8.kernels.registry.rms_norm_quantize import (
    RMS_NORM_QUANTIZE_BLOCKED_VARIANTS,
    RMS_NORM_QUANTIZE_VARIANTS,
    RMSNormQuantizeBlockedConfig,
    RMSNormQuantizeConfig,
)

__all__ = [
    "ARCHS",
    "ARCH_CCS",
    "ARCH_MAJOR",
    "ATTENTION_BWD_PREPASS_VARIANTS",
    "ATTENTION_BWD_SM100_VARIANTS",
    "ATTENTION_BWD_VARIANTS",
    "ATTENTION_FWD_SM100_VARIANTS",
    "ATTENTION_FWD_VARIANTS",
    "ATTENTION_OPERANDS_SM100_VARIANTS",
    "ATTENTION_REALIGN_VARIANTS",
    "BLOCKED_OPERANDS_VARIANTS",
    "CONFIG_CLASSES",
    "DEQUANTIZE_BLOCKS",
    "DEQUANTIZE_OUT_DTYPES",
    "DEQUANTIZE_VARIANTS",
    "DTYPE_CODE",
    "ELEM_DTYPES",
    "EPILOGUE_ACTIVATIONS",
    "GEMM_ALIGN",
    "GEMM_K_TILE",
    "GEMM_OUT_DTYPES",
    "GEMM_OPERANDS_TUNINGS",
    "GEMM_OPERANDS_VARIANTS",
    "IN_DTYPES",
    "LOG2_E4M3_MAX",
    "MODE_CODE",
    "MX_EPILOGUE_ELEM",
    "MX_GEMM_EPILOGUE_VARIANTS",
    "MX_GEMM_TUNINGS",
    "MX_GEMM_SM100_VARIANTS",
    "MX_GEMM_VARIANTS",
    "P_CONST_OFFSET",
    "P_OFFSET_MAX",
    "P_SCALES",
    "P_SCALE_CODE",
    "PRODUCTION_TILE_NS",
    "PRODUCTION_TILINGS",
    "PRODUCTION_VARIANTS",
    "QUANTIZE_MODES",
    "QUANTIZE_VARIANTS",
    "RMS_NORM_QUANTIZE_BLOCKED_VARIANTS",
    "RMS_NORM_QUANTIZE_VARIANTS",
    "ROUNDING_CODE",
    "SCALE_ROUNDINGS",
    "TUNING_VARIANTS",
    "UNSUPPORTED_CCS",
    "VARIANTS",
    "AttentionBwdConfig",
    "AttentionBwdPrepassConfig",
    "AttentionBwdSm100Config",
    "AttentionFwdConfig",
    "AttentionFwdSm100Config",
    "AttentionOperandsSm100Config",
    "AttentionRealignConfig",
    "BlockedOperandsConfig",
    "DequantizeConfig",
    "GemmOperandsConfig",
    "KernelConfig",
    "MXGemmConfig",
    "MXGemmEpilogueConfig",
    "MXGemmSm100Config",
    "QuantizeConfig",
    "RMSNormQuantizeBlockedConfig",
    "RMSNormQuantizeConfig",
    "arch_for_cc",
    "cc_name",
    "find",
    "mx_gemm_tile_n",
    "variants",
    "pv_permutation",
]

VARIANTS: tuple[KernelConfig, ...] = (
    QUANTIZE_VARIANTS
    + TUNING_VARIANTS
    + DEQUANTIZE_VARIANTS
    + RMS_NORM_QUANTIZE_VARIANTS
    + RMS_NORM_QUANTIZE_BLOCKED_VARIANTS
    + GEMM_OPERANDS_VARIANTS
    + GEMM_OPERANDS_TUNINGS
    + BLOCKED_OPERANDS_VARIANTS
    + ATTENTION_FWD_VARIANTS
    + ATTENTION_REALIGN_VARIANTS
    + ATTENTION_BWD_VARIANTS
    + MX_GEMM_VARIANTS
    + MX_GEMM_TUNINGS
    + MX_GEMM_EPILOGUE_VARIANTS
    + MX_GEMM_SM100_VARIANTS
    + ATTENTION_BWD_PREPASS_VARIANTS
    + ATTENTION_BWD_SM100_VARIANTS
    + ATTENTION_FWD_SM100_VARIANTS
    + ATTENTION_OPERANDS_SM100_VARIANTS
)
"""Every registered variant, in table order: production (tune 0, which includes the feature variants) and the
comparison schedules (tune > 0: at most two per kernel family, for the benchmarks)."""

PRODUCTION_VARIANTS: tuple[KernelConfig, ...] = tuple(v for v in VARIANTS if v.tune == 0)
"""What the library and the wheel ship by default (tools/build_library.py without --with-tunes)."""


def variants(with_tunes: bool = False) -> tuple[KernelConfig, ...]:
    """The variants a build compiles: PRODUCTION_VARIANTS, or with_tunes every registered variant."""
    return VARIANTS if with_tunes else PRODUCTION_VARIANTS


CONFIG_CLASSES: tuple[type[KernelConfig], ...] = (
    QuantizeConfig,
    DequantizeConfig,
    RMSNormQuantizeConfig,
    RMSNormQuantizeBlockedConfig,
    GemmOperandsConfig,
    BlockedOperandsConfig,
    AttentionFwdConfig,
    AttentionRealignConfig,
    AttentionBwdConfig,
    MXGemmConfig,
    MXGemmEpilogueConfig,
    MXGemmSm100Config,
    AttentionBwdPrepassConfig,
    AttentionBwdSm100Config,
    AttentionFwdSm100Config,
    AttentionOperandsSm100Config,
)

C = TypeVar("C", bound=KernelConfig)


def find(config_cls: type[C], **fields: Any) -> C | None:
    """The registered variant of `config_cls` with these field values, or None when no kernel covers them.

    Key fields (`config_cls.key_fields`) that are not given take their constructor default, as when building a
    config, and `tune` defaults to 0: the production variant. Other fields (tuning knobs) may be given as well
    and must then match. E.g. `find(AttentionFwdConfig, head_dim=128, causal=True)` is the production dense
    "const" P-scale kernel, `find(QuantizeConfig, tune=1)` the first benchmark tuning of the bf16 row+col kernel.
    """
    known = {f.name for f in dataclasses.fields(config_cls)} | {"tune"}  # type: ignore[arg-type]
    unknown = set(fields) - known
    if unknown:
        raise TypeError(f"{config_cls.__name__} has no fields {sorted(unknown)}")
    want = {**config_cls.key_defaults(), **fields}
    matches = [
        v for v in VARIANTS if type(v) is config_cls and all(getattr(v, name) == value for name, value in want.items())
    ]
    if len(matches) > 1:  # a registry bug: two variants with one key (tests/build/test_kernel_build.py guards it)
        raise LookupError(f"{len(matches)} {config_cls.__name__} variants match {want}: {[v.name for v in matches]}")
    return matches[0] if matches else None
