"""The settings of a training run: one typed, documented field each, from which everything else derives.

`TrainConfig` is the single source of every setting's default, allowed values and meaning. Every check that needs no
data and no process group happens here, so a bad command fails at once with one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

import yaml

from ddp_core.paths import REPO_ROOT

CHECKPOINT_NAME = "checkpoint.pt"
PROFILES_DIR = REPO_ROOT / "notebooks" / "profiles"


class UsageError(Exception):
    """A mistake in the user's input: reported as one line, never as a traceback."""


# A dataset with one labelled split (AG News offline: its test split) is split into training and evaluation parts,
# this fraction for evaluation. Here and not in data.py, which needs torch, so that the book quotes it without it.
EVAL_FRACTION_WHEN_UNSPLIT = 0.2
SYNTHETIC_MIN_VOCAB = 5  # the generated task's ids: padding, unknown, a keyword for each of its 2 classes, a word
FSDP_MODES = ("zero2", "zero3")  # the --sharding modes FSDP2 does (ddp_core/engine/sharding.py); the others are DDP's
ERROR_PREFIX = "ddp_core.train: error:"  # starts the trainer's one line; the launchers look for it in the output


def setting(default, help: str, *, resumable: bool = False, env: str | None = None, group: str | None = None):
    """A field of `TrainConfig`, with its help text. A resumable one may differ between a run and its `--resume`,
    since it does not change what is trained."""
    # env: the environment variable that supplies the command line's default.
    # group: settings of one group are mutually exclusive, and exactly one of them is required.
    return field(default=default, metadata=dict(help=help, resumable=resumable, env=env, group=group))


