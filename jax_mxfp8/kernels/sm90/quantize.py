"""The kernels that build the quantize-family configs on Hopper (sm_90a), named by the registry's `kernels`.

Quantize, dequantize and RMSNorm + quantize are arch-neutral (plain PTX loads and stores, no wgmma): their
code lives in kernels/common/ and sm_90a and sm_100f build the same classes. A Hopper-specific version
would replace the name here.
"""

from jax_mxfp8.kernels.common.gemm_operands import GemmOperands as gemm_operands_kernel
from jax_mxfp8.kernels.common.quantize import MXDequantize as dequantize_kernel
from jax_mxfp8.kernels.common.quantize import MXQuantize as quantize_kernel
from jax_mxfp8.kernels.common.rms_norm_quantize import RMSNormQuantize as rms_norm_quantize_kernel

__all__ = ["dequantize_kernel", "gemm_operands_kernel", "quantize_kernel", "rms_norm_quantize_kernel"]
