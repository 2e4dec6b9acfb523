#!/bin/bash
# session 9 call 2: tunes 21-23 (dk_ss: dK's A from shared memory; next_early 1/2: the next tile's S^T (/dP^T)
# issued after this tile's dQ store, under dK) GPU tests, kernel-alone benchmark vs tune 0 and cuDNN
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t21.json --tunes 0,23,21,22 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t21.log | tail -14
JAX_MXFP8_TEST_TUNES=21,22,23 timeout 300 python3 -m pytest -q -m gpu -n 4 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_t21.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error|assert" $OUT/tests_t21.log | head -30
