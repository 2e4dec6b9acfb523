#!/bin/bash
# session 8 call 7: the final tree's GPU tests on the backward path; dQ modes timed against tune 17
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=17 timeout 200 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py \
  tests/test_attention_bwd_kernel_path_gpu.py tests/test_attention_bwd_dq_modes_gpu.py tests/test_broadcast_query_attention.py \
  tests/test_varlen_kernel_gpu.py tests/test_attention_mx_grads.py > $OUT/tests_final.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_final.log | head -12
timeout 100 python3 benchmarks/attention_bwd_kernel.py --out $OUT/h200_attention_bwd_kernel_modes.json --tunes 0,17 --shapes 0 --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_modes.log | tail -8
timeout 120 python3 benchmarks/broadcast_attention.py --shapes 1 --kernel-bwd --calls 3 --batches 1 --out $OUT/bcast_check.json 2>&1 | tail -4
