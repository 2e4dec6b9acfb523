"""Blackwell (sm_100 family) CuTe DSL kernels: names for the arch-neutral kernels of kernels/common/
(quantize.py), the blocked-scale operand producer (blocked_operands.py), the block-scaled MX GEMM (mx_gemm.py,
its variants kernels/registry/gemm_sm100.py, building blocks blockscaled_mma.py, warp_roles.py,
epilogue_quantize.py, mx_gemm_epilogue.py, tmem_map.py, perf_model.py) and the attention forward and backward
(attention_*.py, not registered yet). Compiled for sm_100f and checked statically (tools/check_sm100.py and
its attention siblings on tools/sm100_static.py); none has run on a GPU."""
