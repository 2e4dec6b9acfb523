#!/bin/bash
# session 11 call 6: the final library (packed + pblock variants): the backward-path GPU files once more
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=0 timeout 170 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_attention_bwd_pblock.py \
  tests/test_attention_bwd_kernel_gpu.py tests/test_attention_bwd_kernel_path_gpu.py tests/test_varlen_packed_bwd.py \
  "tests/test_attention_kernel_gpu.py::test_gradients_through_kernel_forward" tests/test_broadcast_query_attention.py \
  > $OUT/tests_final.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_final.log | head -8
