#!/bin/bash
# One device call: the first call whose carry completes the bundle starts node.sh in its own
# process session (it outlives the call while the machine stays warm); every call then waits up
# to WAIT s for it and returns what it wrote so far. Carry: .carry/k2a (part.aa of the bundle,
# pydantic's wheels, these scripts), .carry/k2b (part.ab) in a later call.
A=$PWD/.carry/k2a R=/tmp/k2r
mkdir -p $R
if [ -f .carry/k2b/part.ab ] && [ ! -f $R/started ]; then
  touch $R/started
  setsid nohup bash $A/node.sh $PWD > $R/node.log 2>&1 < /dev/null &
fi
end=$(( $(date +%s) + ${WAIT:-540} ))
while [ $(date +%s) -lt $end ] && [ -f $R/started ] && [ ! -f $R/done ]; do sleep 5; done
tail -n 40 $R/node.log 2>/dev/null
tar czf $OUT/k2r.tar.gz -C $R . 2>/dev/null; ls $R
