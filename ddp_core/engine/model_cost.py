"""What the model costs to train, from its shapes alone: its training FLOPs and DDP's gradient buckets.

The benchmarks and the report's cost model both use these facts. A model is given as its `ModelConfig` fields, as in
a run's run.json, so nothing is built and torch is not imported.
"""

from __future__ import annotations

from math import prod

from ddp_core.engine.model_shape import PRESETS, ModelConfig, parameter_shapes

# DDP's gradient buckets: a small first one, so that the all-reduce starts early in backward, then 25 MiB each.
FIRST_BUCKET_BYTES = 2**20
BUCKET_BYTES = 25 * 2**20
EMBEDDINGS = ("tok_emb.weight", "pos_emb.weight")


def parameter_counts(model_config: dict) -> dict[str, int]:
    """Every parameter's number of elements, by name, in the order the model registers them."""
    return {name: prod(shape) for name, shape in parameter_shapes(ModelConfig(**model_config)).items()}


def preset_configs(model_config: dict) -> dict[str, dict]:
    """Every preset's shape at the vocabulary, length and classes of `model_config` (a run's workload)."""
    return {
        preset: vars(
            ModelConfig.from_preset(
                preset,
                vocab_size=model_config["vocab_size"],
                max_len=model_config["max_len"],
                num_classes=model_config["num_classes"],
            )
        )
        for preset in PRESETS
    }


def bucket_indices(counts: list[int]) -> list[int]:
    """The bucket DDP puts each parameter in, 1 for the first all-reduced. `counts` are the parameters' element
    counts in the order the model registers them."""
    # DDP fills buckets from the last parameter back and closes each one as soon as it reaches its cap.
    indices, current, cap, bucket = [], 0, FIRST_BUCKET_BYTES, 1
    for count in reversed(counts):
        indices.append(bucket)
        current += count * 4
        if current >= cap:
            current, cap, bucket = 0, BUCKET_BYTES, bucket + 1
    return indices[::-1]


def bucket_sizes(model_config: dict) -> list[int]:
    """Gradient bucket sizes in bytes (fp32), in the order DDP fills and all-reduces them (`bucket_indices`)."""
    counts = list(parameter_counts(model_config).values())
    sizes = {}
    for count, bucket in zip(counts, bucket_indices(counts)):
        sizes[bucket] = sizes.get(bucket, 0) + count * 4
    return [sizes[bucket] for bucket in sorted(sizes)]


def bucket_ready_shares(model_config: dict) -> list[float]:
    """The share of backward's FLOPs done when each of DDP's buckets is complete, bucket 1 first. It models a GPU,
    whose backward time follows its FLOPs."""
    shapes = parameter_shapes(ModelConfig(**model_config))
    # `training_flops`'s terms: a Linear weight costs its elements, and a layer's attention scores cost at its qkv
    # weight. Embeddings and vectors cost none.
    attention = 2 * model_config["max_len"] * model_config["d_model"]  # 4 T d per token against 2 per weight
    flops = [
        prod(shape) * (len(shape) == 2 and name not in EMBEDDINGS) + attention * name.endswith(".qkv.weight")
        for name, shape in shapes.items()
    ]
    buckets = bucket_indices([prod(shape) for shape in shapes.values()])
    done, ready = 0, {}
    # Backward reaches the parameters in reverse registration order. The last bucket holds the embeddings, registered
    # first, so it is complete only when backward ends, whatever its share of the bytes.
    for cost, bucket in zip(reversed(flops), reversed(buckets)):
        done += cost
        ready[bucket] = done  # the bucket's last parameter reached so far
    return [ready[bucket] / done for bucket in sorted(ready)]


def training_flops(model_config: dict, tokens: int) -> float:
    """FLOPs of forward and backward over `tokens` tokens, padding included since it is computed too."""
    shapes = parameter_shapes(ModelConfig(**model_config))
    # Forward: 2 per Linear weight per token. Embedding lookups cost none, yet their gradients are all-reduced like
    # any other: embedding-heavy models communicate much for little compute.
    linear_weights = sum(prod(shape) for name, shape in shapes.items() if len(shape) == 2 and name not in EMBEDDINGS)
    # The attention scores and the weighted values: 4 T d per layer per token.
    attention = 4 * model_config["n_layers"] * model_config["max_len"] * model_config["d_model"]
    # Backward costs twice the forward.
    return 3 * tokens * (2 * linear_weights + attention)
