#!/bin/bash
# session 10 call 5 (the command as run): the full fwd+bwd run (all shapes, fp16 dq column) after call 3
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1; timeout 560 python3 benchmarks/attention.py --backward --budget-s 420 --dq-accum fp32,fp16 --out $OUT/h200_attention_bwd.json 2>&1 | tee $OUT/attention_bwd_full.log | tail -22
