#!/bin/bash
# session 10 call 9 (the command as run): the fwd+bwd profile on the final production
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1; timeout 100 python3 benchmarks/profile_attention_step.py --out $OUT/h200_profile_attention_step.json 2>&1 | tee $OUT/profile_attention_step.log | grep -E "^B|ours:|cudnn_bf16:|pre-pass" | head -12
