#!/bin/bash
# H200 round B (issue 13): the node (no network) set up from an --adopt bundle carried as the only
# input: the tool installed from the bundle's wheels, `invoke setup --bundle` twice, a tampered
# copy refused, then bench/warm_setup.py over the same checkout. Made where the network is with
#   invoke bundle --profile core_v0.19.0-cu130 --adopt --without transformer-engine \
#       --out .carry/h200-adopt.tar
cd "$(dirname "$0")/../../.."
REPO=$PWD PY=/opt/torch/.venv/bin/python3 B=/tmp/bundle R=$OUT/bundle
mkdir -p $B $R
export PYTHONUNBUFFERED=1 MEGATRON_ENV_CACHE=/tmp/node-cache COLUMNS=200
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  $PY -c "import sys,torch;print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"
  ls -l .carry/h200-adopt.tar; } > $R/versions.txt 2>&1
{ time tar xf .carry/h200-adopt.tar -C $B; } > $R/unpack.txt 2>&1
{ time { $PY -m venv /tmp/tool && /tmp/tool/bin/pip install --no-index --find-links $B/tool megatron-env; }; } > $R/tool-install.txt 2>&1
echo "exit $?" >> $R/tool-install.txt
cd $B/source
for i in 1 2; do
  { time timeout 240 /tmp/tool/bin/invoke setup --bundle $B --adopt $PY --no-builds; } > $R/setup-$i.txt 2>&1
  echo "exit $?" >> $R/setup-$i.txt
done
cp -a $B /tmp/tampered && echo "# changed" >> /tmp/tampered/source/envs/core_v0.19.0-cu130/profile.toml
/tmp/tool/bin/invoke setup --bundle /tmp/tampered --adopt $PY --no-builds > $R/tampered.txt 2>&1
echo "exit $?" >> $R/tampered.txt
/tmp/tool/bin/invoke setup --bundle $B --adopt $PY > $R/without-te.txt 2>&1
echo "exit $?" >> $R/without-te.txt
cp -r $REPO/bench $B/source/
timeout 200 /tmp/tool/bin/python bench/warm_setup.py --profile core_v0.19.0-cu130 --adopt $PY \
  --repeat 5 --out $R/warm_setup.json -- --bundle $B --no-builds > $R/warm_setup.txt 2>&1
echo "exit $?" >> $R/warm_setup.txt
