#!/bin/bash
# session 8 call 4: the pre-pass through realign + dequantize (path "cuda"): GPU tests of every file on the
# backward kernel path, the fwd+bwd benchmark, the fwd+bwd profile
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_attention_bwd_kernel_path_gpu.py \
  tests/test_attention_implementations.py tests/test_attention_kernel_gpu.py tests/test_attention_large_logits.py \
  tests/test_attention_mx_grads.py tests/test_broadcast_query_attention.py tests/test_float32_range.py \
  tests/test_ux_gpu.py tests/test_varlen_kernel_gpu.py tests/test_attention_realign_gpu.py > $OUT/tests_gpu_path.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/tests_gpu_path.log | head -20
timeout 90 python3 benchmarks/profile_attention_step.py --out $OUT/h200_profile_attention_step.json 2>&1 | tee $OUT/profile_attention_step.log | grep -E "^B|ours:|cudnn_bf16:|xla|realign|dequant" | head -30
timeout 235 python3 benchmarks/attention.py --backward --quick --budget-s 170 --out $OUT/h200_attention_bwd.json 2>&1 | tee $OUT/attention_bwd_quick.log | tail -30
