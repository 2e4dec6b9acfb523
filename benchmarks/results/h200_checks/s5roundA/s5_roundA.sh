#!/usr/bin/env bash
# session 5 round A: helpers' staged trees (roundA.sh), then the one full benchmarks/gemm.py run on main + the reference breakdown
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
bash .stage-coord/roundA.sh "$@"
mkdir -p $OUT/coord
t0=$SECONDS
[ -n "$WITH_GEMM" ] && PYTHONPATH=$PWD timeout 150 python3 benchmarks/gemm.py --out $OUT/coord/h200_gemm.json --budget-s 110 \
  --only bf16,xla_fp8,xla_fp8_from_bf16,torch_bf16,torch_fp8,ours,ours_ref > $OUT/coord/gemm.log 2>&1
echo "gemm rc=$? in $((SECONDS-t0)) s"; grep "^|" $OUT/coord/gemm.log | tail -30
t1=$SECONDS
PYTHONPATH=$PWD timeout 60 python3 benchmarks/gemm_reference_breakdown.py --out $OUT/coord/h200_gemm_reference_breakdown.json > $OUT/coord/breakdown.log 2>&1
echo "breakdown rc=$? in $((SECONDS-t1)) s"; tail -5 $OUT/coord/breakdown.log
(cd $OUT && tar czf coord.tgz coord && rm -rf coord)
ls -la $OUT
