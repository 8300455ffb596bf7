"""All-reduce time over message sizes, measured as nccl-tests does, on gloo or NCCL.

    torchrun --nproc-per-node N -m ddp_core.bench.allreduce --out results/report/allreduce-n2

It writes `allreduce.csv` and `allreduce.json`, the provenance, into --out. An existing --out is never overwritten.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_core.engine.config import OneLineParser, TrainConfig, UsageError, check_writable_folder, world_size_from_env
from ddp_core.engine.run_files import environment, now_iso, save_atomic
from ddp_core.engine.runtime import place_process, resolve_runtime
from ddp_core.launch.plan import ALLREDUCE_READY_LINE

COLUMNS = ["size_bytes", "iterations", "time_s", "algbw_GBps", "busbw_GBps", "world_size"]


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of four from min_bytes to max_bytes, whole float32 elements."""
    out, size = [], max(4, min_bytes)
    while size <= max_bytes:
        out.append(size)
        size *= 4
    return out


def time_allreduce(tensor: torch.Tensor, iterations: int) -> float:
    """Mean seconds per all-reduce over `iterations`, as the slowest rank saw it."""
    dist.barrier()
    if tensor.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    if tensor.is_cuda:
        torch.cuda.synchronize()
    elapsed = torch.tensor([(time.perf_counter() - start) / iterations], dtype=torch.float64)
    elapsed = elapsed.to(tensor.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options, checked before any process group starts. The study runner checks the options it will
    pass here before its first run trains."""
    parser = OneLineParser(prog="torchrun ... -m ddp_core.bench.allreduce", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for allreduce.csv and allreduce.json")
    parser.add_argument("--min-bytes", type=int, default=4)
    parser.add_argument("--max-bytes", type=int, default=256 * 2**20)
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        metavar="BYTES",
        help="time exactly these sizes (e.g. a model's gradient buckets) instead of powers of four",
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seconds-per-size", type=float, default=0.3, help="time budget that sets the iterations")
    opts = parser.parse_args(argv)
    if opts.warmup < 1 or opts.seconds_per_size <= 0:
        raise UsageError("--warmup needs at least 1 iteration and --seconds-per-size a time above 0")
    if any(size < 4 for size in opts.sizes or []):
        raise UsageError("--sizes are bytes of float32 elements: at least 4 each")
    if not (opts.sizes or sizes(opts.min_bytes, opts.max_bytes)):
        raise UsageError(f"no size to time from --min-bytes {opts.min_bytes} to --max-bytes {opts.max_bytes}")
    out = Path(opts.out)
    check_writable_folder(out, "--out")
    if (out / "allreduce.csv").exists():
        raise UsageError(f"{out / 'allreduce.csv'} exists; choose another --out")
    return opts


def main(argv: list[str] | None = None) -> int:
    world_size = world_size_from_env()
    try:
        opts = parse_args(argv)
        if world_size < 2:
            raise UsageError("run it under torchrun with at least 2 processes")
    except UsageError as exc:
        print(f"bench_allreduce: error: {exc}", file=sys.stderr)
        return 2
    out = Path(opts.out)
    rt = resolve_runtime(TrainConfig())  # the trainer's own choice of device, backend and threads
    place_process(rt)
    device = rt.device
    dist.init_process_group(rt.backend)
    leader = dist.get_rank() == 0
    dist.barrier()
    if leader:  # every rank has started: an emulated cluster sets its nodes' CPU shares now
        print(ALLREDUCE_READY_LINE, flush=True)
    rows = []
    try:
        # Per size S, bytes of float32 gradient: warm-up, then the slowest rank's mean time t of one all_reduce.
        for size in opts.sizes or sizes(opts.min_bytes, opts.max_bytes):
            tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
            probe = time_allreduce(tensor, opts.warmup)
            iterations = max(3, min(1000, int(opts.seconds_per_size / max(probe, 1e-7))))
            seconds = time_allreduce(tensor, iterations)
            # nccl-tests' bandwidths (doc/PERFORMANCE.md): algbw = S / t and busbw = algbw * 2(N-1)/N.
            algbw = size / seconds / 1e9
            rows.append(
                dict(
                    size_bytes=size,
                    iterations=iterations,
                    time_s=seconds,
                    algbw_GBps=algbw,
                    busbw_GBps=algbw * 2 * (world_size - 1) / world_size,
                    world_size=world_size,
                )
            )
            if leader:
                print(
                    f"{size:>12d} B  {seconds * 1e6:12.1f} us  algbw {algbw:8.3f} GB/s  "
                    f"busbw {rows[-1]['busbw_GBps']:8.3f} GB/s",
                    flush=True,
                )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if leader:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "allreduce.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        save_atomic(
            {
                "world_size": world_size,
                "backend": rt.backend,
                "device": str(device),
                "end_time": now_iso(),
                **environment(device),
            },
            out / "allreduce.json",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
