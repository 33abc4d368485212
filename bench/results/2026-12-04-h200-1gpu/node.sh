#!/bin/bash
# Issue 29 on one H200 from an --adopt bundle alone (no network, no MEGATRON_ENV_SOURCE_*):
# the tool from the bundle's wheels, `invoke setup --bundle` cold (all three kernels), again
# (hits), a tampered resource refused, the libstdc++ check, flash-attn's left-out cases,
# gpu_health (attention + TE), smoke_train (TE and local layers). Results in /tmp/k2r.
REPO=$1 A=$1/.carry/k2a R=/tmp/k2r B=/tmp/bundle T=/tmp/h200-adopt.tar
PY=$(python3 -c 'import sys; print(sys.executable)')
export PYTHONUNBUFFERED=1 MEGATRON_ENV_CACHE=/tmp/node-cache COLUMNS=200 UV_PYTHON_DOWNLOADS=never
step() { echo "$(date -u +%T) $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; free -g | head -2
  $PY -c "import sys,torch;print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.backends.cudnn.version())"
  nvcc --version | tail -2; g++ --version | head -1; ninja --version; cmake --version | head -1; echo "python: $PY"
  env | grep -c '^MEGATRON_ENV_SOURCE_' ; } > $R/versions.txt 2>&1
step "join the bundle"; cat $A/part.aa $REPO/.carry/k2b/part.ab > $T
echo "5a23c5b3ebb4b5e208a2b09c4f4d996cc1120d8b331e42f4ba133a3b5b5a4bd5  $T" | sha256sum -c > $R/sha256.txt 2>&1 || { step "sha256 differs"; touch $R/done; exit 1; }
mkdir -p $B && tar xf $T -C $B && tar tvf $T > $R/listing.txt
step "tool"; { time { $PY -m venv /tmp/tool && /tmp/tool/bin/pip install -q --no-index --find-links $B/tool megatron-env; }; } > $R/tool-install.txt 2>&1
step "node prep: pydantic (TE's import needs it; the image lacks it)"
$PY -m pip install --no-index --no-deps $A/pyd/*.whl > $R/pydantic.txt 2>&1
cd $B/source
step "setup cold"; { time timeout 1500 /tmp/tool/bin/invoke setup --bundle $T --adopt $PY; } > $R/setup-1.txt 2>&1; echo "exit $?" >> $R/setup-1.txt
step "setup again"; { time timeout 300 /tmp/tool/bin/invoke setup --bundle $T --adopt $PY; } > $R/setup-2.txt 2>&1; echo "exit $?" >> $R/setup-2.txt
mkdir -p $R/cache; for m in /tmp/node-cache/kernels/wheels/*/meta.json /tmp/node-cache/*/wheels/*/meta.json; do [ -f $m ] || continue; d=$(basename $(dirname $m)); cp $m $R/cache/$d.meta.json; cp -r $(dirname $m)/ninja-logs $R/cache/$d.ninja-logs 2>/dev/null; done
for l in $(find /tmp/node-cache -path '*logs/*.log'); do gzip -c $l > $R/cache/$(basename $l).gz; done
step "tampered resource"; cp -a $B /tmp/tampered && printf x >> /tmp/tampered/resources/cutlass-headers/*.tar.gz
( cd /tmp/tampered/source && /tmp/tool/bin/invoke setup --bundle /tmp/tampered --adopt $PY ) > $R/tampered.txt 2>&1; echo "exit $?" >> $R/tampered.txt
SP=$($PY -c "import sysconfig;print(sysconfig.get_path('platlib'))")
for so in $SP/flash_attn_2_cuda*.so $SP/transformer_engine/*.so $SP/transformer_engine_torch*.so $SP/*amp_C*.so $SP/apex_C*.so $SP/fused_*.so; do
  [ -f "$so" ] && echo "$(basename $so): basic_ostream exported $(nm -C -D --defined-only $so | grep -c basic_ostream), $(readelf -d $so | grep -o 'libstdc++.so.6' || echo 'NO libstdc++.so.6 NEEDED')"
done > $R/libstdcxx.txt 2>&1
step "gpu_health"; timeout 240 $PY $REPO/scripts/gpu_health.py --out $R/gpu_health > $R/gpu_health.txt 2>&1; echo "exit $?" >> $R/gpu_health.txt
step "smoke_train"; for s in transformer_engine local; do timeout 150 $PY -m torch.distributed.run --nproc_per_node=1 $REPO/scripts/smoke_train.py --layer-spec $s --out $R/smoke-$s > $R/smoke-$s.log 2>&1; echo "exit $?" >> $R/smoke-$s.log; done
step "left-out cases"; cd $REPO && timeout 300 /tmp/tool/bin/python bench/kernel_build.py flash-attn --python $PY --out $R/fa-gpu --gpu-checks-only > $R/fa-gpu.log 2>&1; echo "exit $?" >> $R/fa-gpu.log
step done; touch $R/done
