#!/usr/bin/env bash
# coordinator's device run 13 (session 3, final tree): backward tunings 0-6, issue 18's presets, remaining GPU checks
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/logs
t0=$SECONDS
timeout 70 python3 -m pytest -q -m gpu -rf -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/logs/bwd_tests.txt 2>&1
echo "bwd tests rc=$? in $((SECONDS-t0)) s"; grep -E "passed|failed|FAILED|tune" $OUT/logs/bwd_tests.txt | tail -12
t1=$SECONDS
timeout 60 python3 benchmarks/attention_bwd_kernel.py --out $OUT/h200_attention_bwd_kernel.json > $OUT/logs/attention_bwd_kernel.log 2>&1
echo "bwd kernel rc=$? in $((SECONDS-t1)) s"; tail -24 $OUT/logs/attention_bwd_kernel.log | grep -E "B4|tune"
t2=$SECONDS
timeout 105 python3 examples/train_lm.py --preset h200 --steps 150 --eval-every 50 --no-progress --out $OUT/lm > $OUT/logs/lm.log 2>&1
echo "lm rc=$? in $((SECONDS-t2)) s"; tail -5 $OUT/logs/lm.log
t3=$SECONDS
timeout 95 python3 examples/train_recommender.py --preset h200 --steps 30 --log-every 10 --out $OUT/rec > $OUT/logs/rec.log 2>&1
echo "rec rc=$? in $((SECONDS-t3)) s"; tail -8 $OUT/logs/rec.log
t4=$SECONDS
timeout 40 python3 -m pytest -q -m gpu -rf -p no:cacheprovider tests/test_ux_gpu.py tests/test_attention_large_logits.py tests/test_float32_range.py > $OUT/logs/other_tests.txt 2>&1
echo "other tests rc=$? in $((SECONDS-t4)) s"; tail -3 $OUT/logs/other_tests.txt
python3 -m jax_mxfp8 > $OUT/logs/diagnostics_h200.txt 2>&1
rm -rf $OUT/lm/checkpoint $OUT/rec/checkpoint 2>/dev/null; find $OUT -size +5M -print -delete
