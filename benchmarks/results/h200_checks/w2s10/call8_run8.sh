#!/bin/bash
# session 10 call 8: the final production (H128: + factors_ahead, tune 28's config; H64: tune 27's): the kernel
# test file with tunes 24, 25, 26 (same products: dk, dv bit-equal), the ten backward-path GPU files, the issue's
# full fwd+bwd run, the train step, the fwd+bwd profile
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=24,25,26 timeout 120 python3 -m pytest -q -m gpu -n 8 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_bwd_kernel.log 2>&1
echo "tests kernel rc=$?"; grep -E "passed|failed|FAILED|assert" $OUT/tests_bwd_kernel.log | head -12
timeout 170 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_attention_bwd_kernel_path_gpu.py \
  tests/test_attention_implementations.py tests/test_attention_kernel_gpu.py tests/test_attention_large_logits.py \
  tests/test_attention_mx_grads.py tests/test_broadcast_query_attention.py tests/test_float32_range.py \
  tests/test_ux_gpu.py tests/test_varlen_kernel_gpu.py tests/test_attention_bwd_dq_modes_gpu.py > $OUT/tests_gpu_path.log 2>&1
echo "tests path rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_gpu_path.log | head -12
timeout 150 python3 benchmarks/attention.py --backward --budget-s 120 --dq-accum fp32,fp16 --out $OUT/h200_attention_bwd.json 2>&1 | tee $OUT/attention_bwd_full.log | tail -14
timeout 60 python3 benchmarks/train_step.py --out $OUT/h200_train_step.json 2>&1 | tee $OUT/train_step.log | tail -6
timeout 60 python3 benchmarks/attention_bwd_kernel.py --out $OUT/h200_attention_bwd_kernel.json --tunes 0,26,25,24 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel.log | tail -14
