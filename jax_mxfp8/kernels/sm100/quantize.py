"""The kernels that build the quantize-family configs on Blackwell (sm_100a), named by the registry's `kernels`.

Today these are the arch-neutral kernels of kernels/common/ (the same classes as on sm_90a); Blackwell-specific
code (e.g. TMA / tcgen05-era stores) goes in this package and replaces the name here where it differs.
sm_100a cubins are compiled and inspected by the build, not run on this project's machines.
"""

from jax_mxfp8.kernels.common.gemm_operands import GemmOperands as gemm_operands_kernel
from jax_mxfp8.kernels.common.quantize import MXDequantize as dequantize_kernel
from jax_mxfp8.kernels.common.quantize import MXQuantize as quantize_kernel
from jax_mxfp8.kernels.common.rms_norm_quantize import RMSNormQuantize as rms_norm_quantize_kernel

__all__ = ["dequantize_kernel", "gemm_operands_kernel", "quantize_kernel", "rms_norm_quantize_kernel"]
