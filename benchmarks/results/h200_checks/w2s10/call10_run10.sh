#!/bin/bash
# session 10 call 10: the final tree after the review mend (same cubins): the backward kernel test file and the
# backward-path GPU files that reach the pre-pass
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=24,25,26 timeout 100 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py \
  tests/test_attention_bwd_kernel_path_gpu.py tests/test_attention_mx_grads.py tests/test_varlen_kernel_gpu.py > $OUT/tests_final.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_final.log | head -8
