#!/bin/bash
# round A: each helper's staged tree, unpacked under /tmp/NAME, its device.sh run with a hard timeout
# usage: bash .stage-coord/roundA.sh name:grant_s [name:grant_s ...]
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
root=$PWD
for spec in "$@"; do
  name=${spec%%:*}; grant=${spec##*:}
  st=$root/.stage-$name
  [ -f $st/READY ] || { echo "$name: not ready" | tee -a $OUT/roundA.log; continue; }
  mkdir -p /tmp/$name $OUT/$name && tar xJf $st/stage.tar.xz -C /tmp/$name && cp $st/device.sh /tmp/$name/
  t0=$SECONDS
  ( cd /tmp/$name && RES=$OUT/$name PYTHONPATH=/tmp/$name timeout -k 5 $((grant + 10)) bash device.sh > $OUT/$name/device_sh.log 2>&1; echo "rc $?" >> $OUT/$name/device_sh.log )
  echo "$name: $((SECONDS - t0)) s, $(tail -1 $OUT/$name/device_sh.log)" | tee -a $OUT/roundA.log
  find $OUT/$name -name '*.ncu-rep' -size +12M -delete
  (cd $OUT && tar czf $name.tgz $name && rm -rf $name)
done
ls -la $OUT