# The trainer's command line is generated from TrainConfig (`build_parser`). The profiles in notebooks/profiles/
# name its fields and are checked against them (`load_profile`). The book's methods chapter prints what a run used.
@dataclass
class TrainConfig:
    dataset: Literal["imdb", "ag_news", "synthetic"] = setting("imdb", "which data to classify")
    data_dir: str | None = setting(
        None,
        "local copies as DIR/<dataset>/{train,test}.{csv,csv.gz,parquet,jsonl}; none: the Hugging Face Hub",
        resumable=True,
        env="DDP_CORE_DATA_DIR",
    )
    cache_dir: str | None = setting(
        None, "where encoded tensors are cached (default ~/.cache/ddp_core)", resumable=True, env="DDP_CORE_CACHE_DIR"
    )
    preset: Literal["tiny", "small", "medium", "large"] = setting("small", "model size (ddp_core/engine/model.py)")
    dropout: float | None = setting(None, "overrides the preset's dropout")
    vocab_size: int = setting(20000, "words in the vocabulary, padding and unknown included")
    seq_len: int = setting(256, "tokens per sample: longer texts are cut, shorter ones padded")
    train_samples: int | None = setting(None, "seeded random subset of the training split (none: all of it)")
    eval_samples: int | None = setting(None, "seeded random subset of the evaluation split (none: all of it)")
    epochs: int = setting(1, "passes over the training samples", resumable=True)
    eval_every_steps: int | None = setting(
        None,
        "also evaluate every this many optimizer steps (counted over the run) inside epochs; every evaluation is "
        "a row of evals.csv, and its time is left out of the epoch's and the steps' times",
        resumable=True,
    )
    target_accuracy: float | None = setting(
        None,
        "end the run at the first evaluation whose validation accuracy reaches this (inside an epoch with "
        "--eval-every-steps, else at an epoch's end); none: train every epoch",
    )
    global_batch_size: int | None = setting(
        None, "strong scaling: samples per optimizer step over all ranks", group="batch"
    )
    per_rank_batch_size: int | None = setting(
        None, "weak scaling: samples per forward pass on each rank", group="batch"
    )
    grad_accum: int = setting(1, "micro-batches per optimizer step (gradient accumulation)")
    lr: float = setting(1e-3, "peak learning rate of AdamW")
    warmup_steps: int = setting(50, "optimizer steps of linear warm-up before the 1/sqrt(step) decay")
    weight_decay: float = setting(0.01, "AdamW's decoupled weight decay")
    amp: Literal["off", "bf16", "fp16"] = setting("off", "autocast precision of forward and backward")
    seed: int = setting(0, "seeds the subset, the shuffle, the initial weights and dropout")
    bucket_cap_mb: float | None = setting(
        None,
        "DDP's gradient bucket size in MiB (none: PyTorch's 25, after a first bucket of 1); a bucket larger than "
        "the model leaves backward nothing to overlap with the all-reduce",
    )
    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = setting(
        "none",
        "what DDP sends: fp32 gradients (none), gradients rounded to 16 bits (fp16, bf16: NCCL only), or "
        "PowerSGD's low-rank factors (--powersgd-rank; on gloo in one gradient bucket)",
    )
    powersgd_rank: int = setting(
        1, "rank of PowerSGD's approximation of each gradient matrix (with --comm-hook powersgd)"
    )
    sharding: Literal["none", "zero1", "zero2", "zero3"] = setting(
        "none",
        "what each rank keeps of the model's state: all of it (none, DDP), a 1/N shard of the optimizer's "
        "state (zero1: DDP with ZeroRedundancyOptimizer), of the gradients too (zero2: FSDP2 keeping the "
        "parameters between forward and backward), or of the parameters as well (zero3: FSDP2)",
    )
    backend: Literal["auto", "nccl", "gloo"] = setting("auto", "process-group backend (auto: nccl on GPUs, else gloo)")
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto: a GPU per local rank when there are enough")
    threads_per_rank: int | None = setting(
        None, "CPU threads per rank (none: usable cores / local ranks)", resumable=True
    )
    compile: bool = setting(
        False,
        "compile the model with torch.compile: slower first steps, then fused kernels "
        "and fewer launches (meant for GPUs)",
        resumable=True,
    )
    timers: bool = setting(True, "time each phase and the all-reduce (--no-timers skips them)")
    count_collectives: bool = setting(
        False,
        "count the bytes the run's third step hands to each collective (ddp_core/engine/collectives.py: a "
        "dispatch mode, which slows that step several times over): run.json's collectives_per_step",
    )
    noise_scale: bool = setting(
        True,
        "measure the gradient noise scale from each step's gradient before and after the all-reduce, on 2 or "
        "more ranks (ddp_core/engine/noise_scale.py; --no-noise-scale skips it)",
        resumable=True,
    )
    checkpoint_every_steps: int | None = setting(
        None,
        "also checkpoint every this many optimizer steps, inside epochs, so that a stopped or failed run loses "
        "at most that many steps (none: at the end of each epoch, and when the run is told to stop)",
        resumable=True,
    )
    out: str | None = setting(None, "run directory (none: a new one under results/)", resumable=True)
    mlflow_uri: str | None = setting(
        None,
        "also log the run to MLflow at this tracking URI, e.g. file:./mlruns "
        "(needs pip install 'ddp_core[mlflow]'); none: no tracking",
        resumable=True,
    )
    resume: bool = setting(
        False,
        "continue the run in --out from its last checkpoint, --epochs grown too (an "
        "unfinished run continues with its own command alone)",
        resumable=True,
    )
    progress: bool = setting(True, "a progress bar on rank 0 (--no-progress hides it)", resumable=True)
    check: bool = setting(
        False, "check the arguments and the data (building the token cache), then exit without training", resumable=True
    )

    def to_dict(self) -> dict:
        return asdict(self)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose mistakes are a UsageError (one line), not usage text and an exit."""

    def error(self, message: str):
        raise UsageError(message)


def positive_int(text: str) -> int:
    """A count of at least 1, for the benchmarks' options (argparse names the option and the value refused)."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _value_type(annotation) -> tuple[type, tuple | None]:
    """(type, choices) of a field. The type of `int | None` is int, and a Literal's values are its choices."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return type(args[0]), tuple(args)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return _value_type(args[0])
    return annotation, None


def build_parser() -> argparse.ArgumentParser:
    """The command line of `ddp_core.train`, one option per field of `TrainConfig`."""
    parser = OneLineParser(prog="python -m ddp_core.train", description="Train a transformer text classifier with DDP.")
    hints = typing.get_type_hints(TrainConfig)
    groups = {}
    for f in fields(TrainConfig):
        meta, default = f.metadata, f.default
        if meta["env"]:
            default = os.environ.get(meta["env"]) or default
        help_text = meta["help"] + (f" (env {meta['env']})" if meta["env"] else "")
        if hints[f.name] is bool:
            if default:
                parser.add_argument(
                    "--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false", help=help_text
                )
            else:
                parser.add_argument(_flag(f.name), action="store_true", help=help_text)
            continue
        value_type, choices = _value_type(hints[f.name])
        target = parser
        if meta["group"]:
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_mutually_exclusive_group(required=True)
            target = groups[meta["group"]]
        target.add_argument(_flag(f.name), type=value_type, choices=choices, default=default, help=help_text)
    return parser


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def parse_args(argv: list[str] | None = None, world_size: int | None = None) -> TrainConfig:
    """The checked config. `world_size` defaults to torchrun's WORLD_SIZE, since a launcher may check ahead of it."""
    ns = build_parser().parse_args(argv)
    cfg = TrainConfig(**{f.name: getattr(ns, f.name) for f in fields(TrainConfig)})
    validate(cfg, world_size if world_size is not None else world_size_from_env())
    return cfg


