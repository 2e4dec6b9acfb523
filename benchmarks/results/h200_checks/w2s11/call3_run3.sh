#!/bin/bash
# session 11 call 3: the p_scale="block" GPU tests again after the sink case's fix (call 2: 16 passed, the sink
# case's premise failed: the sink's own noise let some other keys' P above the constant scale's flush point),
# serially with -s so that the SQNR rows are printed
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/test_attention_bwd_pblock.py > $OUT/tests_pblock.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|SQNR|non-sink" $OUT/tests_pblock.log | head -12
