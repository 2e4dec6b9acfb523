#!/bin/bash
# session 8 call 6: the broadcast test on the new production; the TransformerBlock train step
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_broadcast_query_attention.py > $OUT/tests_broadcast.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|^E " $OUT/tests_broadcast.log | head -12
timeout 200 python3 benchmarks/train_step.py --out $OUT/h200_train_step.json 2>&1 | tee $OUT/train_step.log | tail -12
