"""Train a transformer text classifier with DistributedDataParallel, one row of metrics per epoch.

    python -m ddp_core.train --dataset imdb --global-batch-size 64                      # 1 process
    torchrun --nproc-per-node 4 -m ddp_core.train --dataset imdb --global-batch-size 64 # 4 ranks

Read `run` first: it is the whole job, one named step per line, and the steps follow in the order it calls them.
The parts they use live in `ddp_core/engine/`. A stopped run continues exactly when given the same command again.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

from ddp_core.engine.config import (
    CHECKPOINT_NAME,
    ERROR_PREFIX,
    FSDP_MODES,
    TrainConfig,
    UsageError,
    continues_run,
    differing_settings,
    global_batch_size,
    micro_batch_size,
    parse_args,
    steps_per_epoch,
)
from ddp_core.engine.data import EncodedData, load_data
from ddp_core.engine.model import TransformerClassifier, count_parameters
from ddp_core.engine.model_cost import bucket_indices
from ddp_core.engine.model_shape import ModelConfig
from ddp_core.engine.noise_scale import GradientNoise, noise_scale
from ddp_core.engine.run_files import (
    EVALS_COLUMNS,
    METRICS_COLUMNS,
    NOISE_COLUMNS,
    STEPS_COLUMNS,
    TIMELINE_COLUMNS,
    append_rows,
    drop_rows_after,
    MachineClock,
    environment,
    link_sent_bytes,
    machine_activity,
    now_iso,
    save_atomic,
)
from ddp_core.engine.runtime import Runtime, place_process, resolve_runtime
from ddp_core.engine.collectives import CollectiveCensus
from ddp_core.engine.memory import StateCensus
from ddp_core.engine.sharding import adamw, is_fsdp, load_whole_state, shard_model, whole_state
from ddp_core.engine.stopping import StopRequest, Stopped
from ddp_core.engine.timers import EpochTimer
from ddp_core.engine.tracking import NoTracker, tracker
from ddp_core.launch.plan import LAUNCHER_VARIABLE, RUN_FINISHED_LINE


def main(argv: list[str] | None = None) -> int:
    leader = int(os.environ.get("RANK", "0")) == 0  # every rank meets the same error or stop; one says it
    try:
        with StopRequest() as stop:  # first: a signal while the run starts is a request to stop too
            cfg = parse_args(argv)
            train(cfg, stop)
    except UsageError as exc:
        if leader:
            print(f"{ERROR_PREFIX} {exc}", file=sys.stderr)
        return 2
    except Stopped as exc:
        if leader:
            print(f"ddp_core: {exc}; continue the run with: {continue_command(argv, cfg, exc.run_dir)}", flush=True)
        return exc.exit_code
    return 0


def continue_command(argv: list[str] | None, cfg: TrainConfig, run_dir: Path) -> str:
    """The command that continues a stopped run, on one line, launched as before."""
    # The arguments as given, plus the run directory where they named none: without it they would start another run.
    args = [*(sys.argv[1:] if argv is None else argv), *([] if cfg.out else ["--out", str(run_dir)])]
    world, local = (int(os.environ.get(name, "1")) for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"))
    rendezvous = ["--standalone"] if world == local else [f"--nnodes={world // local}", "..."]  # ...: no rank knows it
    torchrun = os.environ.get(LAUNCHER_VARIABLE, "torchrun")  # ddp-torchrun sets it (ddp_core.launch.torchrun)
    launch = [torchrun, *rendezvous, f"--nproc-per-node={local}"] if world > 1 else ["python"]  # this node's ranks
    return shlex.join([*launch, "-m", "ddp_core.train", *args])


def train(cfg: TrainConfig, stop: StopRequest) -> None:
    rt = resolve_runtime(cfg)
    place_process(rt)
    if rt.distributed:  # one rank has no process group: the plain baseline that speedups are measured against
        init_process_group(rt)
    stop.join(rt)
    try:
        run(cfg, rt, stop)
        if rt.distributed:
            dist.barrier()  # no rank tears gloo down while a peer is still talking to it
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def init_process_group(rt: Runtime) -> None:
    """The process group, its keys in the store kept apart per torchrun attempt."""
    # A restart after a failure gets the failed attempt's store, where the dead ranks' addresses still stand (torch
    # 2.13). gloo would connect to them and fail ("Connection refused"), and the restart with it.
    store, rank, world_size = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(
        rt.backend, store=dist.PrefixStore(f"ddp_core/attempt{attempt}", store), rank=rank, world_size=world_size
    )


def run(cfg: TrainConfig, rt: Runtime, stop: StopRequest) -> None:
    data = load_data(cfg, rt.local_rank)
    batch = batch_plan(cfg, rt, data)
    state = TrainingState.create(cfg, rt, data)
    if cfg.check:
        return report_check(state, data, rt)
    resuming = continues_run(cfg)
    first_epoch, progress = restore_checkpoint(state, cfg, rt) if resuming else (1, None)
    out, run_info, track = (
        open_run_dir(cfg, rt, state, first_epoch, batch, resuming) if rt.leader else (None, None, NoTracker())
    )
    timer = EpochTimer(rt.device, enabled=cfg.timers, communication=cfg.sharding not in FSDP_MODES)
    noise = GradientNoise()
    ddp_model = wrap_ddp(state.model, cfg, rt, timer, noise)
    sampler = DistributedSampler(
        data.train_labels, num_replicas=rt.world_size, rank=rt.rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    evaluations = Evaluations(state, data, batch, cfg, rt, out)
    census = StateCensus(ddp_model, state.optimizer)
    training = Training(
        cfg=cfg,
        rt=rt,
        state=state,
        ddp_model=ddp_model,
        data=data,
        sampler=sampler,
        batch=batch,
        timer=timer,
        noise=noise,
        census=census,
        collectives=CollectiveCensus(cfg.count_collectives),
        evaluations=evaluations,
        stop=stop,
        out=out,
    )
    started = MachineClock.now()
    for epoch in range(first_epoch, cfg.epochs + 1):
        sent_before = link_sent_bytes()
        done = train_epoch(training, epoch, progress)
        sent = link_sent_bytes() - sent_before
        progress = None  # only the first epoch of a resumed run continues from a checkpoint's progress
        stop_if_diverged(epoch, done.first_bad_step, batch, rt)
        if done.steps == batch.steps:  # else the epoch ended at the target, just evaluated
            evaluations.run(epoch)
        val_loss, val_accuracy, _ = evaluations.last
        row = metrics_row(training, epoch, done, sent)
        step_rows = steps_rows(epoch, done.step_times, rt)
        snapshot = state.checkpoint(epoch, cfg, rt)  # every epoch's end
        if rt.leader:
            append_rows(out / "metrics.csv", [row], METRICS_COLUMNS)
            append_rows(out / "steps.csv", step_rows, STEPS_COLUMNS)
            track.log_epoch(row)
            save_atomic(snapshot, out / CHECKPOINT_NAME)
            print(
                f"ddp_core: epoch {epoch}: train_loss {row['train_loss']:.4f} val_loss {val_loss:.4f} "
                f"val_accuracy {val_accuracy:.4f} {row['samples_per_s']:.1f} samples/s",
                flush=True,
            )
        if evaluations.reached_target():
            if rt.leader:
                print(
                    f"ddp_core: validation accuracy {val_accuracy:.4f} reached the target {cfg.target_accuracy} "
                    f"after {state.scheduler.last_epoch} steps: the run ends",
                    flush=True,
                )
            break
    ended = MachineClock.now()
    run_cpu_s = all_reduce({"cpu_s": ended.process_s - started.process_s}, dist.ReduceOp.SUM, rt)["cpu_s"]
    if rt.leader:
        if timer.median_step_timeline:
            (out / "timeline.csv").unlink(missing_ok=True)
            append_rows(out / "timeline.csv", timer.median_step_timeline, TIMELINE_COLUMNS)
        save_atomic(
            run_info
            | {
                "end_time": now_iso(),
                "allreduces_per_step": timer.allreduces_in_last_step(),
                "collectives_per_step": training.collectives.counted,
                "machine": machine_activity(started, ended, run_cpu_s),
            },
            out / "run.json",
        )
        track.finish()
        print(RUN_FINISHED_LINE, flush=True)


@dataclass
class BatchPlan:
    micro: int  # samples per forward pass on one rank
    global_batch: int  # samples per optimizer step over all ranks
    steps: int  # optimizer steps per epoch


def batch_plan(cfg: TrainConfig, rt: Runtime, data: EncodedData) -> BatchPlan:
    return BatchPlan(
        micro_batch_size(cfg, rt.world_size),
        global_batch_size(cfg, rt.world_size),
        steps_per_epoch(cfg, rt.world_size, len(data.train_labels)),
    )


@dataclass
class EpochProgress:
    """This rank's part of an epoch so far: steps, partial sums of its metrics and its random state. A mid-epoch
    checkpoint holds one per rank, so each resumes as if it had never stopped."""

    steps: int = 0
    loss_sum: float = 0.0  # summed training loss of this rank's samples
    first_bad_step: int | None = None  # the first step whose loss was not finite
    seconds: float = 0.0  # wall time of the steps done (and of the checkpoints written among them)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase, as EpochTimer.summary gives them
    step_times: dict[str, list[float]] = field(default_factory=lambda: {"step_time_s": [], "comm_exposed_s": []})
    grad_sq: tuple[float, float] = (0.0, 0.0)  # summed squared norms of this rank's and the averaged gradients
    rng: dict | None = None  # the generators' states after the last step done; None: the epoch's seed
    resumes: int = 0  # times the epoch continued from a mid-epoch checkpoint

    def then(
        self,
        steps: int,
        loss_sum: torch.Tensor,
        first_bad_step: torch.Tensor,
        seconds: float,
        timed,
        grad_sq: tuple[float, float],
        rng: dict | None = None,
    ) -> EpochProgress:
        """This progress followed by what the current attempt did since it began."""
        phases, step_times = timed  # the timer's summary; `grad_sq` holds the gradient noise sums
        return EpochProgress(
            steps,
            loss_sum.item(),
            int(first_bad_step.item()),
            self.seconds + seconds,
            {name: self.phases.get(name, 0.0) + value for name, value in phases.items()},
            {name: self.step_times[name] + values for name, values in step_times.items()},
            tuple(a + b for a, b in zip(self.grad_sq, grad_sq)),
            rng,
            self.resumes,
        )


class Evaluations:
    """Evaluations on the evaluation set, each a row of evals.csv. They come at every epoch's end and every
    --eval-every-steps steps, until one reaches --target-accuracy and the run ends."""

    def __init__(
        self, state: TrainingState, data: EncodedData, batch: BatchPlan, cfg: TrainConfig, rt: Runtime, out: Path | None
    ):
        self.state, self.data, self.batch, self.cfg, self.rt, self.out = state, data, batch, cfg, rt, out
        self.last = None  # (loss, accuracy, seconds) of the last evaluation

    def due(self) -> bool:
        """Whether the optimizer step just taken is one --eval-every-steps asks an evaluation after."""
        every = self.cfg.eval_every_steps
        return every is not None and self.state.scheduler.last_epoch % every == 0

    def run(self, epoch: int) -> float:
        """Evaluate now, record it and return the seconds it took. All ranks get the same accuracy, so they agree on
        the target without another message."""
        start = time.perf_counter()
        val_loss, val_accuracy = evaluate(self.state.model, self.data, self.batch.micro, self.rt, self.state.autocast)
        self.last = (val_loss, val_accuracy, time.perf_counter() - start)
        if self.rt.leader:
            append_rows(
                self.out / "evals.csv",
                [
                    {
                        "epoch": epoch,
                        "step": self.state.scheduler.last_epoch,
                        "val_loss": val_loss,
                        "val_accuracy": val_accuracy,
                    }
                ],
                EVALS_COLUMNS,
            )
        return self.last[2]

    def reached_target(self) -> bool:
        return self.cfg.target_accuracy is not None and self.last[1] >= self.cfg.target_accuracy


def random_state(device: torch.device) -> dict:
    """The states of the generators dropout draws from on `device`."""
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_random_state(rng: dict, device: torch.device) -> None:
    torch.set_rng_state(rng["cpu"].cpu())
    if device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"].cpu(), device)


@dataclass
class TrainingState:
    """The model and what steps it: everything a checkpoint saves and a resumed run restores."""

    model: TransformerClassifier
    model_cfg: ModelConfig
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    amp: str
    device_type: str
    sharding: str  # --sharding: what each rank keeps of the model's state (ddp_core/engine/sharding.py)

    @classmethod
    def create(cls, cfg: TrainConfig, rt: Runtime, data: EncodedData) -> TrainingState:
        torch.manual_seed(cfg.seed)  # every rank starts from the same weights
        model_cfg = model_config(cfg, data.num_classes)
        model = TransformerClassifier(model_cfg).to(rt.device)
        if cfg.compile:
            model.compile()  # in place: DDP, checkpoints and evaluation see the same module and parameter names
        model = shard_model(model, cfg.sharding, rt.device)  # before the optimizer: FSDP2 puts shards in their place
        optimizer = adamw(model, cfg.sharding, cfg.lr, cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg.warmup_steps))
        scaler = torch.amp.GradScaler(rt.device.type, enabled=cfg.amp == "fp16")
        return cls(model, model_cfg, optimizer, scheduler, scaler, cfg.amp, rt.device.type, cfg.sharding)

    def autocast(self):
        dtype = torch.float16 if self.amp == "fp16" else torch.bfloat16
        return torch.autocast(self.device_type, dtype=dtype, enabled=self.amp != "off")

    def checkpoint(self, epoch: int, cfg: TrainConfig, rt: Runtime) -> dict:
        """The whole state, gathered to rank 0 where it is sharded. Every rank calls it, and rank 0 saves it."""
        model_state, optimizer_state = whole_state(self.model, self.optimizer, self.sharding)
        return {
            "model": model_state,
            "optimizer": optimizer_state,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": epoch,
            "config": cfg.to_dict(),
            "world_size": rt.world_size,
        }


def model_config(cfg: TrainConfig, num_classes: int) -> ModelConfig:
    return ModelConfig.from_preset(
        cfg.preset, vocab_size=cfg.vocab_size, max_len=cfg.seq_len, num_classes=num_classes, dropout=cfg.dropout
    )


def lr_factor(warmup_steps: int):
    """Linear warm-up, then decay as 1/sqrt(step). It has no horizon, so a run resumed with more --epochs follows
    the schedule it would have had anyway."""
    warmup = max(1, warmup_steps)
    return lambda step: min((step + 1) / warmup, (warmup / (step + 1)) ** 0.5)


def report_check(state: TrainingState, data: EncodedData, rt: Runtime) -> None:
    if rt.leader:
        print(
            f"ddp_core: check passed: {len(data.train_labels)} train / {len(data.eval_labels)} eval samples, "
            f"{count_parameters(state.model):,} parameters, {rt.world_size} rank(s) on {rt.device.type} "
            f"with {rt.backend}"
        )


def restore_checkpoint(state: TrainingState, cfg: TrainConfig, rt: Runtime) -> tuple[int, EpochProgress | None]:
    """Load the run's last checkpoint into `state`. It returns the first epoch still to train, and this rank's
    progress in it where the checkpoint was written inside it."""
    path = Path(cfg.out) / CHECKPOINT_NAME
    try:
        ckpt = torch.load(path, map_location=rt.device, weights_only=False)
    except Exception:
        raise UsageError(
            f"{path} is unreadable (truncated or corrupt); the run cannot continue from it: "
            f"start it again with another --out"
        ) from None
    changed = differing_settings(ckpt["config"], cfg)
    if changed:
        raise UsageError(
            f"--resume: {', '.join(changed)} differ(s) from the run being resumed; "
            f"resume with the same arguments (only --epochs may grow)"
        )
    if ckpt["world_size"] != rt.world_size:
        raise UsageError(f"--resume: the run used {ckpt['world_size']} rank(s), this launch has {rt.world_size}")
    reached = ckpt["in_epoch"]["epoch"] if "in_epoch" in ckpt else ckpt["epoch"]
    if cfg.epochs < reached:
        raise UsageError(
            f"--resume: the run's checkpoint is at epoch {reached}; --epochs {cfg.epochs} would end it "
            f"before it (only --epochs may grow)"
        )
    load_whole_state(state.model, state.optimizer, state.sharding, ckpt["model"], ckpt["optimizer"])
    state.scheduler.load_state_dict(ckpt["scheduler"])
    state.scaler.load_state_dict(ckpt["scaler"])
    if "in_epoch" not in ckpt:
        return ckpt["epoch"] + 1, None
    progress = EpochProgress(**ckpt["in_epoch"]["ranks"][rt.rank])
    progress.resumes += 1
    return ckpt["in_epoch"]["epoch"], progress


def save_mid_epoch_checkpoint(
    state: TrainingState, epoch: int, progress: EpochProgress, out: Path | None, cfg: TrainConfig, rt: Runtime
) -> None:
    """A checkpoint inside `epoch`: the model and optimizer as they are, and every rank's progress."""
    ranks = [asdict(progress)]
    if rt.distributed:
        ranks = [None] * rt.world_size
        dist.all_gather_object(ranks, asdict(progress))
    snapshot = state.checkpoint(epoch - 1, cfg, rt)
    if rt.leader:
        save_atomic(snapshot | {"in_epoch": {"epoch": epoch, "ranks": ranks}}, out / CHECKPOINT_NAME)
    if rt.distributed:
        dist.barrier()  # until it is on disk: a rank that exited first would have torchrun stop the others


