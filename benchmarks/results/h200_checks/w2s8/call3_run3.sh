#!/bin/bash
# session 8 call 3: tune 19 with v8 in v's place (GPU tests), kernel path tests, kernel bench, the fwd+bwd HLO's fusions
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=19 timeout 200 python3 -m pytest -q -m gpu -n 4 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_t19_v8.log 2>&1
echo "tests t19 rc=$?"; grep -E "SQNR.*tune': 19|passed|failed|Error" $OUT/tests_t19_v8.log | head -20
timeout 200 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_attention_bwd_kernel_path_gpu.py tests/test_attention_realign_gpu.py > $OUT/tests_path.log 2>&1
echo "tests path rc=$?"; tail -3 $OUT/tests_path.log
timeout 100 python3 benchmarks/dump_attention_hlo.py --out /tmp/fb.hlo.txt > $OUT/hlo_fusions.txt 2>&1; echo "hlo rc=$?"
grep -E "convert|transpose|and_fusion|reduce" $OUT/hlo_fusions.txt | head -40
timeout 120 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t19c.json --tunes 0,19 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t19c.log | tail -8
