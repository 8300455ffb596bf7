"""The model's shape as plain numbers: its presets, its config and every parameter's shape.

It is kept apart from `model.py` so that code that only counts, such as the report's FLOPs, does not import torch.
A book page that costs a model then starts in a fraction of the time.
"""

from __future__ import annotations

from dataclasses import dataclass

PRESETS = {
    "tiny": dict(d_model=32, n_layers=1, n_heads=2, d_ff=64, dropout=0.0),
    "small": dict(d_model=128, n_layers=2, n_heads=4, d_ff=512, dropout=0.1),
    "medium": dict(d_model=256, n_layers=4, n_heads=8, d_ff=1024, dropout=0.1),
    "large": dict(d_model=768, n_layers=12, n_heads=12, d_ff=3072, dropout=0.1),
}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    max_len: int
    num_classes: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    dropout: float

    @classmethod
    def from_preset(
        cls, preset: str, *, vocab_size: int, max_len: int, num_classes: int, dropout: float | None = None
    ) -> "ModelConfig":
        shape = dict(PRESETS[preset])
        if dropout is not None:
            shape["dropout"] = dropout
        return cls(vocab_size=vocab_size, max_len=max_len, num_classes=num_classes, **shape)


def parameter_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of `TransformerClassifier(cfg)` by name, in the order the model registers them. The tests hold
    it to the real model's parameters."""
    d, ff = cfg.d_model, cfg.d_ff
    block = {
        "ln_attn.weight": (d,),
        "ln_attn.bias": (d,),
        "qkv.weight": (3 * d, d),
        "proj.weight": (d, d),
        "proj.bias": (d,),
        "ln_ff.weight": (d,),
        "ln_ff.bias": (d,),
        "ff.0.weight": (ff, d),
        "ff.0.bias": (ff,),
        "ff.2.weight": (d, ff),
        "ff.2.bias": (d,),
    }
    shapes = {"tok_emb.weight": (cfg.vocab_size, d), "pos_emb.weight": (cfg.max_len, d)}
    for layer in range(cfg.n_layers):
        shapes |= {f"blocks.{layer}.{name}": shape for name, shape in block.items()}
    return shapes | {
        "ln_out.weight": (d,),
        "ln_out.bias": (d,),
        "head.weight": (cfg.num_classes, d),
        "head.bias": (cfg.num_classes,),
    }
