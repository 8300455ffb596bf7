"""A test fixture only, never results: a study's CPU runs relabelled as the runs of one node of GPUs over NCCL, as
run.json and allreduce.json write them there. The pages' words must follow these labels; no machine here has GPUs."""

import json
import shutil
from pathlib import Path

GPU_NAME = "NVIDIA A100-SXM4-80GB"
ON_A_GPU_NODE = {
    "backend": "nccl",
    "device_name": GPU_NAME,
    "cuda": "12.4",
    "nccl": "2.21.5",
    "gpu_driver": "550.54.15",
    "cpu_count": 64,
    "hostname": "gpu01",
}


def as_gpu_runs(study: Path, dest: Path) -> Path:
    """A copy of `study` (n1/, n2/, ..., allreduce-n2/, ...) whose runs and benchmarks say they ran on GPUs."""
    shutil.copytree(study, dest, symlinks=True)
    for path in [*dest.glob("*/run.json"), *dest.glob("*/allreduce.json")]:
        info = json.loads(path.read_text()) | ON_A_GPU_NODE
        info["device"] = "cuda:0"
        if "local_world_size" in info:
            info["local_world_size"] = info["world_size"]
            info["config"]["device"] = "cuda"
        path.write_text(json.dumps(info, indent=2))
    return dest
