#!/usr/bin/env bash
# One GPU: sbatch slurm/ddp_train.sbatch with the run's log in the run directory.
#   slurm/submit-1gpu.sh results/my-experiment/n1 --dataset imdb --preset small --global-batch-size 64 --epochs 3
set -euo pipefail
run_dir=${1:-}
if [ -z "$run_dir" ] || [ "${run_dir#-}" != "$run_dir" ]; then
    echo "usage: $0 RUN_DIR [ddp_core.train options] (the run directory first)" >&2
    exit 2
fi
shift
# The trainer's checks of the options at the job's 1 rank(s), here, before anything is queued or written.
"${DDP_PYTHON:-python3}" -m ddp_core.launch.slurm 1 "$run_dir" "$@"
mkdir -p "$run_dir"
exec sbatch --nodes 1 --gpus-per-node 1 --cpus-per-task 8 --output "$run_dir/slurm-%j.out" \
    "$(dirname "$0")/ddp_train.sbatch" "$run_dir" "$@"
