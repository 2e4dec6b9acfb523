#!/bin/bash
# session 9 call 5: kernel alone tunes 25 vs 0 again (opposite order), the fwd+bwd benchmark and the
# TransformerBlock train step on the session 9 production
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 60 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t25b.json --tunes 25,0 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t25b.log | tail -7
timeout 220 python3 benchmarks/attention.py --backward --quick --budget-s 150 --out $OUT/h200_attention_bwd.json 2>&1 | tee $OUT/attention_bwd_quick.log | tail -8
timeout 150 python3 benchmarks/train_step.py --out $OUT/h200_train_step.json 2>&1 | tee $OUT/train_step.log | tail -12
