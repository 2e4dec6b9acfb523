#!/usr/bin/env bash
# session 5 final, part 1: GPU tests of merged main (production attention bwd = tune 17's config)
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
t0=$SECONDS
JAX_MXFP8_TEST_TUNES=12 timeout 320 python3 -m pytest -v -m gpu -rf -p no:cacheprovider --tb=short --durations=12 \
  tests/test_attention_bwd_kernel_gpu.py tests/test_broadcast_query_attention.py tests/test_mx_gemm_epilogue_col.py \
  tests/test_mx_gemm_epilogue.py tests/test_mx_dot_handoff.py tests/test_mx_dot_quantized.py \
  tests/test_attention_bwd_kernel_path_gpu.py tests/test_attention_mx_grads.py tests/test_attention_bwd_dq_modes_gpu.py \
  tests/test_mx_gemm_kernel.py > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"
grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | grep "::" | sed -E 's/ +\[ *[0-9]+%\]//' | awk '{print $NF}' | sort | uniq -c
grep -E "FAILED|ERROR" $OUT/gpu_tests.log | head -20
tail -4 $OUT/gpu_tests.log