def open_run_dir(
    cfg: TrainConfig, rt: Runtime, state: TrainingState, first_epoch: int, batch: BatchPlan, resuming: bool
):
    """The run directory with its run.json (provenance) written, and the run's tracker. A resumed run forgets the
    rows it will redo."""
    out = Path(cfg.out) if cfg.out else new_run_dir(cfg, rt.world_size)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.csv", "steps.csv"):  # rows of epochs after the checkpoint are redone
        drop_rows_after(out / name, first_epoch - 1)
    drop_rows_after(out / "evals.csv", state.scheduler.last_epoch, column="step")  # and evaluations after its step
    run_info = {"start_time": now_iso(), "resumed_at": [], "config": cfg.to_dict()}
    if resuming:
        try:
            run_info = json.loads((out / "run.json").read_text())
        except (OSError, ValueError):
            print(f"ddp_core: {out / 'run.json'} was missing or unreadable: written anew", flush=True)
        run_info.setdefault("resumed_at", []).append(now_iso())
    run_info.update(
        config=cfg.to_dict(),
        world_size=rt.world_size,
        local_world_size=rt.local_world_size,
        backend=rt.backend,
        device=str(rt.device),
        threads_per_rank=rt.threads_per_rank,
        parameters=count_parameters(state.model),
        model=vars(state.model_cfg),
        per_rank_batch_size=batch.micro,
        global_batch_size=batch.global_batch,
        end_time=None,
        **environment(rt.device),
    )
    track = tracker(cfg, out, run_info)
    save_atomic(run_info, out / "run.json")
    print(f"ddp_core: run directory {out}", flush=True)
    return out, run_info, track


