"""Command line of `ddp_core.train`: one dataclass, parsed and checked before any work starts.

Every check that needs no data and no process group happens here, so that a bad command fails
in a fraction of a second with one line, before torchrun has started anything expensive and
before a run directory exists.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ddp_core.model import PRESETS

DATASETS = ("imdb", "ag_news", "synthetic")
CHECKPOINT_NAME = "checkpoint.pt"

# Fields that may differ between a run and its `--resume`: they do not change what is trained.
RESUMABLE_CHANGES = ("epochs", "resume", "out", "threads_per_rank", "progress", "check", "data_dir", "cache_dir")


class UsageError(Exception):
    """A mistake in the user's input: reported as one line, never as a traceback."""


@dataclass
class TrainConfig:
    dataset: str = "imdb"
    data_dir: str | None = None
    cache_dir: str | None = None
    preset: str = "small"
    dropout: float | None = None
    vocab_size: int = 20000
    seq_len: int = 256
    train_samples: int | None = None
    eval_samples: int | None = None
    epochs: int = 1
    global_batch_size: int | None = None
    per_rank_batch_size: int | None = None
    grad_accum: int = 1
    lr: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    amp: str = "off"
    seed: int = 0
    backend: str = "auto"
    device: str = "auto"
    threads_per_rank: int | None = None
    timers: bool = True
    out: str | None = None
    resume: bool = False
    progress: bool = True
    check: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="python -m ddp_core.train", description="Train a transformer text classifier with DDP.")
    d = TrainConfig()
    p.add_argument("--dataset", choices=DATASETS, default=d.dataset)
    p.add_argument("--data-dir", default=os.environ.get("DDP_CORE_DATA_DIR") or None,
                   help="local copies as DIR/<dataset>/{train,test}.{csv,csv.gz,parquet,jsonl} (env DDP_CORE_DATA_DIR)")
    p.add_argument("--cache-dir", default=os.environ.get("DDP_CORE_CACHE_DIR") or None,
                   help="where encoded tensors are cached (env DDP_CORE_CACHE_DIR; default ~/.cache/ddp_core)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=d.preset)
    p.add_argument("--dropout", type=float, default=None, help="overrides the preset's dropout")
    p.add_argument("--vocab-size", type=int, default=d.vocab_size)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--train-samples", type=int, default=None, help="seeded random subset of the training split")
    p.add_argument("--eval-samples", type=int, default=None, help="seeded random subset of the evaluation split")
    p.add_argument("--epochs", type=int, default=d.epochs)
    batch = p.add_mutually_exclusive_group(required=True)
    batch.add_argument("--global-batch-size", type=int, help="strong scaling: samples per optimizer step over all ranks")
    batch.add_argument("--per-rank-batch-size", type=int, help="weak scaling: samples per forward pass on each rank")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--amp", choices=("off", "bf16", "fp16"), default=d.amp)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default=d.backend)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device)
    p.add_argument("--threads-per-rank", type=int, default=None, help="default: usable cores / local ranks")
    p.add_argument("--no-timers", dest="timers", action="store_false", help="skip the per-phase timers")
    p.add_argument("--out", default=None, help="run directory (default: a new one under results/)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--check", action="store_true",
                   help="check the arguments and the data (building the token cache), then exit without training")
    return p


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def parse_args(argv: list[str] | None = None, world_size: int | None = None) -> TrainConfig:
    """The checked config; `world_size` defaults to torchrun's WORLD_SIZE (a launcher may check ahead of it)."""
    ns = build_parser().parse_args(argv)
    cfg = TrainConfig(**{f.name: getattr(ns, f.name) for f in fields(TrainConfig)})
    validate(cfg, world_size if world_size is not None else world_size_from_env())
    return cfg


def differing_settings(saved: dict, cfg: TrainConfig) -> list[str]:
    """The options that change what is trained and differ between a saved run's config and `cfg`."""
    now = cfg.to_dict()
    return ["--" + k.replace("_", "-") for k in now if k not in RESUMABLE_CHANGES and saved.get(k) != now[k]]


def micro_batch_size(cfg: TrainConfig, world_size: int) -> int:
    """Samples per forward pass on one rank."""
    if cfg.per_rank_batch_size is not None:
        return cfg.per_rank_batch_size
    return cfg.global_batch_size // (world_size * cfg.grad_accum)


def global_batch_size(cfg: TrainConfig, world_size: int) -> int:
    """Samples per optimizer step over all ranks."""
    return micro_batch_size(cfg, world_size) * world_size * cfg.grad_accum


def validate(cfg: TrainConfig, world_size: int) -> None:
    positive = ["vocab_size", "seq_len", "epochs", "grad_accum", "global_batch_size", "per_rank_batch_size",
                "train_samples", "eval_samples", "threads_per_rank"]
    for name in positive:
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if cfg.warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be >= 0, got {cfg.warmup_steps}")
    if cfg.dropout is not None and not 0.0 <= cfg.dropout < 1.0:
        raise UsageError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.vocab_size < 3:
        raise UsageError(f"--vocab-size must be at least 3 (padding, unknown and one word), got {cfg.vocab_size}")
    if cfg.global_batch_size is not None and cfg.global_batch_size % (world_size * cfg.grad_accum):
        raise UsageError(
            f"--global-batch-size {cfg.global_batch_size} does not divide by world size {world_size} "
            f"x --grad-accum {cfg.grad_accum}")
    if cfg.backend == "nccl" and cfg.device == "cpu":
        raise UsageError("--backend nccl needs --device cuda (or auto); use --backend gloo on CPU")
    if cfg.amp == "fp16" and cfg.device == "cpu":
        raise UsageError("--amp fp16 needs a CUDA device; use --amp bf16 on CPU")
    if cfg.out is not None:
        out = Path(cfg.out)
        if cfg.resume and not (out / CHECKPOINT_NAME).is_file():
            raise UsageError(f"--resume: no checkpoint at {out / CHECKPOINT_NAME}")
        if not cfg.resume and (out / "run.json").exists():
            raise UsageError(f"--out {out} already holds a run; pass --resume to continue it or choose another --out")
    elif cfg.resume:
        raise UsageError("--resume needs --out, the run directory to continue")
