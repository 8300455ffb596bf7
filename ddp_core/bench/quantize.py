"""A trained classifier against its dynamic int8 quantization: size on disk, inference latency, accuracy.

    python -m ddp_core.bench.quantize results/quantization/n1     # a finished run with its checkpoint.pt

PyTorch's dynamic quantization stores the weights of every `nn.Linear` as int8 and quantizes the
activations on the fly at each call; embeddings, layer norms and attention stay fp32. Both models
classify the run's whole evaluation set in batches of the run's per-rank batch size, in alternating
passes (fp32, int8, fp32, ...) so that a drift of the machine's speed hits both alike; the latency is
the median over all batches of all passes. Equal accuracies need not mean equal answers, so each model's
agreement with fp32 is counted sample by sample. Writes `quantization.csv` and `quantization.json`
(provenance) into the run's folder; an existing result is never overwritten.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import fields
from pathlib import Path

import torch
from torch import nn

from ddp_core.engine.config import CHECKPOINT_NAME, TrainConfig, UsageError
from ddp_core.engine.data import load_data
from ddp_core.engine.model import TransformerClassifier
from ddp_core.engine.model_shape import ModelConfig
from ddp_core.engine.run_files import environment, now_iso, save_atomic
from ddp_core.engine.runtime import usable_cores

COLUMNS = ["model", "size_mb", "latency_ms_per_batch", "batch_size", "batches_timed", "accuracy", "agreement_with_fp32"]


def quantize_int8(model: nn.Module) -> nn.Module:
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao; it still works
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def size_mb(model: nn.Module) -> float:
    """Bytes of the saved state_dict, as a checkpoint of the model would hold them."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell() / 1e6


@torch.inference_mode()
def timed_pass(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, batch_size: int):
    """(seconds per batch, predicted class of every sample) over the evaluation set."""
    seconds, predicted = [], []
    for start in range(0, len(labels), batch_size):
        begin = time.perf_counter()
        logits = model(ids[start:start + batch_size].long())
        seconds.append(time.perf_counter() - begin)
        predicted.append(logits.argmax(-1))
    return seconds, torch.cat(predicted)


def compare(run_dir: Path, passes: int) -> list[dict]:
    info = json.loads((run_dir / "run.json").read_text())
    if not info.get("end_time") or not (run_dir / CHECKPOINT_NAME).is_file():
        raise UsageError(f"{run_dir} holds no finished run with its {CHECKPOINT_NAME}")
    known = {f.name for f in fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in info["config"].items() if k in known})
    cfg.data_dir = os.environ.get("DDP_CORE_DATA_DIR") or cfg.data_dir
    cfg.cache_dir = os.environ.get("DDP_CORE_CACHE_DIR") or cfg.cache_dir
    torch.set_num_threads(info["threads_per_rank"])
    data = load_data(cfg)
    fp32 = TransformerClassifier(ModelConfig(**info["model"]))
    fp32.load_state_dict(torch.load(run_dir / CHECKPOINT_NAME, map_location="cpu", weights_only=False)["model"])
    models = {"fp32": fp32.eval(), "int8": quantize_int8(fp32).eval()}
    batch = info["per_rank_batch_size"]
    seconds = {name: [] for name in models}
    predicted = {}
    for _ in range(passes):
        for name, model in models.items():
            times, predicted[name] = timed_pass(model, data.eval_ids, data.eval_labels, batch)
            seconds[name] += times
    return [dict(model=name, size_mb=size_mb(model), latency_ms_per_batch=1e3 * statistics.median(seconds[name]),
                 batch_size=batch, batches_timed=len(seconds[name]),
                 accuracy=float((predicted[name] == data.eval_labels).float().mean()),
                 agreement_with_fp32=float((predicted[name] == predicted["fp32"]).float().mean()))
            for name, model in models.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_core.bench.quantize", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a finished run's folder, with its checkpoint")
    parser.add_argument("--passes", type=int, default=3, help="timed passes over the evaluation set per model")
    args = parser.parse_args(argv)
    out = args.run_dir / "quantization.csv"
    try:
        if out.exists():
            raise UsageError(f"{out} exists; it is never overwritten")
        rows = compare(args.run_dir, args.passes)
    except (UsageError, OSError, ValueError, KeyError) as exc:
        print(f"ddp_core.bench.quantize: error: {exc}", file=sys.stderr)
        return 2
    import pandas as pd

    pd.DataFrame(rows, columns=COLUMNS).to_csv(out, index=False)
    save_atomic({"time": now_iso(), "run": str(args.run_dir), "passes": args.passes, "threads": torch.get_num_threads(),
                 "usable_cores": usable_cores(), **environment(torch.device("cpu"))},
                args.run_dir / "quantization.json")
    print(pd.DataFrame(rows, columns=COLUMNS).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
