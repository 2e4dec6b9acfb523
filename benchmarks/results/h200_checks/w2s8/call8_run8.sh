#!/bin/bash
# session 8 call 8: the final tree's GPU tests on the backward path (the registry refactor and test cleanup after call 7)
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=17 timeout 170 python3 -m pytest -q -m gpu -n 6 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py \
  tests/test_attention_bwd_kernel_path_gpu.py tests/test_attention_bwd_dq_modes_gpu.py tests/test_broadcast_query_attention.py \
  tests/test_varlen_kernel_gpu.py tests/test_attention_mx_grads.py > $OUT/tests_final2.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_final2.log | tail -5; grep -c "vs_tune0" $OUT/tests_final2.log