def new_run_dir(cfg: TrainConfig, world_size: int) -> Path:
    stem = f"results/{cfg.dataset}-{cfg.preset}-n{world_size}-{datetime.now():%Y%m%d-%H%M%S}"
    for suffix in ["", *(f"-{i}" for i in range(2, 1000))]:
        path = Path(stem + suffix)
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise UsageError(f"could not create a unique run directory {stem}")


def measures_noise(cfg: TrainConfig, rt: Runtime) -> bool:
    """Whether the run measures the gradient noise scale, which needs two batch sizes and their exact, unscaled
    average."""
    return (
        cfg.noise_scale
        and rt.distributed  # one rank has one batch size
        and cfg.comm_hook != "powersgd"  # its average is a low-rank approximation
        and cfg.amp != "fp16"  # the loss scale multiplies every gradient and changes between steps
        and cfg.sharding not in FSDP_MODES
    )


def wrap_ddp(model: TransformerClassifier, cfg: TrainConfig, rt: Runtime, timer: EpochTimer, noise: GradientNoise):
    """DDP around the model on more than one rank, with the run's bucket size and communication hook. On one rank,
    the bare model, where `timer` notes when each of DDP's buckets would be ready."""
    if not rt.distributed:
        if timer.enabled:
            parameters = list(model.parameters())
            for parameter, bucket in zip(parameters, bucket_indices([p.numel() for p in parameters])):
                parameter.register_post_accumulate_grad_hook(lambda _, bucket=bucket: timer.gradient_ready(bucket))
        return model
    if cfg.sharding in FSDP_MODES:
        return model  # FSDP2 reduce-scatters the gradients itself (sharded in TrainingState.create)
    # Synchronous data-parallel SGD: DDP averages the gradients across ranks during backward, so each optimizer step
    # equals one on the whole global batch.
    # Gradients as views into DDP's buckets: backward writes each gradient where its all-reduce reads it, instead
    # of DDP copying every gradient into its bucket and the averaged one back.
    ddp_model = DistributedDataParallel(
        model,
        device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb(cfg, rt, model),
        gradient_as_bucket_view=True,
    )
    state, hook = communication_hook(cfg)
    if timer.enabled:
        hook = timer.timed(hook)  # each bucket's all-reduce timed
    if measures_noise(cfg, rt):
        hook = noise.measured(hook)  # outermost: the norms are taken outside the all-reduce's timed span
    if hook is not default_hooks.allreduce_hook:
        ddp_model.register_comm_hook(state, hook)
    return ddp_model


