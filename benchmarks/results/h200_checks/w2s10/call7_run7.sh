#!/bin/bash
# session 10 call 7: tunes 28 (H128) / 29 (H64) = production + factors_ahead (the query-block factors loaded a step
# early: call 6's ncu put ~5% of the stall samples at their first uses): GPU tests, kernel alone in two orders
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=28,29 timeout 150 python3 -m pytest -q -m gpu -n 6 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_t28.log 2>&1
echo "tests kernel rc=$?"; grep -E "passed|failed|FAILED|assert" $OUT/tests_t28.log | head -12
timeout 90 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t28a.json --tunes 0,28,29 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t28a.log | tail -8
timeout 90 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t28b.json --tunes 29,28,0 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t28b.log | tail -8