def to_args(settings: dict) -> list[str]:
    """The command line that sets `settings`, field name -> value. The boolean fields become switches."""
    by_name = {f.name: f for f in fields(TrainConfig)}
    args = []
    for name, value in settings.items():
        if name not in by_name:
            raise UsageError(
                f"unknown setting {name!r}; the settings are the fields of TrainConfig: {', '.join(by_name)}"
            )
        default = by_name[name].default
        if isinstance(default, bool):
            if value != default:
                args.append(_flag(name) if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            args += [_flag(name), str(value)]
    return args


def load_profile(profile: str | Path) -> dict:
    """The settings of a profile: a name in notebooks/profiles/, or the path of a YAML file of TrainConfig fields."""
    path = Path(profile)
    if path.suffix not in (".yml", ".yaml"):
        path = PROFILES_DIR / f"{profile}.yml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yml")))
        raise UsageError(f"no profile {profile!r} (no file {path}); the profiles are: {known}")
    settings = yaml.safe_load(path.read_text()) or {}
    if not isinstance(settings, dict):
        raise UsageError(f"{path}: a profile is a mapping of setting: value")
    to_args(settings)  # refuses unknown names
    return settings


def differing_settings(saved: dict, cfg: TrainConfig) -> list[str]:
    """The options that change what is trained and differ between a saved run's config and `cfg`. A setting that
    a run saved before it existed had its default then."""
    now = cfg.to_dict()
    return [
        _flag(f.name)
        for f in fields(TrainConfig)
        if not f.metadata["resumable"] and saved.get(f.name, f.default) != now[f.name]
    ]


def micro_batch_size(cfg: TrainConfig, world_size: int) -> int:
    """Samples per forward pass on one rank."""
    if cfg.per_rank_batch_size is not None:
        return cfg.per_rank_batch_size
    return cfg.global_batch_size // (world_size * cfg.grad_accum)


def global_batch_size(cfg: TrainConfig, world_size: int) -> int:
    """Samples per optimizer step over all ranks."""
    return micro_batch_size(cfg, world_size) * world_size * cfg.grad_accum


def steps_per_epoch(cfg: TrainConfig, world_size: int, train_samples: int) -> int:
    """Optimizer steps in one pass over `train_samples`, every step full. It refuses a run that makes no step, or
    whose checkpoint interval is longer than the run."""
    steps = train_samples // world_size // micro_batch_size(cfg, world_size) // cfg.grad_accum
    if steps == 0:
        raise UsageError(
            f"{train_samples} training samples make no full step of global batch {global_batch_size(cfg, world_size)}"
        )
    # Such a run would never checkpoint inside an epoch, which the interval asks for.
    if cfg.checkpoint_every_steps is not None and cfg.checkpoint_every_steps >= steps * cfg.epochs:
        raise UsageError(
            f"--checkpoint-every-steps {cfg.checkpoint_every_steps} is not shorter than the run "
            f"({cfg.epochs} epoch(s) of {steps} steps): choose fewer steps, or leave it unset to "
            f"checkpoint at each epoch's end"
        )
    return steps


