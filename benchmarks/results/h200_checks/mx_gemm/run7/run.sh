#!/bin/bash
# issue 15 v4 device run: GPU tests, kernel benchmark (old vs new), ncu of the new production, e2e forward.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s)
timeout 40 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_mx_gemm_kernel.py > $OUT/gpu_tests_mx_gemm.log 2>&1
echo "mx_gemm tests rc=$? $(tail -n 1 $OUT/gpu_tests_mx_gemm.log) [$(( $(date +%s) - T0 )) s]"
timeout 70 python3 benchmarks/mx_gemm_kernel.py --only mx_t0,mx_t10,mx_t17,mx_t1,mx_t16,bf16,torch_fp8 --out $OUT/h200_mx_gemm_kernel.json > $OUT/bench.log 2>&1
echo "bench rc=$? [$(( $(date +%s) - T0 )) s]"; tail -n 6 $OUT/bench.log
timeout 35 ncu --clock-control none -k regex:MXGemmSm90 --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section SourceCounters --section SchedulerStats python3 benchmarks/mx_gemm_kernel.py --only mx_t0 --shapes 1 --calls 2 --batches 2 --out $OUT/ncu_bench.json > $OUT/ncu_t0_8192.txt 2>&1
echo "ncu rc=$? [$(( $(date +%s) - T0 )) s]"; grep -E "Duration|Elapsed Cycles|SM Frequency|Compute \(SM\)|Issue Slots Busy|Warp Cycles Per Issued|Eligible Warps|No Eligible" $OUT/ncu_t0_8192.txt | head -12
timeout 25 python3 benchmarks/gemm.py --only bf16,ours --budget-s 5 --out $OUT/h200_gemm_e2e.json > $OUT/e2e.log 2>&1; echo "e2e rc=$? [$(( $(date +%s) - T0 )) s]"; grep -E "^\| 8192" $OUT/e2e.log | head -n 3
R=$(( 138 - ($(date +%s) - T0) )); timeout $R python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_mx_dot_kernel_path.py -k "outlier or default" > $OUT/gpu_tests_dot_path.log 2>&1
echo "dot path tests rc=$? $(tail -n 1 $OUT/gpu_tests_dot_path.log) [$(( $(date +%s) - T0 )) s]"; grep -E "normal|lognormal|outlier" $OUT/gpu_tests_dot_path.log | head -3
