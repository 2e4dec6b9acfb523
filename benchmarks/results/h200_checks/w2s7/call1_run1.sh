#!/usr/bin/env bash
# device call 1 (session 2026-12-02 afternoon): GPU tests of what changed since the last GPU run + GEMM benches
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.devdeps JAX_MXFP8_TEST_TUNES=12
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python3 -c "import jax, sys; print(jax.__version__, sys.version)" >> $OUT/device.txt
t0=$SECONDS
timeout 300 python3 -m pytest -q -m gpu -rf -p no:cacheprovider --tb=short --durations=15 -n 4 \
  tests/test_gemm_reference_bf16.py tests/test_mx_dot_kernel_path.py tests/test_mx_dot_handoff.py \
  tests/test_mx_dot_quantized.py tests/test_quantize_kernels_gpu.py tests/test_attention_kernel_gpu.py \
  tests/test_attention_gpu.py tests/test_attention_bwd_kernel_path_gpu.py tests/test_attention_mx_grads.py \
  > $OUT/gpu_tests_1.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s" | tee -a $OUT/gpu_tests_1.log
tail -30 $OUT/gpu_tests_1.log
t0=$SECONDS
timeout 80 python3 benchmarks/gemm_reference_breakdown.py --out $OUT/h200_gemm_reference_breakdown.json > $OUT/gemm_reference_breakdown.log 2>&1
echo "breakdown rc=$? in $((SECONDS-t0)) s"; tail -15 $OUT/gemm_reference_breakdown.log
t0=$SECONDS
timeout 170 python3 benchmarks/gemm.py --out $OUT/h200_gemm.json --budget-s 140 \
  --only bf16,xla_fp8,xla_fp8_from_bf16,torch_bf16,torch_fp8,ours,ours_ref > $OUT/gemm.log 2>&1
echo "gemm rc=$? in $((SECONDS-t0)) s"; tail -25 $OUT/gemm.log
