#!/bin/bash
# H200 round C (issues 11, 13): bundle.sh's setup once, then bench/warm_setup.py over it
# (5 warm runs, the stat check alone, one --verify-deep run), after the adopted deep-check fix.
cd "$(dirname "$0")/../../.."
REPO=$PWD PY=/opt/torch/.venv/bin/python3 B=/tmp/bundle R=$OUT/warm
mkdir -p $B $R
export PYTHONUNBUFFERED=1 MEGATRON_ENV_CACHE=/tmp/node-cache COLUMNS=200
tar xf .carry/h200-adopt.tar -C $B
$PY -m venv /tmp/tool && /tmp/tool/bin/pip install -q --no-index --find-links $B/tool megatron-env
cd $B/source && cp -r $REPO/bench $B/source/
{ time /tmp/tool/bin/invoke setup --bundle $B --adopt $PY --no-builds; } > $R/setup-1.txt 2>&1
echo "exit $?" >> $R/setup-1.txt
/tmp/tool/bin/python bench/warm_setup.py --profile core_v0.19.0-cu130 --adopt $PY \
  --repeat 5 --out $R/warm_setup.json -- --bundle $B --no-builds > $R/warm_setup.txt 2>&1
echo "exit $?" >> $R/warm_setup.txt
