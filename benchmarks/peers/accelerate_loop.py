"""A training loop in Hugging Face Accelerate on this report's model and data: what a user would write instead
of ddp_core, in the shape of Accelerate's own examples (`nlp_example.py`).

    torchrun --standalone --nproc-per-node 2 -m benchmarks.peers.accelerate_loop [ddp_core's flags] --out DIR

It trains what ddp_core's flags describe on the same encoded tensors and the same model class. Accelerate
decides the rest as it does for any user (on a machine without a GPU, told so, as `accelerate launch --cpu`
tells it; else it would train each process alone): the device, the process group, DDP around the model on more than
one process (none on one), each process's shard of a shuffled DataLoader. It writes each step's time to
DIR/steps.csv (`step_clock.py`) and nothing else. Needs `pip install -e '.[peers]'`.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.peers.step_clock import StepClock
from ddp_core.engine.config import micro_batch_size, parse_args
from ddp_core.engine.data import load_data
from ddp_core.engine.model import TransformerClassifier
from ddp_core.train import model_config


def main() -> None:
    cfg = parse_args(sys.argv[1:])
    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # `accelerate launch --cpu`: else no process group
    data = load_data(cfg)
    torch.manual_seed(cfg.seed)
    model = TransformerClassifier(model_config(cfg, data.num_classes))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loader = DataLoader(
        TensorDataset(data.train_ids, data.train_labels),
        batch_size=micro_batch_size(cfg, accelerator.num_processes),
        shuffle=True,
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    clock = StepClock(accelerator.device)
    for epoch in range(1, cfg.epochs + 1):
        loader.set_epoch(epoch)
        clock.start_epoch(epoch)
        for ids, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(ids), labels)
            accelerator.backward(loss)
            optimizer.step()
            clock.step_done()
    clock.save(cfg.out, accelerator.is_main_process)
    accelerator.end_training()


if __name__ == "__main__":
    main()
