#!/bin/bash
# session 11 call 1: the LM example at its GPU size (the h200 preset, 1000 steps) on the final backward
# (tree of bd81406): MXFP8 and its BF16 twin from the same seed, curves overlaid in loss.png
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 560 python3 examples/train_lm.py --preset h200 --no-progress --out $OUT/lm > $OUT/train_lm.log 2>&1
echo "train_lm rc=$?"; tail -8 $OUT/train_lm.log
rm -rf $OUT/lm/checkpoint
