#!/bin/bash
# session 11 call 4: the packed backward kernel (registry PACKED, varlen_attention's backward on the aligned
# packed residuals): its GPU tests, the varlen GPU file, the dense kernel file at tunes 0 and 25 (unchanged
# cubins), then the jagged shape of the fwd+bwd table (ours_varlen now runs the packed backward)
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/test_varlen_packed_bwd.py > $OUT/tests_packed.log 2>&1
echo "packed tests rc=$?"; grep -E "passed|failed|FAILED|Error|dB vs" $OUT/tests_packed.log | head -14
JAX_MXFP8_TEST_TUNES=25 timeout 200 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_varlen_kernel_gpu.py \
  tests/test_attention_bwd_kernel_gpu.py tests/test_attention_mx_grads.py > $OUT/tests_varlen.log 2>&1
echo "varlen/dense tests rc=$?"; grep -E "passed|failed|FAILED" $OUT/tests_varlen.log | head -8
timeout 150 python3 benchmarks/attention.py --backward --only jagged --budget-s 100 --out $OUT/jagged.json > $OUT/jagged.log 2>&1
echo "jagged rc=$?"; tail -12 $OUT/jagged.log
