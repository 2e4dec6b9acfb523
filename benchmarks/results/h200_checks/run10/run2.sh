#!/usr/bin/env bash
# coordinator's device run 2: the merged tree (GEMM path, large-logits attention kernel, ux), train step
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
t0=$SECONDS
timeout 170 python3 -m pytest -q -m gpu -rf -p no:cacheprovider --durations=10 \
  tests/test_mx_dot_kernel_path.py tests/test_attention_large_logits.py tests/test_ux_gpu.py \
  tests/test_attention_kernel_gpu.py \
  -k "kernel_path or large or ux or nan_operand or every_output or bit_identical_across or gradients_through or default_takes" \
  > $OUT/logs/gpu_tests.txt 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; tail -22 $OUT/logs/gpu_tests.txt
t1=$SECONDS
timeout 60 python3 benchmarks/train_step.py --out $OUT/h200_train_step.json > $OUT/logs/train_step.log 2>&1
echo "train_step rc=$? in $((SECONDS-t1)) s"; tail -7 $OUT/logs/train_step.log
t2=$SECONDS
timeout 90 python3 benchmarks/attention.py --quick --budget-s 50 --out $OUT/h200_attention_fwd_quick.json > $OUT/logs/attention.log 2>&1
echo "attention rc=$? in $((SECONDS-t2)) s"; grep "^|" $OUT/logs/attention.log | head -30
python3 -m jax_mxfp8 > $OUT/logs/diagnostics_h200.txt 2>&1; head -40 $OUT/logs/diagnostics_h200.txt
