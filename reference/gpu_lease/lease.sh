#!/usr/bin/env bash
# One device lease: the GPU session's parts in priority order, each under its own time limit, results tarred.
export PYTHONUNBUFFERED=1 DDP_CORE_DATA_DIR=$PWD/.gpudata
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
R=/tmp/gpu_results; mkdir -p $R
{ date -u; nvidia-smi; nvidia-smi -q | sed -n 1,60p; lscpu | sed -n 1,25p; free -g
  python3 -c "import torch,datasets,pyarrow,fsspec,huggingface_hub as h, pandas; print('torch',torch.__version__,'cuda',torch.version.cuda,'nccl',torch.cuda.nccl.version(),'datasets',datasets.__version__,'pyarrow',pyarrow.__version__,'fsspec',fsspec.__version__,'hub',h.__version__,'pandas',pandas.__version__)"
} > $OUT/machine.txt 2>&1
for part in "profile 75" "measure 180" "trainer 130" "compiled 110"; do
    set -- $part
    echo "== $1 start $(date -u +%T)"
    timeout $2 bash benchmarks/gpu_session.sh $1 $R > $OUT/$1.log 2>&1
    echo "== $1 rc=$? end $(date -u +%T)"
done
tar czf $OUT/results.tgz -C $R .
ls -laR $R | head -80
