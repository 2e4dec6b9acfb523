#!/bin/bash
# session 10 call 1: tunes 26 (H128) / 27 (H64) = production + dv_f16 (dV on float16 wgmma): the kernel GPU tests
# (dk, dv bit-equal to tune 0's, dv scaled back by 2^shift), kernel alone in two orders
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=26,27 timeout 150 python3 -m pytest -q -m gpu -n 6 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_t26.log 2>&1
echo "tests kernel rc=$?"; grep -E "passed|failed|FAILED|assert|SQNR.*tune': 2[67]" $OUT/tests_t26.log | head -20
timeout 90 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t26a.json --tunes 0,26,27 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t26a.log | tail -8
timeout 90 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t26b.json --tunes 27,26,0 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t26b.log | tail -8
