#!/bin/bash
# session 8 call 1: tune 19 (sdp_fp8) GPU tests + kernel-alone benchmark vs tune 0 and cuDNN
export PYTHONPATH=$PWD:$PWD/.devdeps XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi -L
python3 -c "import jax_mxfp8, jax; from jax_mxfp8.primitives import library; library.load_library(); print(jax.devices(), 'jax_mxfp8_attention_bwd_fp8_into' in library.ffi_targets())"
JAX_MXFP8_TEST_TUNES=19 timeout 330 python3 -m pytest -q -m gpu -n 4 -rP -p no:cacheprovider tests/test_attention_bwd_kernel_gpu.py > $OUT/tests_t19.log 2>&1
echo "tests rc=$?"; grep -E "SQNR|passed|failed|Error|assert" $OUT/tests_t19.log | head -60
[ -n "$BENCH" ] && timeout 200 python3 benchmarks/attention_bwd_kernel.py --out $OUT/bwd_kernel_t19.json --tunes 0,19 --modes none --calls 10 --batches 3 2>&1 | tee $OUT/bwd_kernel_t19.log | tail -20
