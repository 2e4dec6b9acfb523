#!/usr/bin/env bash
# coordinator's device run 11 (session 3, early): issue 18's H200 presets on main bf0dffb (lib of 14:24)
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
t0=$SECONDS
timeout 150 python3 examples/train_lm.py --preset h200 --steps 150 --eval-every 50 --no-progress --out $OUT/lm > $OUT/logs/lm.log 2>&1
echo "lm rc=$? in $((SECONDS-t0)) s"; tail -15 $OUT/logs/lm.log
t1=$SECONDS
timeout 110 python3 examples/train_recommender.py --preset h200 --steps 40 --out $OUT/rec > $OUT/logs/rec.log 2>&1
echo "rec rc=$? in $((SECONDS-t1)) s"; tail -15 $OUT/logs/rec.log
rm -rf $OUT/lm/checkpoint* $OUT/lm/ckpt* 2>/dev/null; find $OUT -size +5M -print -delete
