#!/usr/bin/env bash
# device call 3: the GEMM reference with in-place operand quantization (tests, breakdown, gemm.py), train step, LM step profile
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.devdeps JAX_MXFP8_TEST_TUNES=12
t0=$SECONDS
timeout 110 python3 -m pytest -q -m gpu -rf -p no:cacheprovider --tb=short -n 4 \
  tests/test_gemm_reference_bf16.py tests/test_mx_dot_kernel_path.py tests/test_attention_gpu.py > $OUT/gpu_tests_3.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s" | tee -a $OUT/gpu_tests_3.log; grep -E "^(FAILED|ERROR)| passed| failed" $OUT/gpu_tests_3.log | tail -8
t0=$SECONDS
timeout 60 python3 benchmarks/gemm_reference_breakdown.py --out $OUT/h200_gemm_reference_breakdown.json > $OUT/gemm_reference_breakdown.log 2>&1
echo "breakdown rc=$? in $((SECONDS-t0)) s"; tail -5 $OUT/gemm_reference_breakdown.log
t0=$SECONDS
timeout 160 python3 benchmarks/gemm.py --out $OUT/h200_gemm.json --budget-s 140 \
  --only bf16,xla_fp8,xla_fp8_from_bf16,torch_bf16,torch_fp8,ours,ours_ref > $OUT/gemm.log 2>&1
echo "gemm rc=$? in $((SECONDS-t0)) s"; grep -E "ours|target" $OUT/gemm.log | tail -24
t0=$SECONDS
timeout 110 python3 benchmarks/train_step.py --out $OUT/h200_train_step.json > $OUT/train_step.log 2>&1
echo "train_step rc=$? in $((SECONDS-t0)) s"; tail -8 $OUT/train_step.log
t0=$SECONDS
timeout 150 python3 benchmarks/profile_lm_step.py --out $OUT/h200_profile_lm_step.json > $OUT/profile_lm_step.log 2>&1
echo "profile rc=$? in $((SECONDS-t0)) s"; tail -45 $OUT/profile_lm_step.log
