"""Throughput and MFU on one device, and what ddp_core and DDP cost over the plainest PyTorch loop.

    python benchmarks/single_device.py                 # small preset, batch 32, into results/single_device/<device>
    python benchmarks/single_device.py --presets small medium large --batch-sizes 32 128 256 --amp off bf16

It runs in one process, on a GPU where there is one, else on the CPU.
Four loops train their own copy of the same model on the trainer's workload:

    plain        forward, loss, backward, AdamW step, zero_grad: the loop of PyTorch's tutorials
    ddp_core     the trainer's own `train_epoch`, timers off
    timed        the same with the phase timers on, as every run of the report records them
    ddp_of_one   `ddp_core` in DistributedDataParallel, in a process group of one: the cost of its buckets and hooks

The loops take turns epoch by epoch, so that a slow spell of a shared machine falls on all of them alike.
The chapter on one device (book/single_device.md) turns epochs.csv and device.json into throughput, MFU and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from ddp_core.engine.config import (
    OneLineParser,
    UsageError,
    check_writable_folder,
    micro_batch_size,
    parse_args,
    positive_int,
)
from ddp_core.engine.data import EncodedData, load_data
from ddp_core.engine.model import TransformerClassifier
from ddp_core.engine.collectives import CollectiveCensus
from ddp_core.engine.memory import StateCensus
from ddp_core.engine.model_shape import PRESETS
from ddp_core.engine.model_cost import training_flops
from ddp_core.engine.run_files import environment, now_iso, save_atomic
from ddp_core.engine.runtime import Runtime, place_process, resolve_runtime
from ddp_core.engine.stopping import StopRequest
from ddp_core.engine.noise_scale import GradientNoise
from ddp_core.engine.timers import EpochTimer
from ddp_core.paths import RESULTS_DIR
from ddp_core.train import Evaluations, Training, TrainingState, batch_plan, model_config, train_epoch

# The loops of the docstring, in the order of a forward round: epochs.csv names each row's loop.
LOOPS = ("plain", "ddp_core", "timed", "ddp_of_one")


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(prog="single_device", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--presets", nargs="+", choices=list(PRESETS), default=["small"])
    parser.add_argument("--batch-sizes", nargs="+", type=positive_int, default=[32], help="samples per step")
    parser.add_argument("--amp", nargs="+", choices=["off", "bf16"], default=["off"])
    parser.add_argument("--seq-len", type=positive_int, default=128)
    parser.add_argument("--dataset", choices=["synthetic", "imdb"], default="synthetic")
    parser.add_argument("--steps", type=positive_int, default=8, help="optimizer steps per timed epoch")
    parser.add_argument("--rounds", type=positive_int, default=6, help="timed epochs per loop")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="the trainer's loops with --compile (torch.compile); the plain loop stays eager",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=Path(RESULTS_DIR),
        help="the measurement goes to RESULTS_DIR/single_device/<device>[-compiled]",
    )
    return parser.parse_args(argv)


def train_config(opts: argparse.Namespace, preset: str, amp: str, batch: int):
    """The trainer's settings for one configuration: its parser checks them as it checks a run's."""
    return parse_args(
        [
            "--dataset",
            opts.dataset,
            "--preset",
            preset,
            "--amp",
            amp,
            "--device",
            opts.device,
            "--per-rank-batch-size",
            str(batch),
            "--seq-len",
            str(opts.seq_len),
            "--train-samples",
            str(batch * opts.steps),
            "--eval-samples",
            str(batch),
            "--no-progress",
            *(["--compile"] if opts.compile else []),
        ],
        world_size=1,
    )


def measurement_name(rt: Runtime, info: dict, compiled: bool) -> str:
    """The measurement's folder name: `cpu` or `cuda-<gpu>`, and `-compiled` when the trainer ran compiled."""
    device = (
        "cpu"
        if rt.device.type == "cpu"
        else ("cuda-" + "".join(c if c.isalnum() else "-" for c in info["device_name"].lower()).strip("-"))
    )
    return device + ("-compiled" if compiled else "")


def new_measurement_folder(results_dir: Path, kind: str, name: str) -> Path:
    """RESULTS_DIR/KIND/NAME for a new measurement. A folder that already holds one is refused, never overwritten."""
    out = results_dir / kind / name
    check_writable_folder(out, "--results-dir")
    if out.exists() and any(out.iterdir()):
        raise UsageError(
            f"{out} already holds a measurement of this device; remove it to measure again, or choose "
            f"another --results-dir"
        )
    return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_tflops(device: torch.device, amp: str) -> float:
    """The rate of one large matrix product at the loops' precision. It is the ceiling the model's products can
    reach on this device, measured rather than read off a sheet."""
    size = 8192 if device.type == "cuda" else 512
    dtype = torch.bfloat16 if amp == "bf16" else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    seconds = []
    for repeat in range(13):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        if repeat >= 3:
            seconds.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(seconds) / 1e12  # bf16 under autocast, else fp32


