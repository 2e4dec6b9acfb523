#!/bin/bash
# session 9 call 3: tune 24 (tune 23 + p_scaled: P computed as 2^8 P) GPU tests; kernel-alone benchmark of
# tunes 0, 23, 24 twice in opposite orders (run-to-run noise); ncu census of tune 24
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
JAX_MXFP8_TEST_TUNES=24 timeout 200 python3 -m pytest -q -m gpu -n 4 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_t24.log 2>&1
echo "tests rc=$?"; grep -E "'tune': 24|passed|failed|Error|assert" $OUT/tests_t24.log | head -30
timeout 150 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t24a.json --tunes 0,23,24 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t24a.log | tail -10
timeout 150 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t24b.json --tunes 24,23,0 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t24b.log | tail -10
t=24
timeout 100 ncu --clock-control none -k regex:attention_bwd --launch-skip 1 --launch-count 1 --section WarpStateStats \
  --section SourceCounters --section SpeedOfLight --section SchedulerStats -o /tmp/ncu_bwd_t$t \
  python3 benchmarks/attention_bwd_kernel.py --profile $t > /tmp/ncu_t$t.log 2>&1
echo "ncu t$t rc=$?"
ncu --import /tmp/ncu_bwd_t$t.ncu-rep --page details > /tmp/ncu_bwd_t${t}_details.txt 2>&1
ncu --import /tmp/ncu_bwd_t$t.ncu-rep --page source --csv --print-source sass > /tmp/ncu_bwd_t${t}_sass.csv 2>/dev/null
python3 benchmarks/ncu_stall_summary.py /tmp/ncu_bwd_t${t}_sass.csv --top 25 > /tmp/ncu_bwd_t${t}_stalls.txt 2>&1
cat /tmp/ncu_bwd_t${t}_details.txt /tmp/ncu_bwd_t${t}_stalls.txt > $OUT/ncu_bwd_t${t}.txt
grep -E "Duration|Warp Cycles Per Issued|Eligible Warps|Compute \(SM\) Throughput|L2 Cache Throughput" /tmp/ncu_bwd_t${t}_details.txt | head -6
gzip -c /tmp/ncu_bwd_t${t}_sass.csv > $OUT/ncu_bwd_t${t}_sass.csv.gz
