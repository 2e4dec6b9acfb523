#!/bin/bash
# coordinator run 1 (session 4): bwd GPU tests (all tunes), MX GEMM diagnostics, ncu stall tables
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
mkdir -p $OUT/r1
( timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short --durations=15 tests/test_attention_bwd_kernel_gpu.py > $OUT/r1/bwd_gpu_tests.log 2>&1; echo "rc $?" >> $OUT/r1/bwd_gpu_tests.log )
( timeout 80 python3 benchmarks/mx_gemm_kernel.py --only mx_t0,mx_t19,mx_t20,bf16,torch_fp8 --out $OUT/r1/mx_gemm_kernel_t19_t20.json > $OUT/r1/mx_gemm_kernel.log 2>&1; echo "rc $?" >> $OUT/r1/mx_gemm_kernel.log )
# ncu: attention bwd tune 5 (smem_stats), B4 T4k H128 non-causal, per-instruction stalls
( timeout 90 ncu --clock-control none -k regex:attention_bwd --launch-skip 1 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis -o $OUT/r1/ncu_bwd_t5 python3 benchmarks/attention_bwd_kernel.py --profile 5 > $OUT/r1/ncu_bwd_t5.log 2>&1
  ncu --import $OUT/r1/ncu_bwd_t5.ncu-rep > $OUT/r1/ncu_bwd_t5.txt 2>&1
  ncu --import $OUT/r1/ncu_bwd_t5.ncu-rep --page source --csv --print-source sass > /tmp/bwd_sass.csv 2>/dev/null
  python3 benchmarks/ncu_stall_summary.py /tmp/bwd_sass.csv --top 40 > $OUT/r1/ncu_bwd_t5_stalls.txt 2>&1 ) 
# ncu: MX GEMM production, 8192^3, per-instruction stalls
( timeout 60 ncu --clock-control none -k regex:mx_gemm --launch-skip 1 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis -o $OUT/r1/ncu_gemm_t0 python3 benchmarks/mx_gemm_kernel.py --only mx_t0 --shapes 1 --calls 2 --batches 1 --out /tmp/x.json > $OUT/r1/ncu_gemm_t0.log 2>&1
  ncu --import $OUT/r1/ncu_gemm_t0.ncu-rep > $OUT/r1/ncu_gemm_t0.txt 2>&1
  ncu --import $OUT/r1/ncu_gemm_t0.ncu-rep --page source --csv --print-source sass > /tmp/gemm_sass.csv 2>/dev/null
  python3 benchmarks/ncu_stall_summary.py /tmp/gemm_sass.csv --top 40 > $OUT/r1/ncu_gemm_t0_stalls.txt 2>&1 )
gzip -c /tmp/bwd_sass.csv > $OUT/r1/bwd_sass.csv.gz; gzip -c /tmp/gemm_sass.csv > $OUT/r1/gemm_sass.csv.gz
mv $OUT/r1/*.ncu-rep $OUT/ 2>/dev/null
cd $OUT && tar czf r1.tgz r1 && ls -la r1 && rm -rf r1
