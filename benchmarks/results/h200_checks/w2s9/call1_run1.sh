#!/bin/bash
# session 9 call 1: tune 20 (dq_keys "own" + tma_warp + sdp_fp8: the consumers decoupled) GPU tests,
# kernel-alone benchmark vs tune 0 (production) and cuDNN, ncu stalls of tune 20
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi -L
timeout 150 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t20.json --tunes 0,20 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t20.log | tail -12
JAX_MXFP8_TEST_TUNES=20 timeout 240 python3 -m pytest -q -m gpu -n 4 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_t20.log 2>&1
echo "tests rc=$?"; grep -E "t20|passed|failed|Error|assert" $OUT/tests_t20.log | head -40
t=20
timeout 120 ncu --clock-control none -k regex:attention_bwd --launch-skip 1 --launch-count 1 --section WarpStateStats \
  --section SourceCounters --section SpeedOfLight --section SchedulerStats -o /tmp/ncu_bwd_t$t \
  python3 benchmarks/attention_bwd_kernel.py --profile $t > /tmp/ncu_t$t.log 2>&1
echo "ncu t$t rc=$?"; tail -3 /tmp/ncu_t$t.log
ncu --import /tmp/ncu_bwd_t$t.ncu-rep --page details > /tmp/ncu_bwd_t${t}_details.txt 2>&1
ncu --import /tmp/ncu_bwd_t$t.ncu-rep --page source --csv --print-source sass > /tmp/ncu_bwd_t${t}_sass.csv 2>/dev/null
python3 benchmarks/ncu_stall_summary.py /tmp/ncu_bwd_t${t}_sass.csv --top 25 > /tmp/ncu_bwd_t${t}_stalls.txt 2>&1
cat /tmp/ncu_bwd_t${t}_details.txt /tmp/ncu_bwd_t${t}_stalls.txt > $OUT/ncu_bwd_t${t}.txt
grep -E "Duration|Warp Cycles Per Issued|Eligible Warps|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput" /tmp/ncu_bwd_t${t}_details.txt | head -8
head -30 /tmp/ncu_bwd_t${t}_stalls.txt
gzip -c /tmp/ncu_bwd_t${t}_sass.csv > $OUT/ncu_bwd_t${t}_sass.csv.gz
