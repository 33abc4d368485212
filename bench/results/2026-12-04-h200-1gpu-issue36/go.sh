#!/bin/bash
# One device call (as in ../2026-12-04-h200-1gpu/go.sh): the call whose carry completes the
# bundle starts node.sh in its own process session (it outlives the call while the machine
# stays warm); every call waits up to WAIT s and returns what node.sh wrote so far.
# Carry: .carry/k36a (part.aa, these scripts), .carry/k36b (part.ab) in the next call.
A=$PWD/.carry/k36a R=/tmp/k36r
mkdir -p $R
if [ -f .carry/k36b/part.ab ] && [ ! -f $R/started ]; then
  touch $R/started
  setsid nohup bash $A/node.sh $PWD > $R/node.log 2>&1 < /dev/null &
fi
end=$(( $(date +%s) + ${WAIT:-540} ))
while [ $(date +%s) -lt $end ] && [ -f $R/started ] && [ ! -f $R/done ]; do sleep 5; done
tail -n 30 $R/node.log 2>/dev/null
tar czf $OUT/k36r.tar.gz -C $R . 2>/dev/null; ls $R
