#!/usr/bin/env bash
# session 5 final, part 2: benchmarks of merged main (one process each; JSON under $OUT/r, tarred)
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
run() { local name=$1 lim=$2; shift 2; local t=$SECONDS; timeout $lim "$@" > $R/$name.log 2>&1; echo "$name rc=$? in $((SECONDS-t)) s"; }
run gemm 140 python3 benchmarks/gemm.py --out $R/h200_gemm.json --budget-s 100 \
  --only bf16,xla_fp8,xla_fp8_from_bf16,torch_bf16,torch_fp8,ours,ours_ref
grep "^|" $R/gemm.log | tail -8
run attention_bwd_kernel 40 python3 benchmarks/attention_bwd_kernel.py --tunes 0,12 --shapes 0,2,1 --modes none --calls 15 --batches 3 --out $R/h200_attention_bwd_kernel.json
tail -7 $R/attention_bwd_kernel.log
run train_step 45 python3 benchmarks/train_step.py --out $R/h200_train_step.json
tail -6 $R/train_step.log
run attention_bwd 110 python3 benchmarks/attention.py --backward --quick --dq-accum fp32,fp16 --budget-s 75 --out $R/h200_attention_bwd.json
grep "^|" $R/attention_bwd.log | head -14
run gemm_epilogue 40 python3 benchmarks/gemm_epilogue.py --calls 20 --batches 5 --only plain,epi_pre,epi_pre_col,epi_gelu_pre,epi_gelu_pre_col,epi_pre_then_col,epi_gelu_pre_then_col,then_ops_both --out $R/h200_gemm_epilogue.json
tail -5 $R/gemm_epilogue.log
run broadcast 25 python3 benchmarks/broadcast_attention.py --shapes 1 --calls 5 --batches 3 --out $R/h200_broadcast_attention.json
tail -3 $R/broadcast.log
(cd $OUT && tar czf r.tgz r && rm -rf r); ls -la $OUT
