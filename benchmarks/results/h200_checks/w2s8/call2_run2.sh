#!/bin/bash
# session 8 call 2: ncu stalls of tune 0 and tune 19 (B4 T4k N16 H128 non-causal), the fwd+bwd profile, kernel-alone repeat
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for t in 0 19; do
  timeout 150 ncu --clock-control none -k regex:attention_bwd --launch-skip 1 --launch-count 1 --section WarpStateStats \
    --section SourceCounters --section SpeedOfLight --section SchedulerStats -o /tmp/ncu_bwd_t$t \
    python3 benchmarks/attention_bwd_kernel.py --profile $t > /tmp/ncu_t$t.log 2>&1
  echo "ncu t$t rc=$?"; tail -3 /tmp/ncu_t$t.log
  ncu --import /tmp/ncu_bwd_t$t.ncu-rep --page details > /tmp/ncu_bwd_t${t}_details.txt 2>&1
  ncu --import /tmp/ncu_bwd_t$t.ncu-rep --page source --csv --print-source sass > /tmp/ncu_bwd_t${t}_sass.csv 2>/dev/null
  python3 benchmarks/ncu_stall_summary.py /tmp/ncu_bwd_t${t}_sass.csv --top 25 > /tmp/ncu_bwd_t${t}_stalls.txt 2>&1
  cat /tmp/ncu_bwd_t${t}_details.txt /tmp/ncu_bwd_t${t}_stalls.txt > $OUT/ncu_bwd_t${t}.txt
  grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Eligible Warps|Compute \(SM\) Throughput|Memory Throughput" /tmp/ncu_bwd_t${t}_details.txt | head -8
  head -30 /tmp/ncu_bwd_t${t}_stalls.txt
done
gzip -c /tmp/ncu_bwd_t19_sass.csv > $OUT/ncu_bwd_t19_sass.csv.gz
timeout 200 python3 benchmarks/profile_attention_step.py --out $OUT/h200_profile_attention_step.json 2>&1 | tee $OUT/profile_attention_step.log | tail -45
timeout 120 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t19b.json --tunes 0,19 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t19b.log | tail -8
