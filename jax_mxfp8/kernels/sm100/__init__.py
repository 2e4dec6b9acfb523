"""Blackwell (sm_100 family) CuTe DSL kernels: names for the arch-neutral kernels of kernels/common/
(quantize.py), and the block-scaled MX GEMM (mx_gemm.py, its config mx_gemm_config.py, building blocks
blockscaled_mma.py, warp_roles.py, epilogue_quantize.py, mx_gemm_epilogue.py, tmem_map.py, perf_model.py).
The GEMM is compiled for sm_100f and checked statically (tools/check_sm100.py); it has never run on a GPU."""
