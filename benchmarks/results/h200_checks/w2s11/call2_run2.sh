#!/bin/bash
# session 11 call 2: p_scale="block" in the backward kernel (registry BLOCK_P): its GPU tests, the kernel-path
# gradient test, the kernel file at tunes 0 and 23 (production unchanged; tune 23 = BLOCK_P's schedule), the
# kernel alone (production, tune 23, pblock), then the LM step kernel by kernel on the current code
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=23 timeout 200 python3 -m pytest -q -s -m gpu -n 6 -p no:cacheprovider tests/test_attention_bwd_pblock.py \
  tests/test_attention_bwd_kernel_gpu.py "tests/test_attention_kernel_gpu.py::test_gradients_through_kernel_forward" \
  > $OUT/tests_pblock.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/tests_pblock.log | head -12
grep -E "non-sink|SQNR \(vs ref" $OUT/tests_pblock.log | head -8
timeout 150 python3 benchmarks/attention_bwd_kernel.py --tunes 0,23 --modes pblock --out $OUT/bwd_kernel_pblock.json \
  > $OUT/bwd_kernel_pblock.log 2>&1
echo "bench rc=$?"; cat $OUT/bwd_kernel_pblock.log | tail -12
timeout 200 python3 benchmarks/profile_lm_step.py --out $OUT/h200_profile_lm_step.json > $OUT/profile_lm_step.log 2>&1
echo "profile rc=$?"; tail -14 $OUT/profile_lm_step.log
