#!/bin/bash
# session 9 call 4: production = tune 24's config (dk_ss + p_scaled): the backward GPU tests (kernel file with the
# session 8 production as tune 19, tune 23, and tune 25 = production with the dQ writer warp; the path files),
# kernel alone vs tunes 19 and 25, the fwd+bwd profile
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=19,23,25 timeout 120 python3 -m pytest -q -m gpu -n 6 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_bwd_kernel.log 2>&1
echo "tests kernel rc=$?"; grep -E "passed|failed|FAILED|assert" $OUT/tests_bwd_kernel.log | head -12
timeout 100 python3 benchmarks/attention_bwd_kernel.py --out $OUT/h200_attention_bwd_kernel.json --tunes 0,25,19 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel.log | tail -10
timeout 200 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_attention_bwd_kernel_path_gpu.py \
  tests/test_attention_implementations.py tests/test_attention_kernel_gpu.py tests/test_attention_large_logits.py \
  tests/test_attention_mx_grads.py tests/test_broadcast_query_attention.py tests/test_float32_range.py \
  tests/test_ux_gpu.py tests/test_varlen_kernel_gpu.py tests/test_attention_bwd_dq_modes_gpu.py > $OUT/tests_gpu_path.log 2>&1
echo "tests path rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_gpu_path.log | head -12
timeout 80 python3 benchmarks/profile_attention_step.py --out $OUT/h200_profile_attention_step.json 2>&1 | tee $OUT/profile_attention_step.log | grep -E "^B|ours:|cudnn_bf16:|realign|quantize" | head -16
