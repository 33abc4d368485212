#!/bin/bash
# H200 round A: preflight of this node, then in the background the issue-16 kernel builds.
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 UV_PYTHON_DOWNLOADS=never
unset MAX_JOBS APEX_PARALLEL_BUILD
PY=/opt/torch/.venv/bin/python3; R=/tmp/r; mkdir -p $R
export MEGATRON_ENV_SOURCE_FLASH_ATTN=$PWD/.carry/flash_attn-2.8.3.tar.gz MEGATRON_ENV_MIRROR_APEX=$PWD/.carry/apex.git
{ nvidia-smi; $PY -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; nproc; free -g; nvcc --version; cat /proc/self/cgroup; mount | grep cgroup; } > $R/versions.txt 2>&1
( time python3 -m invoke preflight --local --profile core_v0.19.0-cu130 --python $PY --run-dir $R/preflight/run ) > $R/preflight.txt 2>&1; echo "exit $?" >> $R/preflight.txt
python3 -m invoke preflight --fleet $R/preflight/run --json > $R/preflight.json 2>$R/preflight-json.err
cat > $R/chain.sh <<EOC
python3 bench/kernel_build.py flash-attn --profile core_v0.19.0-cu130 --python $PY --out $R/flash-attn-variant > $R/fa.log 2>&1; echo fa-exit \$? >> $R/status
python3 bench/kernel_build.py apex --profile core_v0.19.0-cu130 --python $PY --out $R/apex > $R/apex.log 2>&1; echo apex-exit \$? >> $R/status
python3 bench/memory_limit.py flash-attn --profile core_v0.19.0-cu130 --python $PY --limit-gib 24 --naive-jobs 16 --only naive --out $R/memory-limit-naive > $R/memn.log 2>&1; echo memn-exit \$? >> $R/status
python3 bench/memory_limit.py flash-attn --profile core_v0.19.0-cu130 --python $PY --limit-gib 24 --only derived --out $R/memory-limit-derived > $R/memd.log 2>&1; echo memd-exit \$? >> $R/status
EOC
setsid nohup bash $R/chain.sh > $R/chain.out 2>&1 < /dev/null &
