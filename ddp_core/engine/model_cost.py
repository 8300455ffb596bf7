"""What the model costs to train, from its shapes alone: its training FLOPs and the gradient buckets DDP
all-reduces. Facts of the model, kept beside it, that the benchmarks and the report's cost model both use.

A model is given as its `ModelConfig` fields (a run's `model` in run.json); nothing is allocated.
"""

from __future__ import annotations

import torch

from ddp_core.engine.model import PRESETS, ModelConfig, TransformerClassifier

# DDP's gradient buckets: a small first one, so that the all-reduce starts early in backward, then 25 MiB each.
FIRST_BUCKET_BYTES = 2**20
BUCKET_BYTES = 25 * 2**20


def meta_model(model_config: dict) -> TransformerClassifier:
    """The model's shapes without its memory: enough to count parameters and FLOPs of any preset."""
    with torch.device("meta"):
        return TransformerClassifier(ModelConfig(**model_config))


def preset_configs(model_config: dict) -> dict[str, dict]:
    """Every preset's shape at the vocabulary, length and classes of `model_config` (a run's workload)."""
    return {preset: vars(ModelConfig.from_preset(preset, vocab_size=model_config["vocab_size"],
                                                 max_len=model_config["max_len"],
                                                 num_classes=model_config["num_classes"]))
            for preset in PRESETS}


def bucket_sizes(model_config: dict) -> list[int]:
    """Gradient bucket sizes in bytes (fp32), in the order DDP fills and all-reduces them: parameters in
    reverse order, a bucket closed as soon as it reaches its cap."""
    buckets, current, cap = [], 0, FIRST_BUCKET_BYTES
    for param in reversed(list(meta_model(model_config).parameters())):
        current += param.numel() * 4
        if current >= cap:
            buckets.append(current)
            current, cap = 0, BUCKET_BYTES
    return buckets + ([current] if current else [])


def training_flops(model_config: dict, tokens: int) -> float:
    """FLOPs of forward and backward over `tokens` tokens (padding included: it is computed too).

    Forward: 2 per weight of every Linear per token, and 4 T d per layer per token for the attention
    scores and the weighted values; backward twice the forward. Embedding lookups cost no FLOPs, but
    their gradient is all-reduced like any other, which is why embedding-heavy models communicate
    much for little compute.
    """
    linear_weights = sum(m.weight.numel() for m in meta_model(model_config).modules() if isinstance(m, torch.nn.Linear))
    attention = 4 * model_config["n_layers"] * model_config["max_len"] * model_config["d_model"]
    return 3 * tokens * (2 * linear_weights + attention)
