#!/bin/bash
# H200 call 1 (issue 24): Transformer Engine v2.17.1 cold + cache hit through `invoke build`
# (bench/kernel_build.py: the GPU check and gpu_health's attention timing after), smoke_train with
# TE layers and with local layers, then apex 25.09 cold + cache hit. Inputs carried in .carry/:
# tool/ (this checkout), whl/ (invoke, uv), te/ (TE bare repo, cutlass headers, the
# cudnn-frontend 1.25.0 wheel, cuDNN.cmake of v1.23.0, pydantic wheels), megatron-core.tar.gz
# (megatron/core of core_v0.19.0), apex.git.tar (25.09, depth 1).
set -o pipefail
C=${C:-$PWD/.carry}  # run from the repository root that holds .carry/
T0=$(date +%s); R=/tmp/r; mkdir -p $R
cd $C/tool
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $C/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 UV_PYTHON_DOWNLOADS=never
unset MAX_JOBS APEX_PARALLEL_BUILD
PY=/opt/torch/.venv/bin/python3
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; free -g | head -2
  $PY -c "import sys,torch;print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.backends.cudnn.version())"
  nvcc --version | tail -2; gcc --version | head -1; cmake --version | head -1
  $PY -m pip list 2>/dev/null | grep -i -E "^(cmake|pybind11|ninja|einops|onnx|onnxscript|pydantic|numpy|megatron|transformer|flash|apex) "; } > $R/versions.txt 2>&1
mkdir -p /tmp/te /tmp/megatron && tar xf $C/te/TransformerEngine-v2.17.1.git.tar -C /tmp/te && tar xzf $C/megatron-core.tar.gz -C /tmp/megatron && tar xf $C/apex.git.tar -C /tmp
uv pip install --python $PY --no-index --find-links $C/te/wheels-pydantic "pydantic<2.14" > $R/pydantic.txt 2>&1
export MEGATRON_ENV_MIRROR_TRANSFORMER_ENGINE=/tmp/te/TransformerEngine.git MEGATRON_ENV_MIRROR_APEX=/tmp/apex.git \
  MEGATRON_ENV_SOURCE_CUTLASS_HEADERS=$C/te/cutlass-57e3cfb4-include.tar.gz \
  MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_HEADERS=$(ls $C/te/nvidia_cudnn_frontend-1.25.0-*.whl) \
  MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_CMAKE=$C/te/fe-cmake.tar.gz
timeout 330 python3 bench/kernel_build.py transformer-engine --profile core_v0.19.0-cu130 --python $PY --out $R/te 2>&1 | tee $R/te.log
for spec in transformer_engine local; do
  timeout 100 env PYTHONPATH=/tmp/megatron $PY -m torch.distributed.run --nproc_per_node=1 scripts/smoke_train.py --layer-spec $spec --out $R/smoke-$spec > $R/smoke-$spec.log 2>&1
  echo "exit $?" >> $R/smoke-$spec.log; tail -3 $R/smoke-$spec.log
done
LEFT=$(( 565 - $(date +%s) + T0 )); echo "apex gets ${LEFT} s"
[ $LEFT -gt 60 ] && timeout $LEFT python3 bench/kernel_build.py apex --profile core_v0.19.0-cu130 --python $PY --out $R/apex --no-gpu-check 2>&1 | tee $R/apex.log
tar czf $OUT/call1.tar.gz -C $R . ; cp $R/te/kernel_build.json $OUT/te-kernel_build.json 2>/dev/null; cp $R/versions.txt $OUT/
echo "call1 done in $(( $(date +%s) - T0 )) s"
