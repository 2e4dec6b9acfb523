#!/bin/bash
# session 10 call 6: ncu census of the session 10 production (tune 0 = dv_f16) at B4 T4k N16 H128, for the
# instruction and stall tables of docs/perf-notes.md (compare h200_checks/w2s9/call3_ncu_bwd_t24.txt)
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
t=0
timeout 150 ncu --clock-control none -k regex:attention_bwd --launch-skip 1 --launch-count 1 --section WarpStateStats \
  --section SourceCounters --section SpeedOfLight --section SchedulerStats -o /tmp/ncu_bwd_t$t \
  python3 benchmarks/attention_bwd_kernel.py --profile $t > /tmp/ncu_t$t.log 2>&1
echo "ncu t$t rc=$?"; tail -3 /tmp/ncu_t$t.log
ncu --import /tmp/ncu_bwd_t$t.ncu-rep --page details > /tmp/ncu_bwd_t${t}_details.txt 2>&1
ncu --import /tmp/ncu_bwd_t$t.ncu-rep --page source --csv --print-source sass > /tmp/ncu_bwd_t${t}_sass.csv 2>/dev/null
python3 benchmarks/ncu_stall_summary.py /tmp/ncu_bwd_t${t}_sass.csv --top 25 > /tmp/ncu_bwd_t${t}_stalls.txt 2>&1
cat /tmp/ncu_bwd_t${t}_details.txt /tmp/ncu_bwd_t${t}_stalls.txt > $OUT/ncu_bwd_t${t}.txt
grep -E "Duration|Warp Cycles Per Issued|Eligible Warps|Compute \(SM\) Throughput|L2 Cache Throughput|Issued Warp|Executed Ipc" /tmp/ncu_bwd_t${t}_details.txt | head -10
head -40 /tmp/ncu_bwd_t${t}_stalls.txt
gzip -c /tmp/ncu_bwd_t${t}_sass.csv > $OUT/ncu_bwd_t${t}_sass.csv.gz