def bucket_cap_mb(cfg: TrainConfig, rt: Runtime, model: TransformerClassifier) -> float | None:
    """The run's bucket size, except that PowerSGD on gloo gets one bucket."""
    # PyTorch's PowerSGD issues its second all-reduce from the first one's callback, on another thread than the next
    # bucket's. gloo ranks can then receive the two in different orders, a mismatch that aborts the run. One bucket
    # leaves nothing else in flight.
    if cfg.comm_hook != "powersgd" or rt.backend != "gloo":
        return cfg.bucket_cap_mb
    gradient_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    if cfg.bucket_cap_mb is not None and cfg.bucket_cap_mb < gradient_mb:
        raise UsageError(
            f"--comm-hook powersgd on gloo needs one gradient bucket: --bucket-cap-mb "
            f"{cfg.bucket_cap_mb:g} is less than the model's {gradient_mb:.1f} MiB (leave it unset)"
        )
    return max(cfg.bucket_cap_mb or 0.0, gradient_mb + 1)


def communication_hook(cfg: TrainConfig):
    """(state, hook) that DDP calls with each gradient bucket, as --comm-hook asks."""
    # fp16 and bf16 send half the bytes and round every gradient.
    if cfg.comm_hook == "fp16":
        return None, default_hooks.fp16_compress_hook
    if cfg.comm_hook == "bf16":
        return None, default_hooks.bf16_compress_hook
    if cfg.comm_hook == "powersgd":
        # PowerSGD (Vogels et al., 2019) sends two rank-r factors of each gradient matrix and keeps its error for the
        # next step. It compresses from the third step, after the two plain all-reduces PyTorch requires. Its
        # default waits 1000 steps, longer than a run here.
        return powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=cfg.powersgd_rank, start_powerSGD_iter=2, random_seed=cfg.seed
        ), powerSGD_hook.powerSGD_hook
    return None, default_hooks.allreduce_hook  # none: the average of the fp32 gradients


