#!/usr/bin/env bash
# The measurements behind the report's GPU results, on a machine with one GPU, in parts that each fit a job of
# ten minutes on an H100 (the times below are estimates from the cost model's FLOPs, not readings):
#
#   bash benchmarks/gpu_session.sh trainer  RESULTS_DIR  # every preset, bf16 and fp32, 2 epochs (~2 min)
#   bash benchmarks/gpu_session.sh measure  RESULTS_DIR  # make single-device on every preset, batch 32/128/256 (~4 min)
#   bash benchmarks/gpu_session.sh studies  RESULTS_DIR  # the gpu profile's 1-GPU runs, 3 repeats (~6 min)
#   bash benchmarks/gpu_session.sh compiled RESULTS_DIR  # the large preset, bf16, batch 128, compiled (~4 min)
#   bash benchmarks/gpu_session.sh profile  RESULTS_DIR  # where a step of the large preset in bf16 goes (~1 min)
#   bash benchmarks/gpu_session.sh timeline RESULTS_DIR  # the large preset's step with its buckets' ready moments,
#                                                        # bf16 and fp32, batch 256/128/64/32 (~4 min)
#
# It runs the project from this folder with the python on PATH (or PYTHON), nothing installed: the trainer needs
# torch and datasets, the studies papermill, jupytext, nbclient and ipykernel too. The data come from
# DDP_CORE_DATA_DIR (no internet needed). A part never overwrites what an earlier call measured: the trainer
# reuses a finished run, the runner too, and the benchmarks refuse a folder that holds a measurement.
set -euo pipefail
part=${1:?which part: trainer, measure, studies, compiled, profile or timeline}
results=${2:?the results folder}
python=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

case $part in
trainer)
    for preset in large medium small; do  # the report's workload first, where a job's time runs out
        for amp in bf16 off; do
            args=(--dataset imdb --preset "$preset" --amp "$amp" --device cuda --train-samples 4096 --eval-samples 1024
                  --global-batch-size 64 --epochs 2 --no-progress --out "$results/gpu_trainer/$preset-$amp")
            "$python" -m ddp_core.train "${args[@]}"
        done
    done ;;
measure)
    "$python" benchmarks/single_device.py --results-dir "$results" --presets large medium small \
        --batch-sizes 32 128 256 --amp bf16 off ;;
studies)
    "$python" -m ddp_core.studies.run --study-list notebooks/studies-gpu.yml --world-sizes 1 --results-dir "$results" ;;
compiled)
    "$python" benchmarks/single_device.py --results-dir "$results" --presets large --batch-sizes 128 --amp bf16 \
        --compile ;;
profile)
    "$python" -m benchmarks.step_profile --results-dir "$results" --preset large --amp bf16 --batch-size 128 ;;
timeline)  # one GPU's timeline.csv at each batch a GPU of a cluster would compute: what the replay forecast starts from
    for amp in bf16 off; do
        for batch in 256 128 64 32; do
            "$python" -m ddp_core.train --dataset imdb --preset large --amp "$amp" --device cuda --train-samples 4096 \
                --eval-samples 512 --global-batch-size "$batch" --epochs 2 --no-progress \
                --out "$results/gpu_timeline/large-$amp-b$batch"
        done
    done ;;
*)
    echo "gpu_session.sh: no part '$part' (trainer, measure, studies, compiled, profile or timeline)" >&2
    exit 2 ;;
esac
