"""Where a training step's time goes, operator by operator: the trainer's own steps under torch.profiler.

    python -m benchmarks.step_profile                   # into results/step_profile/<device>
    python -m benchmarks.step_profile --steps 30 --results-dir reference

It profiles the trainer's `train_epoch` on one rank, timers off, after an epoch of warm-up.
It writes operators.csv and device.json under RESULTS_DIR/step_profile/<device>, for the book's chapter on one device.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks.single_device import matmul_tflops, measurement_name, new_measurement_folder, synchronize, trainer_epoch
from ddp_core.engine.config import OneLineParser, UsageError, parse_args, positive_int
from ddp_core.engine.data import load_data
from ddp_core.engine.model_cost import training_flops
from ddp_core.engine.model_shape import PRESETS
from ddp_core.engine.run_files import environment, now_iso, save_atomic
from ddp_core.engine.runtime import place_process, resolve_runtime
from ddp_core.paths import RESULTS_DIR
from ddp_core.analysis.step_profile import category
from ddp_core.train import model_config


def options(argv: list[str] | None = None):
    # The default profile's workload. On a GPU, `--preset large --amp bf16 --batch-size 128` is the one worth a look.
    parser = OneLineParser(prog="step_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=20, help="optimizer steps profiled")
    parser.add_argument("--dataset", choices=["imdb", "synthetic"], default="imdb")
    parser.add_argument("--preset", choices=list(PRESETS), default="small")
    parser.add_argument("--amp", choices=["off", "bf16"], default="off")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="samples per step")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=Path(RESULTS_DIR),
        help="the profile goes to RESULTS_DIR/step_profile/<device>",
    )
    return parser.parse_args(argv)


def operator_rows(prof, steps: int, on_gpu: bool) -> pd.DataFrame:
    """One row per operator that spent time of its own, per step, largest first. On a GPU that is the time of the
    kernels it launched, else its time on the CPU."""

    def own_seconds(e) -> float:
        # self time: in the operator itself, not in the operators it calls
        return (e.self_device_time_total if on_gpu else e.self_cpu_time_total) / 1e6 / steps

    # On a GPU each kernel counts once, under the operator that launched it. The profiler also lists each kernel as
    # an event, and a `record_function` range (the optimizer's step) over its kernels: those would count twice.
    def launched_by_an_operator(e) -> bool:
        return e.device_type == DeviceType.CPU and not e.is_user_annotation

    rows = [
        {
            "category": category(e.key),  # `ddp_core.analysis.step_profile.CATEGORIES`
            "operator": e.key,
            "calls_per_step": e.count / steps,
            "self_s_per_step": own_seconds(e),
            "flops_per_step": e.flops / steps,
        }
        for e in prof.key_averages()
        if own_seconds(e) > 0 and (not on_gpu or launched_by_an_operator(e))
    ]
    return pd.DataFrame(rows).sort_values("self_s_per_step", ascending=False, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    try:
        opts = options(argv)
        cfg = parse_args(
            [
                "--dataset",
                opts.dataset,
                "--preset",
                opts.preset,
                "--amp",
                opts.amp,
                "--seq-len",
                "128",
                "--global-batch-size",
                str(opts.batch_size),
                "--train-samples",
                str(opts.batch_size * opts.steps),
                "--eval-samples",
                str(opts.batch_size),
                "--seed",
                "0",
                "--no-timers",
                "--no-progress",
            ],
            world_size=1,
        )
        rt = resolve_runtime(cfg)
        info = environment(rt.device)
        out = new_measurement_folder(opts.results_dir, "step_profile", measurement_name(rt, info, compiled=False))
        data = load_data(cfg)
    except UsageError as exc:
        print(f"step_profile: error: {exc}", file=sys.stderr)
        return 2
    place_process(rt)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if rt.device.type == "cuda" else [])
    with tempfile.TemporaryDirectory() as store:
        dist.init_process_group(rt.backend, init_method=f"file://{store}/group", rank=0, world_size=1)
        try:
            epoch = trainer_epoch(cfg, rt, data, timers=False, in_ddp=False)
            epoch()  # warm-up
            # with_flops: the matrix products' FLOPs, counted from their shapes
            with profile(activities=activities, with_flops=True) as prof:
                synchronize(rt.device)
                start = time.perf_counter()
                epoch()
                synchronize(rt.device)
                seconds = time.perf_counter() - start
        finally:
            dist.destroy_process_group()
    out.mkdir(parents=True, exist_ok=True)
    operator_rows(prof, opts.steps, rt.device.type == "cuda").to_csv(out / "operators.csv", index=False)
    save_atomic(
        info
        | dict(
            command=sys.argv,
            device=str(rt.device),
            threads=torch.get_num_threads(),
            preset=cfg.preset,
            amp=cfg.amp,
            seq_len=cfg.seq_len,
            batch_size=cfg.global_batch_size,
            dataset=cfg.dataset,
            steps=opts.steps,
            step_s=seconds / opts.steps,
            model_flops_per_step=training_flops(vars(model_config(cfg, data.num_classes)), cfg.seq_len)
            * cfg.global_batch_size,
            matmul_tflops=matmul_tflops(rt.device, cfg.amp),  # the rate the model's own products are held against
            measured_on=now_iso(),
        ),
        out / "device.json",
    )
    print(f"step_profile: {seconds / opts.steps * 1e3:.1f} ms a step profiled into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
