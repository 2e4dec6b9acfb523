#!/usr/bin/env bash
# coordinator's device run 12a (session 3, final tree): GPU tests of what changed, attention bwd benchmarks, train step
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/logs
git log --oneline -1 2>/dev/null > $OUT/logs/commit.txt || true
t0=$SECONDS
timeout 190 python3 -m pytest -q -m gpu -rf -p no:cacheprovider --durations=15 \
  tests/test_attention_bwd_kernel_gpu.py tests/test_attention_bwd_kernel_path_gpu.py \
  tests/test_attention_kernel_gpu.py tests/test_varlen_kernel_gpu.py tests/test_attention_implementations.py \
  tests/test_attention_gpu.py tests/test_mx_dot_kernel_path.py tests/test_gemm_reference_bf16.py \
  tests/test_attention_large_logits.py tests/test_ux_gpu.py tests/test_cuda_graph_gpu.py $EXTRA_TESTS \
  > $OUT/logs/gpu_tests.txt 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/logs/gpu_tests.txt | tail -25
t1=$SECONDS
timeout 50 python3 benchmarks/attention_bwd_kernel.py --out $OUT/h200_attention_bwd_kernel.json > $OUT/logs/attention_bwd_kernel.log 2>&1
echo "bwd kernel rc=$? in $((SECONDS-t1)) s"; grep "^|" $OUT/logs/attention_bwd_kernel.log | head -20
t2=$SECONDS
timeout 125 python3 benchmarks/attention.py --backward --quick --dq-accum fp32,fp16 --budget-s 90 --out $OUT/h200_attention_bwd.json > $OUT/logs/attention_bwd.log 2>&1
echo "attention bwd rc=$? in $((SECONDS-t2)) s"; grep "^|" $OUT/logs/attention_bwd.log | head -30
t3=$SECONDS
timeout 55 python3 benchmarks/train_step.py --out $OUT/h200_train_step.json > $OUT/logs/train_step.log 2>&1
echo "train_step rc=$? in $((SECONDS-t3)) s"; tail -8 $OUT/logs/train_step.log
