#!/usr/bin/env bash
# coordinator's final device run (session 4, merged main): GPU tests of what changed, kernel + e2e benchmarks
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/logs
t0=$SECONDS
JAX_MXFP8_TEST_TUNES=12 timeout 240 python3 -m pytest -q -m gpu -rf -p no:cacheprovider --tb=short --durations=10 \
  tests/test_mx_gemm_kernel.py tests/test_mx_gemm_epilogue.py tests/test_mx_dot_quantized.py \
  tests/test_attention_bwd_dq_modes_gpu.py tests/test_broadcast_query_attention.py tests/test_attention_mx_grads.py \
  tests/test_attention_bwd_kernel_path_gpu.py tests/test_mx_dot_kernel_path.py tests/test_attention_bwd_kernel_gpu.py \
  > $OUT/logs/gpu_tests.txt 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/logs/gpu_tests.txt | tail -25
t1=$SECONDS
timeout 45 python3 benchmarks/attention_bwd_kernel.py --tunes 0,13,1 --calls 5 --batches 3 --out $OUT/h200_attention_bwd_kernel.json > $OUT/logs/attention_bwd_kernel.log 2>&1
echo "bwd kernel rc=$? in $((SECONDS-t1)) s"; cat $OUT/logs/attention_bwd_kernel.log | tail -14
t2=$SECONDS
timeout 100 python3 benchmarks/attention.py --backward --quick --dq-accum fp32,fp16 --budget-s 70 --out $OUT/h200_attention_bwd.json > $OUT/logs/attention_bwd.log 2>&1
echo "attention bwd rc=$? in $((SECONDS-t2)) s"; grep "^|" $OUT/logs/attention_bwd.log | head -20
t3=$SECONDS
timeout 25 python3 benchmarks/mx_gemm_kernel.py --only mx_t0,mx_t10,bf16,torch_fp8 --out $OUT/h200_mx_gemm_kernel.json > $OUT/logs/mx_gemm_kernel.log 2>&1
echo "mx gemm rc=$? in $((SECONDS-t3)) s"; tail -6 $OUT/logs/mx_gemm_kernel.log
t4=$SECONDS
timeout 55 python3 benchmarks/train_step.py --out $OUT/h200_train_step.json > $OUT/logs/train_step.log 2>&1
echo "train_step rc=$? in $((SECONDS-t4)) s"; tail -8 $OUT/logs/train_step.log
t5=$SECONDS
timeout 25 python3 benchmarks/broadcast_attention.py --shapes 1 --calls 5 --batches 3 --out $OUT/h200_broadcast_attention.json > $OUT/logs/broadcast_attention.log 2>&1
echo "broadcast rc=$? in $((SECONDS-t5)) s"; tail -4 $OUT/logs/broadcast_attention.log
ls $OUT $OUT/logs
