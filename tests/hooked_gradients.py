"""One backward pass of the tiny model through the trainer's DDP wrapper under each communication hook, on 2 ranks:
rank 0 saves the averaged gradients of each hook, the exact average (each rank's own gradient, summed with a plain
fp32 all-reduce) and the mean of their magnitudes, and each step's gradient noise sums (summed over the ranks) as the
trainer measures them, to the .pt file named on the command line.

    torchrun --nproc-per-node 2 tests/hooked_gradients.py OUT.pt
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_core.engine.config import TrainConfig
from ddp_core.engine.model import TransformerClassifier
from ddp_core.engine.model_shape import ModelConfig
from ddp_core.engine.noise_scale import GradientNoise
from ddp_core.engine.runtime import resolve_runtime
from ddp_core.engine.timers import EpochTimer
from ddp_core.train import wrap_ddp

STEPS = 3  # PowerSGD compresses from its third step on


def batch(rank: int, step: int):
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, 128, (4, 32), generator=generator), torch.randint(0, 2, (4,), generator=generator)


def fresh_model() -> TransformerClassifier:
    torch.manual_seed(0)
    return TransformerClassifier(
        ModelConfig.from_preset("tiny", vocab_size=128, max_len=32, num_classes=2, dropout=0.0)
    )


def gradients_per_step(cfg: TrainConfig) -> tuple[list[dict[str, torch.Tensor]], list[tuple[float, float]]]:
    """Each step's averaged gradients, and its (Σ_ranks |G_small|², Σ_ranks |G_big|²) as the trainer measures them."""
    rt = resolve_runtime(cfg)
    timer, noise = EpochTimer(rt.device), GradientNoise()
    model = wrap_ddp(fresh_model(), cfg, rt, timer, noise)
    steps, noise_sums = [], []
    for step in range(STEPS):
        timer.begin_step()
        noise.begin_epoch()
        ids, labels = batch(rt.rank, step)
        F.cross_entropy(model(ids), labels).backward()
        steps.append({name: p.grad.clone() for name, p in model.module.named_parameters()})
        sums = torch.tensor(noise.sums(), dtype=torch.float64)
        dist.all_reduce(sums)
        noise_sums.append(tuple(sums.tolist()))
        model.zero_grad(set_to_none=True)
    return steps, noise_sums


def exact_average(magnitude: bool = False) -> list[dict[str, torch.Tensor]]:
    """The mean of the ranks' gradients in fp32, or with `magnitude` the mean of their absolute values."""
    model, steps = fresh_model(), []
    for step in range(STEPS):
        ids, labels = batch(dist.get_rank(), step)
        F.cross_entropy(model(ids), labels).backward()
        grads = {}
        for name, p in model.named_parameters():
            grad = p.grad.abs() if magnitude else p.grad
            dist.all_reduce(grad)
            grads[name] = grad / dist.get_world_size()
        steps.append(grads)
        model.zero_grad(set_to_none=True)
    return steps


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    hooks = ("none", "fp16", "powersgd")
    result = {hook: gradients_per_step(TrainConfig(comm_hook=hook, global_batch_size=8)) for hook in hooks}
    result = {hook: grads for hook, (grads, _) in result.items()} | {"noise_sums": result["none"][1]}
    result["exact"], result["magnitude"] = exact_average(), exact_average(magnitude=True)
    if dist.get_rank() == 0:
        torch.save(result, argv[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
