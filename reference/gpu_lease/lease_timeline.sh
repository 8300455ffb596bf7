#!/usr/bin/env bash
# One device lease: the timeline part (the replay forecast's input), results tarred.
export PYTHONUNBUFFERED=1 DDP_CORE_DATA_DIR=$PWD/.gpudata
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
R=/tmp/gpu_results; mkdir -p $R
{ date -u; git rev-parse HEAD; git status --short; nvidia-smi; nvidia-smi -q | sed -n 1,60p; lscpu | sed -n 1,25p; free -g
  python3 -c "import torch,datasets,pyarrow,fsspec,huggingface_hub as h, pandas; print('torch',torch.__version__,'cuda',torch.version.cuda,'nccl',torch.cuda.nccl.version(),'datasets',datasets.__version__,'pyarrow',pyarrow.__version__,'fsspec',fsspec.__version__,'hub',h.__version__,'pandas',pandas.__version__)"
} > $OUT/machine.txt 2>&1
echo "== timeline start $(date -u +%T)"
timeout 330 bash benchmarks/gpu_session.sh timeline $R > $OUT/timeline.log 2>&1
echo "== timeline rc=$? end $(date -u +%T)"
find $R -name checkpoint.pt -delete
tar czf $OUT/results.tgz -C $R .
ls -laR $R | head -60
