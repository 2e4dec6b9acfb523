#!/bin/bash
# session 10 call 4 (the command as run): the quick fwd+bwd benchmark after call 3
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1; timeout 280 python3 benchmarks/attention.py --backward --quick --budget-s 180 --out $OUT/h200_attention_bwd.json 2>&1 | tee $OUT/attention_bwd_quick.log | tail -14