@dataclass(kw_only=True)
class Training:
    """What every epoch of one run trains with, made once by `run`."""

    cfg: TrainConfig
    rt: Runtime
    state: TrainingState
    ddp_model: torch.nn.Module  # the model in DDP, or bare on one rank
    data: EncodedData
    sampler: DistributedSampler
    batch: BatchPlan
    timer: EpochTimer
    noise: GradientNoise
    census: StateCensus  # the bytes of training state the rank holds, by kind
    collectives: CollectiveCensus  # the bytes one step hands to each collective (--count-collectives)
    evaluations: Evaluations
    stop: StopRequest
    out: Path | None  # the run directory on rank 0, None on the others


def train_epoch(training: Training, epoch: int, done: EpochProgress | None) -> EpochProgress:
    """One pass over this rank's shard, or what a mid-epoch checkpoint's progress `done` left of it. It ends early at
    an evaluation that reaches the target, and raises Stopped when the ranks agree to stop."""
    cfg, rt, state, batch, timer, noise = (
        training.cfg,
        training.rt,
        training.state,
        training.batch,
        training.timer,
        training.noise,
    )
    data, sampler, evaluations, stop, out = (
        training.data,
        training.sampler,
        training.evaluations,
        training.stop,
        training.out,
    )
    done = done or EpochProgress()
    if done.rng is None:
        torch.manual_seed(cfg.seed + 1000 * epoch + rt.rank)  # dropout masks a resumed run repeats exactly
    else:
        set_random_state(done.rng, rt.device)
    sampler.set_epoch(epoch)
    order = torch.tensor(list(sampler))[done.steps * batch.micro * cfg.grad_accum :]
    micro_batches = batches(data.train_ids, data.train_labels, order, batch.micro, rt.device)
    if rt.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rt.device)
    loss_sum = torch.tensor(done.loss_sum, dtype=torch.float64, device=rt.device)
    first_bad_step = torch.tensor(batch.steps if done.first_bad_step is None else done.first_bad_step, device=rt.device)
    start = time.perf_counter()
    timer.begin_epoch()  # after `start`: the steps' times, counted from here, add up to no more than the epoch's
    noise.begin_epoch()
    training.census.begin_epoch()
    evaluating = 0.0  # seconds of the evaluations inside the epoch, left out of its time
    steps = batch.steps
    for step in tqdm(
        range(done.steps, batch.steps),
        desc=f"epoch {epoch}",
        initial=done.steps,
        total=batch.steps,
        disable=not (rt.leader and cfg.progress),
        file=sys.stderr,
    ):
        with training.collectives.around_step():
            step_loss = train_step(
                training.ddp_model,
                micro_batches,
                cfg.grad_accum,
                timer,
                state.optimizer,
                state.scheduler,
                state.scaler,
                state.autocast,
            )
        training.census.between_steps()
        loss_sum += step_loss
        # Checked on the device: it costs no synchronisation.
        first_bad_step = torch.where(torch.isfinite(step_loss), first_bad_step, first_bad_step.clamp(max=step))
        if step + 1 < batch.steps and evaluations.due():
            with timer.phase("eval"):
                evaluating += evaluations.run(epoch)
            if evaluations.reached_target():
                steps = step + 1
                break
        stopping = stop.agreed()
        # A checkpoint every --checkpoint-every-steps steps, and when the ranks agree to stop.
        if stopping or (step + 1 < batch.steps and checkpoint_due(state, cfg)):
            so_far = done.then(
                step + 1,
                loss_sum,
                first_bad_step,
                time.perf_counter() - start - evaluating,
                timer.summary(),
                noise.sums(),
                random_state(rt.device),
            )
            save_mid_epoch_checkpoint(state, epoch, so_far, out, cfg, rt)
            if stopping:
                raise Stopped(
                    stopping,
                    f"stopped by {stopping.name} at epoch {epoch}, step {step + 1} of "
                    f"{batch.steps}: checkpoint written",
                    out,
                )
    if rt.device.type == "cuda":
        torch.cuda.synchronize(rt.device)
    return done.then(
        steps, loss_sum, first_bad_step, time.perf_counter() - start - evaluating, timer.summary(), noise.sums()
    )


