#!/usr/bin/env bash
# coordinator's device run 1: GEMM-path GPU tests, gemm.py, train_step.py
export XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p $OUT/logs
t0=$SECONDS
timeout 200 python3 -m pytest -q -m gpu -rf -p no:cacheprovider --durations=8 \
  tests/test_mx_dot_kernel_path.py tests/test_gemm_reference_bf16.py tests/test_mx_gemm_kernel.py \
  tests/test_gemm_operands.py $EXTRA_TESTS > $OUT/logs/gpu_tests.txt 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; tail -25 $OUT/logs/gpu_tests.txt
t1=$SECONDS
timeout 230 python3 benchmarks/gemm.py --out $OUT/h200_gemm.json --budget-s 170 --only bf16,xla_fp8,xla_fp8_from_bf16,torch_bf16,torch_fp8,ours,ours_ref > $OUT/logs/gemm.log 2>&1
echo "gemm rc=$? in $((SECONDS-t1)) s"; grep "^|" $OUT/logs/gemm.log | tail -40
t2=$SECONDS
timeout 120 python3 benchmarks/train_step.py --out $OUT/h200_train_step.json > $OUT/logs/train_step.log 2>&1
echo "train_step rc=$? in $((SECONDS-t2)) s"; tail -12 $OUT/logs/train_step.log
