#!/bin/bash
# Issue 36 on one H200 from an --adopt bundle alone (no network, nothing carried by hand into
# the image's environment): the tool from the bundle's wheels; `invoke setup --bundle` cold
# (all three kernels from one pool of compile jobs) with the load sampled every 2 s; again
# three times (warm) and with --verify-deep; a bare-image import of every kernel; then
# transformer-engine alone, cold, in a fresh cache. Results in /tmp/k36r.
REPO=$1 A=$1/.carry/k36a R=/tmp/k36r B=/tmp/bundle T=/tmp/h200-adopt.tar
PY=$(python3 -c 'import sys; print(sys.executable)')
export PYTHONUNBUFFERED=1 MEGATRON_ENV_CACHE=/tmp/node-cache COLUMNS=200 UV_PYTHON_DOWNLOADS=never
TIMEFORMAT='real %R s, user %U s, sys %S s'
step() { echo "$(date -u +%T) $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; free -g | head -2
  $PY -c "import sys,torch;print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.backends.cudnn.version())"
  nvcc --version | tail -2; g++ --version | head -1; ninja --version; which -a ninja; cmake --version | head -1; echo "python: $PY"
  env | grep -c '^MEGATRON_ENV_SOURCE_' ; } > $R/versions.txt 2>&1
step "join the bundle"; cat $A/part.aa $REPO/.carry/k36b/part.ab > $T
echo "$(cat $A/sha256)  $T" | sha256sum -c > $R/sha256.txt 2>&1 || { step "sha256 differs"; touch $R/done; exit 1; }
mkdir -p $B && tar xf $T -C $B
step "tool"; { time { $PY -m venv /tmp/tool && /tmp/tool/bin/pip install -q --no-index --find-links $B/tool megatron-env; }; } > $R/tool-install.txt 2>&1
$PY -m pip freeze > $R/freeze-before.txt 2>&1
$PY -c "import pydantic" > $R/pydantic-before.txt 2>&1; echo "exit $?" >> $R/pydantic-before.txt
sample() { while :; do echo "$(date +%s) $(cut -d' ' -f1,4 /proc/loadavg) $(ps -eo comm= | grep -cE '^(cicc|ptxas|cc1plus|cudafe\+\+)$') $(free -m | awk '/Mem:/{print $3}')"; sleep 2; done; }
echo "epoch load1 running/total compilers mem_used_mib" > $R/load.txt
sample >> $R/load.txt & SAMPLER=$!
cd $B/source
step "setup cold"; { time timeout 1500 /tmp/tool/bin/invoke setup --bundle $T --adopt $PY; } > $R/setup-1.txt 2>&1; echo "exit $?" >> $R/setup-1.txt
kill $SAMPLER
for i in 2 3 4; do step "setup warm $i"; { time timeout 300 /tmp/tool/bin/invoke setup --bundle $T --adopt $PY; } > $R/setup-$i.txt 2>&1; echo "exit $?" >> $R/setup-$i.txt; done
step "verify-deep"; { time timeout 150 /tmp/tool/bin/invoke setup --bundle $T --adopt $PY --verify-deep; } > $R/setup-deep.txt 2>&1; echo "exit $?" >> $R/setup-deep.txt
$PY -m pip freeze > $R/freeze-after.txt 2>&1
step "bare-image import"; $PY -c "
import flash_attn, flash_attn_2_cuda, transformer_engine.pytorch as te, transformer_engine_torch, apex, apex_C, amp_C, fused_layer_norm_cuda, pydantic, einops
print('imported:', flash_attn.__version__, te.__name__, apex.__name__, 'pydantic', pydantic.VERSION)" > $R/imports.txt 2>&1; echo "exit $?" >> $R/imports.txt
mkdir -p $R/cache; for m in /tmp/node-cache/*/wheels/*/meta.json /tmp/node-cache/wheels/*/meta.json; do [ -f $m ] || continue; d=$(basename $(dirname $m)); cp $m $R/cache/$d.meta.json; cp -r $(dirname $m)/ninja-logs $R/cache/$d.ninja-logs 2>/dev/null; done
for l in $(find /tmp/node-cache -path '*logs/*.log'); do gzip -c $l > $R/cache/$(basename $l).gz; done
step "transformer-engine alone, cold"
echo "epoch load1 running/total compilers mem_used_mib" > $R/load-te.txt; sample >> $R/load-te.txt & SAMPLER=$!
{ time MEGATRON_ENV_CACHE=/tmp/te-cache timeout 900 /tmp/tool/bin/invoke build transformer-engine --bundle $T --python $PY; } > $R/te-alone.txt 2>&1; echo "exit $?" >> $R/te-alone.txt
kill $SAMPLER
mkdir -p $R/te-cache; for m in /tmp/te-cache/*/wheels/*/meta.json /tmp/te-cache/wheels/*/meta.json; do [ -f $m ] || continue; cp $m $R/te-cache/; cp -r $(dirname $m)/ninja-logs $R/te-cache/ 2>/dev/null; done
step done; touch $R/done