def checkpoint_due(state: TrainingState, cfg: TrainConfig) -> bool:
    """Whether the optimizer step just taken is one --checkpoint-every-steps asks a checkpoint after. Steps count over
    the run, as the learning-rate schedule counts them."""
    return cfg.checkpoint_every_steps is not None and state.scheduler.last_epoch % cfg.checkpoint_every_steps == 0


def stop_if_diverged(epoch: int, first_bad_step: int, batch: BatchPlan, rt: Runtime) -> None:
    """A non-finite loss ends the run before its epoch is written: NaN rows are not results."""
    first_bad_step = int(all_reduce({"step": first_bad_step}, dist.ReduceOp.MIN, rt)["step"])
    if first_bad_step < batch.steps:
        raise UsageError(
            f"training diverged: the loss was not finite at epoch {epoch}, step {first_bad_step + 1} "
            f"of {batch.steps}; lower --lr or raise --warmup-steps and start again with another --out "
            f"(the epochs it completed stay in its metrics.csv)"
        )


def batches(data_ids: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor, batch_size: int, device):
    """Full micro-batches of this rank's indices, moved to the device. The token ids stay int32, which the embedding
    takes as they are."""
    for start in range(0, len(indices) - batch_size + 1, batch_size):
        idx = indices[start : start + batch_size]
        yield data_ids[idx].to(device, non_blocking=True), labels[idx].to(device, non_blocking=True)