def plain_epoch(cfg, rt: Runtime, data: EncodedData):
    """The plainest loop: a fresh permutation, each batch copied to the device, one AdamW step per batch."""
    torch.manual_seed(cfg.seed)
    model = TransformerClassifier(model_config(cfg, data.num_classes)).to(rt.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    batch = micro_batch_size(cfg, 1)

    def epoch():
        order = torch.randperm(len(data.train_labels))
        for step in range(len(order) // batch):
            idx = order[step * batch : (step + 1) * batch]
            ids, labels = data.train_ids[idx].to(rt.device).long(), data.train_labels[idx].to(rt.device)
            with torch.autocast(rt.device.type, dtype=torch.bfloat16, enabled=cfg.amp == "bf16"):
                loss = F.cross_entropy(model(ids).float(), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return epoch


def trainer_epoch(cfg, rt: Runtime, data: EncodedData, timers: bool, in_ddp: bool):
    """The trainer's `train_epoch` as a run calls it, on a model of its own."""
    state = TrainingState.create(cfg, rt, data)
    timer = EpochTimer(rt.device, enabled=timers)
    model = state.model
    if in_ddp:
        model = DistributedDataParallel(model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
    sampler = DistributedSampler(data.train_labels, num_replicas=1, rank=0, shuffle=True, seed=cfg.seed, drop_last=True)
    plan = batch_plan(cfg, rt, data)
    epochs = iter(range(1, sys.maxsize))
    evaluations = Evaluations(state, data, plan, cfg, rt, None)  # none inside the epoch: cfg evaluates at its end
    training = Training(
        cfg=cfg,
        rt=rt,
        state=state,
        ddp_model=model,
        data=data,
        sampler=sampler,
        batch=plan,
        timer=timer,
        noise=GradientNoise(),
        census=StateCensus(model, state.optimizer),
        collectives=CollectiveCensus(False),
        evaluations=evaluations,
        stop=StopRequest(),
        out=None,
    )
    return lambda: train_epoch(training, next(epochs), None)


def measure(cfg, rt: Runtime, rounds: int) -> list[dict]:
    data = load_data(cfg)
    flops_per_sample = training_flops(vars(model_config(cfg, data.num_classes)), cfg.seq_len)
    # ddp_core adds to plain: sampler, host-to-device copies, autocast, scaler, schedule, divergence check
    loops = {
        "plain": plain_epoch(cfg, rt, data),
        "ddp_core": trainer_epoch(cfg, rt, data, False, False),
        "timed": trainer_epoch(cfg, rt, data, True, False),
        "ddp_of_one": trainer_epoch(cfg, rt, data, False, True),
    }
    rows = []
    for round_ in range(-1, rounds):  # round -1 warms every loop up and is not kept
        for loop in LOOPS if round_ % 2 else LOOPS[::-1]:  # ABCD DCBA ...: the order reversed every round
            synchronize(rt.device)
            start = time.perf_counter()
            loops[loop]()
            synchronize(rt.device)
            seconds = time.perf_counter() - start
            if round_ >= 0:
                rows.append(
                    dict(
                        preset=cfg.preset,
                        amp=cfg.amp,
                        batch_size=cfg.per_rank_batch_size,
                        seq_len=cfg.seq_len,
                        vocab_size=cfg.vocab_size,
                        num_classes=data.num_classes,
                        flops_per_sample=flops_per_sample,
                        loop=loop,
                        round=round_,
                        samples=len(data.train_labels),
                        seconds=seconds,
                    )
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    try:
        opts = options(argv)
        configs = [
            train_config(opts, preset, amp, batch)
            for preset in opts.presets
            for amp in opts.amp
            for batch in opts.batch_sizes
        ]
        rt = resolve_runtime(configs[0])
        info = environment(rt.device)
        out = new_measurement_folder(opts.results_dir, "single_device", measurement_name(rt, info, opts.compile))
    except UsageError as exc:
        print(f"single_device: error: {exc}", file=sys.stderr)
        return 2
    place_process(rt)
    out.mkdir(parents=True, exist_ok=True)
    info |= dict(
        device=str(rt.device),
        backend=rt.backend,
        threads=torch.get_num_threads(),
        compile=opts.compile,
        command=sys.argv,
        start_time=now_iso(),
        end_time=None,
        matmul_tflops={amp: matmul_tflops(rt.device, amp) for amp in opts.amp},  # the device's ceilings, at the start
    )
    save_atomic(info, out / "device.json")
    with tempfile.TemporaryDirectory() as store:
        # ddp_of_one's group of one: NCCL on a GPU, gloo on a CPU
        dist.init_process_group(rt.backend, init_method=f"file://{store}/group", rank=0, world_size=1)
        try:
            rows = []
            for cfg in configs:
                print(f"single_device: {cfg.preset}, amp {cfg.amp}, batch {cfg.per_rank_batch_size}", flush=True)
                rows += measure(cfg, rt, opts.rounds)
                # a row per loop and round with its epoch's seconds, written after each configuration
                pd.DataFrame(rows).to_csv(out / "epochs.csv", index=False)
                if rt.device.type == "cuda":
                    torch.cuda.empty_cache()
        finally:
            dist.destroy_process_group()
    save_atomic(info | {"end_time": now_iso()}, out / "device.json")
    print(f"single_device: measured into {out}; the book's chapter on one device shows it (make book)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
