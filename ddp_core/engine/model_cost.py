"""What the model costs to train, from its shapes alone: its training FLOPs and the gradient buckets DDP
all-reduces. Facts of the model, kept beside it, that the benchmarks and the report's cost model both use.

A model is given as its `ModelConfig` fields (a run's `model` in run.json); nothing is built, and torch is
not imported (`model_shape.parameter_shapes`).
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
    """The bucket DDP puts each parameter in (1 for the first all-reduced), given the parameters' element counts in
    the order the model registers them: parameters in reverse order, a bucket closed as soon as it reaches its cap."""
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
    """The share of backward's FLOPs done when each of DDP's buckets is complete, bucket 1 first, where a GPU's
    backward time follows its FLOPs: backward reaches the parameters in the reverse of their registration, a Linear
    weight costing in proportion to its elements and a layer's attention scores costing at its qkv weight
    (`training_flops`'s terms); embeddings and vectors cost none. The last bucket holds the first parameters
    registered, the embeddings: it is complete only when backward ends, whatever its share of the bytes."""
    shapes = parameter_shapes(ModelConfig(**model_config))
    attention = 2 * model_config["max_len"] * model_config["d_model"]  # 4 T d per token against 2 per weight
    flops = [
        prod(shape) * (len(shape) == 2 and name not in EMBEDDINGS) + attention * name.endswith(".qkv.weight")
        for name, shape in shapes.items()
    ]
    buckets = bucket_indices([prod(shape) for shape in shapes.values()])
    done, ready = 0, {}
    for cost, bucket in zip(reversed(flops), reversed(buckets)):
        done += cost
        ready[bucket] = done  # the bucket's last parameter reached so far
    return [ready[bucket] / done for bucket in sorted(ready)]


def training_flops(model_config: dict, tokens: int) -> float:
    """FLOPs of forward and backward over `tokens` tokens (padding included: it is computed too).

    Forward: 2 per weight of every Linear per token, and 4 T d per layer per token for the attention
    scores and the weighted values; backward twice the forward. Embedding lookups cost no FLOPs, but
    their gradient is all-reduced like any other, which is why embedding-heavy models communicate
    much for little compute.
    """
    shapes = parameter_shapes(ModelConfig(**model_config))
    linear_weights = sum(prod(shape) for name, shape in shapes.items() if len(shape) == 2 and name not in EMBEDDINGS)
    attention = 4 * model_config["n_layers"] * model_config["max_len"] * model_config["d_model"]
    return 3 * tokens * (2 * linear_weights + attention)