def train_step(
    model, micro_batches, grad_accum: int, timer: EpochTimer, optimizer, scheduler, scaler, autocast
) -> torch.Tensor:
    """One optimizer step over `grad_accum` micro-batches. It returns the summed, not averaged, loss of the step's
    samples, left on the device."""
    timer.begin_step()
    loss_sum = 0.0
    for k in range(grad_accum):
        with timer.phase("data"):
            ids, labels = next(micro_batches)
        with gradient_sync(model, k == grad_accum - 1):  # the gradients are all-reduced on the last one only
            with timer.phase("forward"), autocast():
                loss = F.cross_entropy(model(ids).float(), labels)
            with timer.phase("backward"):
                scaler.scale(loss / grad_accum).backward()
        loss_sum = loss_sum + loss.detach() * len(labels)
    with timer.phase("optimizer"):
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    return loss_sum


def gradient_sync(model, sync: bool):
    """Whether this backward communicates the gradients: on a step's last micro-batch only."""
    # DDP skips its all-reduce inside `no_sync`, FSDP2 its reduce-scatter while `set_requires_gradient_sync(False)`.
    # One rank has nothing to skip.
    if is_fsdp(model):
        model.set_requires_gradient_sync(sync)
    if sync or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


@torch.no_grad()
def evaluate(model, data: EncodedData, batch_size: int, rt: Runtime, autocast) -> tuple[float, float]:
    """Loss and accuracy over the WHOLE evaluation set. Each rank takes every world_size-th sample, unpadded."""
    model.eval()
    indices = torch.arange(rt.rank, len(data.eval_labels), rt.world_size)
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    correct = torch.zeros((), dtype=torch.float64, device=rt.device)
    # Under FSDP2 every rank runs as many forward passes, since each gathers the parameters with all the others.
    # A rank whose part is done passes one sample more and counts nothing of it.
    most = math.ceil(len(data.eval_labels) / rt.world_size)  # the largest part, a rank's
    for start in range(0, most if is_fsdp(model) else len(indices), batch_size):
        idx = indices[start : start + batch_size]
        if len(idx) == 0:
            with autocast():
                model(data.eval_ids[:1].to(rt.device))
            continue
        ids, labels = data.eval_ids[idx].to(rt.device), data.eval_labels[idx].to(rt.device)
        with autocast():
            logits = model(ids).float()
        loss_sum += F.cross_entropy(logits, labels, reduction="sum")
        correct += (logits.argmax(-1) == labels).sum()
    total = all_reduce({"loss": loss_sum.item(), "correct": correct.item()}, dist.ReduceOp.SUM, rt)
    model.train()
    return total["loss"] / len(data.eval_labels), total["correct"] / len(data.eval_labels)


