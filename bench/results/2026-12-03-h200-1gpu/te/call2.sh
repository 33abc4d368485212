#!/bin/bash
# H200 call 2 (issue 24): with the shared-libstdc++ link fix, Transformer Engine and flash-attn
# (hdims=128 dtypes=bf16) cold builds at the same time (one call's time does not hold both one
# after the other), each cache hit, the exported libstdc++ symbols of every built .so,
# gpu_health (TE and flash-attn checks, attention backends timed), flash-attn's left-out
# kernels (forward, backward, varlen, kvcache), smoke_train with TE layers. Same carry as call1.sh
# plus .carry/flash_attn-2.8.3.tar.gz.
set -o pipefail
C=${C:-$PWD/.carry}; T0=$(date +%s); END=$((T0 + ${BUDGET:-520})); R=/tmp/r; mkdir -p $R
left() { echo $(( END - $(date +%s) )); }
save() { tar czf $OUT/call2.tar.gz -C $R . 2>/dev/null; }  # after each phase: a cut-off call still returns what ran
cd $C/tool
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $C/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 UV_PYTHON_DOWNLOADS=never
unset MAX_JOBS APEX_PARALLEL_BUILD
PY=/opt/torch/.venv/bin/python3; P=core_v0.19.0-cu130; K=/tmp/kcache
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; which g++ c++; g++ -print-file-name=libstdc++.so
  $PY -c "import sys,torch;print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.backends.cudnn.version())"; } > $R/versions.txt 2>&1
mkdir -p /tmp/te /tmp/megatron && tar xf $C/te/TransformerEngine-v2.17.1.git.tar -C /tmp/te && tar xzf $C/megatron-core.tar.gz -C /tmp/megatron
uv pip install --python $PY --no-index --find-links $C/te/wheels-pydantic "pydantic<2.14" > $R/pydantic.txt 2>&1
export MEGATRON_ENV_MIRROR_TRANSFORMER_ENGINE=/tmp/te/TransformerEngine.git MEGATRON_ENV_SOURCE_FLASH_ATTN=$C/flash_attn-2.8.3.tar.gz \
  MEGATRON_ENV_SOURCE_CUTLASS_HEADERS=$C/te/cutlass-57e3cfb4-include.tar.gz \
  MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_HEADERS=$(ls $C/te/nvidia_cudnn_frontend-1.25.0-*.whl) \
  MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_CMAKE=$C/te/fe-cmake.tar.gz
B="python3 -m invoke build --profile $P --python $PY --cache-dir $K"
( time timeout 400 $B transformer-engine ) > $R/te-cold.txt 2>&1 &
( time timeout 400 $B flash-attn ) > $R/fa-cold.txt 2>&1 &
while sleep 20; do jobs -r | grep -q . || break; save; echo "$(( $(date +%s) - T0 )) s: $(tail -n1 $R/te-cold.txt) | $(tail -n1 $R/fa-cold.txt)"; done
for n in transformer-engine flash-attn; do ( time timeout 60 $B $n ) > $R/$n-hit.txt 2>&1; tail -4 $R/$n-hit.txt; done
tail -5 $R/te-cold.txt $R/fa-cold.txt; save
SP=$($PY -c "import sysconfig;print(sysconfig.get_path('platlib'))")
for so in $SP/flash_attn_2_cuda*.so $SP/transformer_engine/*.so $SP/transformer_engine_torch*.so; do
  [ -f "$so" ] && echo "$(basename $so): basic_ostream exported $(nm -C -D --defined-only $so | grep -c basic_ostream), $(readelf -d $so | grep -o 'libstdc++.so.6' || echo 'NO libstdc++.so.6 NEEDED')"
done | tee $R/libstdcxx.txt
timeout 60 env PYTHONPATH=/tmp/megatron $PY -m torch.distributed.run --nproc_per_node=1 scripts/smoke_train.py --layer-spec transformer_engine --out $R/smoke-te > $R/smoke-te.log 2>&1; echo "exit $?" >> $R/smoke-te.log; tail -3 $R/smoke-te.log; save
echo "gpu checks get $(left) s"
timeout $(left) python3 bench/kernel_build.py flash-attn --python $PY --out $R/fa-gpu --gpu-checks-only 2>&1 | tee $R/fa-gpu.log | tail -40; save
mkdir -p $R/cache; for m in $K/wheels/*/meta.json; do d=$(basename $(dirname $m)); cp $m $R/cache/$d.meta.json; cp -r $(dirname $m)/ninja-logs $R/cache/$d.ninja-logs 2>/dev/null; done
for l in $K/logs/*.log; do gzip -c $l > $R/cache/$(basename $l).gz; done
save; cp $R/fa-gpu/gpu_checks.json $OUT/ 2>/dev/null; cp $R/libstdcxx.txt $OUT/
echo "call2 done in $(( $(date +%s) - T0 )) s"
