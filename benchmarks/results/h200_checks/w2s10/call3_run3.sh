#!/bin/bash
# session 10 call 3: the float16 dequantize kernels (dO for dV without XLA's float32 pass): the dequantize GPU
# tests, the ten backward-path files on the final pre-pass, the fwd+bwd profile, the TransformerBlock train step
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_quantize_kernels_gpu.py tests/test_float32_range.py > $OUT/tests_dequant.log 2>&1
echo "tests dequant rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_dequant.log | head -8
timeout 200 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_attention_bwd_kernel_path_gpu.py \
  tests/test_attention_implementations.py tests/test_attention_kernel_gpu.py tests/test_attention_large_logits.py \
  tests/test_attention_mx_grads.py tests/test_broadcast_query_attention.py tests/test_float32_range.py \
  tests/test_ux_gpu.py tests/test_varlen_kernel_gpu.py tests/test_attention_bwd_dq_modes_gpu.py > $OUT/tests_gpu_path.log 2>&1
echo "tests path rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_gpu_path.log | head -12
timeout 90 python3 benchmarks/profile_attention_step.py --out $OUT/h200_profile_attention_step.json 2>&1 | tee $OUT/profile_attention_step.log | grep -E "^B|ours:|cudnn_bf16:|realign|quantize|pre-pass" | head -20
timeout 150 python3 benchmarks/train_step.py --out $OUT/h200_train_step.json 2>&1 | tee $OUT/train_step.log | tail -12
