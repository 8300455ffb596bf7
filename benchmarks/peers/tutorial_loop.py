"""The loop of PyTorch's DDP tutorial (`multigpu_torchrun.py`, "Fault-tolerant distributed training with
torchrun") on this report's model and data: what a user would write instead of ddp_core.

    torchrun --standalone --nproc-per-node 2 -m benchmarks.peers.tutorial_loop [ddp_core's flags] --out DIR

It trains what ddp_core's flags describe (`--preset`, `--global-batch-size`, `--epochs`, ...) on the same
encoded tensors and the same model class, the tutorial's way: a process group even for one process, the
model in DistributedDataParallel, a DataLoader over a DistributedSampler, AdamW with PyTorch's defaults,
zero_grad before each step. It writes each step's time to DIR/steps.csv (`step_clock.py`) and nothing else.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from benchmarks.peers.step_clock import StepClock
from ddp_core.engine.config import micro_batch_size, parse_args
from ddp_core.engine.data import load_data
from ddp_core.engine.model import TransformerClassifier
from ddp_core.train import model_config


def main() -> None:
    cfg = parse_args(sys.argv[1:])
    on_gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if on_gpu else "gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    data = load_data(cfg)
    torch.manual_seed(cfg.seed)
    model = TransformerClassifier(model_config(cfg, data.num_classes)).to(device)
    model = DDP(model, device_ids=[local_rank] if on_gpu else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    dataset = TensorDataset(data.train_ids, data.train_labels)
    loader = DataLoader(
        dataset,
        batch_size=micro_batch_size(cfg, dist.get_world_size()),
        pin_memory=on_gpu,
        shuffle=False,
        sampler=DistributedSampler(dataset, seed=cfg.seed),
    )
    clock = StepClock(device)
    for epoch in range(1, cfg.epochs + 1):
        loader.sampler.set_epoch(epoch)
        clock.start_epoch(epoch)
        for ids, labels in loader:
            ids, labels = ids.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(ids), labels)
            loss.backward()
            optimizer.step()
            clock.step_done()
    clock.save(cfg.out, dist.get_rank() == 0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