def check_writable_folder(folder: Path, option: str) -> None:
    """`folder` is, or can be created as, a directory this process may write in."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{option} {folder} is a file, not a directory")
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"{option} {folder} cannot be made: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {folder} cannot be written (no write permission in {existing})")


def validate(cfg: TrainConfig, world_size: int) -> None:
    # Before torchrun has started anything expensive and before a run directory exists: a bad command fails in a
    # fraction of a second.
    positive = [
        "vocab_size",
        "seq_len",
        "epochs",
        "eval_every_steps",
        "grad_accum",
        "global_batch_size",
        "per_rank_batch_size",
        "train_samples",
        "eval_samples",
        "threads_per_rank",
        "bucket_cap_mb",
        "powersgd_rank",
        "checkpoint_every_steps",
    ]
    for name in positive:
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise UsageError(f"{_flag(name)} must be positive, got {value}")
    if cfg.warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be >= 0, got {cfg.warmup_steps}")
    if not (math.isfinite(cfg.lr) and cfg.lr > 0):
        raise UsageError(f"--lr must be a finite number above 0, got {cfg.lr}")
    if not (math.isfinite(cfg.weight_decay) and cfg.weight_decay >= 0):
        raise UsageError(f"--weight-decay must be a finite number >= 0, got {cfg.weight_decay}")
    if cfg.target_accuracy is not None and not 0.0 < cfg.target_accuracy <= 1.0:
        raise UsageError(f"--target-accuracy must be in (0, 1], got {cfg.target_accuracy}")
    if cfg.dropout is not None and not 0.0 <= cfg.dropout < 1.0:
        raise UsageError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.vocab_size < 3:
        raise UsageError(f"--vocab-size must be at least 3 (padding, unknown and one word), got {cfg.vocab_size}")
    if cfg.dataset == "synthetic" and cfg.vocab_size < SYNTHETIC_MIN_VOCAB:
        raise UsageError(
            f"--vocab-size must be at least {SYNTHETIC_MIN_VOCAB} for --dataset synthetic (padding, "
            f"unknown, a keyword per class and one neutral word), got {cfg.vocab_size}"
        )
    if cfg.global_batch_size is not None and cfg.global_batch_size % (world_size * cfg.grad_accum):
        raise UsageError(
            f"--global-batch-size {cfg.global_batch_size} does not divide by world size {world_size} "
            f"x --grad-accum {cfg.grad_accum}"
        )
    if cfg.backend == "nccl" and cfg.device == "cpu":
        raise UsageError("--backend nccl needs --device cuda (or auto); use --backend gloo on CPU")
    if cfg.comm_hook == "bf16" and (cfg.backend == "gloo" or cfg.device == "cpu"):
        raise UsageError(
            "--comm-hook bf16 needs NCCL (DDP accepts its bf16 hook on no other backend); use --comm-hook fp16 on CPU"
        )
    if cfg.sharding != "none":
        refusals = [
            (cfg.comm_hook != "none", f"does not combine with --comm-hook {cfg.comm_hook} (leave it none)"),
            (cfg.amp == "fp16", "does not combine with --amp fp16, whose loss scaler is not sharded (use bf16)"),
            (cfg.compile and cfg.sharding != "zero1", "does not combine with --compile (FSDP2 here runs eager)"),
            (world_size == 1, "needs 2 or more ranks: one rank holds the whole state whatever the mode"),
        ]
        for refused, why in refusals:
            if refused:
                raise UsageError(f"--sharding {cfg.sharding} {why}")
    if cfg.amp == "fp16" and cfg.device == "cpu":
        raise UsageError("--amp fp16 needs a CUDA device; use --amp bf16 on CPU")
    if cfg.train_samples is not None:
        steps_per_epoch(cfg, world_size, cfg.train_samples)
    if cfg.mlflow_uri and importlib.util.find_spec("mlflow") is None:
        raise UsageError("--mlflow-uri needs MLflow: pip install 'ddp_core[mlflow]' (or leave tracking off)")
    if cfg.cache_dir is not None and cfg.dataset != "synthetic":
        check_writable_folder(Path(cfg.cache_dir), "--cache-dir")
    if cfg.out is not None:
        check_run_dir(cfg, world_size)
    elif cfg.resume:
        raise UsageError("--resume needs --out, the run directory to continue")


def check_run_dir(cfg: TrainConfig, world_size: int) -> None:
    """A new run needs a directory that holds no other run. A resumed one needs its checkpoint and, once finished,
    more epochs. The same command continues its own unfinished run."""
    out = Path(cfg.out)
    check_writable_folder(out, "--out")
    trained = finished_epochs(out)
    # Resuming a finished run with no more epochs would train nothing, yet write its run.json and its machine record
    # anew.
    if cfg.resume and trained is not None and cfg.epochs <= trained:
        raise UsageError(
            f"--resume: {out} holds a finished run of {trained} epoch(s), which --epochs {cfg.epochs} "
            f"would not add to; raise --epochs to train it further"
        )
    if cfg.resume and not (out / CHECKPOINT_NAME).is_file():
        raise UsageError(
            f"--resume: no checkpoint at {out / CHECKPOINT_NAME} (the run completed no step); "
            f"run the command without --resume to start it again"
        )
    if cfg.resume or not ((out / "run.json").exists() or (out / "metrics.csv").exists()):
        return
    # A run stopped by a time limit, requeued by Slurm or restarted by torchrun runs its command again. It continues
    # from its last checkpoint, or from the start if it stopped before any.
    if not is_unfinished(out, cfg, world_size):
        raise UsageError(f"--out {out} already holds a run; pass --resume to continue it or choose another --out")


def finished_epochs(out: Path) -> int | None:
    """The epochs a finished run in `out` asked for, or None where it holds no finished run."""
    try:
        info = json.loads((out / "run.json").read_text())
        return info["config"]["epochs"] if info["end_time"] else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def continues_run(cfg: TrainConfig) -> bool:
    """Whether this run continues one from its checkpoint: asked to with --resume, or its own unfinished run."""
    # Without --resume, a checkpoint is of this run's own unfinished run: `check_run_dir` let it through.
    return cfg.resume or (cfg.out is not None and (Path(cfg.out) / CHECKPOINT_NAME).is_file())


def is_unfinished(out: Path, cfg: TrainConfig, world_size: int) -> bool:
    """Whether `out` holds this very run (same settings and world size), stopped before its end."""
    try:
        info = json.loads((out / "run.json").read_text())
        return info["world_size"] == world_size and not info["end_time"] and not differing_settings(info["config"], cfg)
    except (OSError, ValueError, KeyError, TypeError):
        return False
