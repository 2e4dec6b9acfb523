#!/bin/bash
# session 9 call 6: production at H128 = tune 25's config (the dQ writer warp), H64 = tune 24's: the backward
# GPU tests (kernel file with tunes 19, 24; the path files). (Benchmarks left out: device time.)
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=19,24 timeout 75 python3 -m pytest -q -m gpu -n 6 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_bwd_kernel.log 2>&1
echo "tests kernel rc=$?"; grep -E "passed|failed|FAILED|assert" $OUT/tests_bwd_kernel.log | head -12
timeout 170 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_attention_bwd_kernel_path_gpu.py \
  tests/test_attention_implementations.py tests/test_attention_kernel_gpu.py tests/test_attention_large_logits.py \
  tests/test_attention_mx_grads.py tests/test_broadcast_query_attention.py tests/test_float32_range.py \
  tests/test_ux_gpu.py tests/test_varlen_kernel_gpu.py tests/test_attention_bwd_dq_modes_gpu.py > $OUT/tests_gpu_path.log 2>&1
echo "tests path rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_gpu_path.log | head -12