def metrics_row(training: Training, epoch: int, done: EpochProgress, sent_bytes: float) -> dict:
    """The epoch's row of metrics.csv, reduced over the ranks, with the last evaluation. An epoch continued from a
    mid-epoch checkpoint says so in `resumes`, and its time is that of its steps."""
    cfg, rt, batch = training.cfg, training.rt, training.batch
    val_loss, val_accuracy, eval_time = training.evaluations.last
    local_sq, averaged_sq = done.grad_sq
    # Sums over the ranks: the phases and the bytes each link sent in the epoch's steps become means, the loss a mean
    # per sample. The squared norms, summed over ranks and steps, give the noise scale.
    summed = all_reduce(
        {
            "phases": list(done.phases.values()),
            "local_sq": local_sq,
            "averaged_sq": averaged_sq,
            "loss": done.loss_sum,
            "sent_bytes": sent_bytes,
        },
        dist.ReduceOp.SUM,
        rt,
    )
    state_bytes = training.census.largest
    # Times, peak memory and training state by kind: the largest rank's. ZeRO-1 shards whole parameters, so the
    # ranks' shards differ in size.
    largest = all_reduce(
        {
            "epoch_time_s": done.seconds,
            "eval_time_s": eval_time,
            "peak_memory_mb": peak_memory_mb(rt.device),
            "state": list(state_bytes.values()),
        },
        dist.ReduceOp.MAX,
        rt,
    )
    samples = done.steps * batch.global_batch
    row = {name: value / rt.world_size for name, value in zip(done.phases, summed["phases"])}
    row.update(
        epoch=epoch,
        world_size=rt.world_size,
        global_batch_size=batch.global_batch,
        per_rank_batch_size=batch.micro,
        grad_accum=cfg.grad_accum,
        train_samples=samples,
        steps=done.steps,
        epoch_time_s=largest["epoch_time_s"],
        eval_time_s=largest["eval_time_s"],
        train_loss=summed["loss"] / samples,
        val_loss=val_loss,
        val_accuracy=val_accuracy,
        lr=training.state.scheduler.get_last_lr()[0],
        samples_per_s=samples / largest["epoch_time_s"],
        peak_memory_mb=largest["peak_memory_mb"],
        resumes=done.resumes,
        **{kind: int(size) for kind, size in zip(state_bytes, largest["state"])},
        link_sent_bytes=summed["sent_bytes"] / rt.world_size,
    )
    row.update(
        noise_scale(summed["local_sq"], summed["averaged_sq"], done.steps, rt.world_size, batch.micro * cfg.grad_accum)
        if measures_noise(cfg, rt)
        else dict.fromkeys(NOISE_COLUMNS, math.nan)  # empty where not measured
    )
    return row


def steps_rows(epoch: int, steps: dict[str, list[float]], rt: Runtime) -> list[dict]:
    """The epoch's rows of steps.csv, each step's times averaged over the ranks in one all-reduce."""
    if not steps["step_time_s"]:  # the timers were off
        return []
    # The mean, not the maximum: the ranks meet at every step's all-reduce, so they take the same steps in time. Where
    # each rank's step begins and ends varies, and a per-step maximum would add that jitter up past the epoch's time.
    mean = {
        name: [value / rt.world_size for value in values]
        for name, values in all_reduce(steps, dist.ReduceOp.SUM, rt).items()
    }
    return [
        {"epoch": epoch, "step": k + 1, "step_time_s": step, "comm_exposed_s": exposed}
        for k, (step, exposed) in enumerate(zip(mean["step_time_s"], mean["comm_exposed_s"]))
    ]


def all_reduce(values: dict[str, float | list[float]], op, rt: Runtime) -> dict[str, float | list[float]]:
    """Named values, each a number or a list of them, reduced over the ranks in one collective. They come back by
    name, so a new value needs no index shifted."""
    if not rt.distributed:
        return values
    flat = [x for value in values.values() for x in (value if isinstance(value, list) else [value])]
    tensor = torch.tensor(flat, dtype=torch.float64, device=rt.device)
    dist.all_reduce(tensor, op=op)
    reduced, start = {}, 0
    for name, value in values.items():
        size = len(value) if isinstance(value, list) else 1
        part = tensor[start : start + size].tolist()
        reduced[name], start = (part if isinstance(value, list) else part[0]), start + size
    return reduced


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated CUDA memory this epoch on a GPU, or on a CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    code = main()
    if code != 0:
        sys.exit(code)  # as before: a rank that refused ends no faster than the one that says why
    sys.stdout.flush()
    sys.stderr.flush()
    # A finished run's files are written and synced: skip the interpreter's teardown of torch, a second of CPU per
    # rank that 8 ranks ending at once on 2 cores spent for 4 s after their run had finished.
    os._exit(0)
