"""The kernels that build the quantize-family configs on Blackwell (sm_100f: one cubin for compute capability
10.0 and 10.3), named by the registry's `kernels`.

These are the arch-neutral kernels of kernels/common/ (the same classes as on sm_90a; the RMSNorm kernel also
builds the blocked-scale variants, RMSNormQuantizeBlockedConfig); Blackwell-specific code goes in this
package and replaces the name here where it differs. The Hopper GEMM's operand producer is not built for
Blackwell: its blocked-scale subclass is (kernels/sm100/blocked_operands.py). sm_100f cubins are compiled
and checked by the build, not run on this project's machines.
"""

from jax_mxfp8.kernels.common.quantize import MXDequantize as dequantize_kernel
from jax_mxfp8.kernels.common.quantize import MXQuantize as quantize_kernel
from jax_mxfp8.kernels.common.rms_norm_quantize import RMSNormQuantize as rms_norm_quantize_kernel

__all__ = ["dequantize_kernel", "quantize_kernel", "rms_norm_quantize_kernel"]
