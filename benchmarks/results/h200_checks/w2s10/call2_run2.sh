#!/bin/bash
# session 10 call 2: production = dv_f16 at both head dims: the backward GPU tests (kernel file with tunes 24, 25
# = the session 9 production configs, same math: dk, dv bit-equal; the ten backward-path files), kernel alone vs
# tunes 25 / 24, the fwd+bwd profile (with the dv_f16 pre-pass timed)
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=19,24,25 timeout 150 python3 -m pytest -q -m gpu -n 6 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_bwd_kernel.log 2>&1
echo "tests kernel rc=$?"; grep -E "passed|failed|FAILED|assert" $OUT/tests_bwd_kernel.log | head -12
timeout 200 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_attention_bwd_kernel_path_gpu.py \
  tests/test_attention_implementations.py tests/test_attention_kernel_gpu.py tests/test_attention_large_logits.py \
  tests/test_attention_mx_grads.py tests/test_broadcast_query_attention.py tests/test_float32_range.py \
  tests/test_ux_gpu.py tests/test_varlen_kernel_gpu.py tests/test_attention_bwd_dq_modes_gpu.py > $OUT/tests_gpu_path.log 2>&1
echo "tests path rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_gpu_path.log | head -12
timeout 100 python3 benchmarks/attention_bwd_kernel.py --out $OUT/h200_attention_bwd_kernel.json --tunes 0,25,24 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel.log | tail -10
timeout 90 python3 benchmarks/profile_attention_step.py --out $OUT/h200_profile_attention_step.json 2>&1 | tee $OUT/profile_attention_step.log | grep -E "^B|ours:|cudnn_bf16:|realign|quantize|pre-pass" | head -20
