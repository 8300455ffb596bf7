"""A pre-LN transformer encoder that classifies a padded token sequence.

Padding never changes a prediction. Token id 0 is padding, and the ids may be int32 or int64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ddp_core.engine.model_shape import ModelConfig

PAD_ID = 0


class EncoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln_attn = nn.LayerNorm(cfg.d_model)
        # No bias: a key bias shifts every score of a query equally, so softmax cancels it and its gradient is
        # exactly zero; Adam would turn that zero's rounding noise into full-size, rank-dependent updates.
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln_ff = nn.LayerNorm(cfg.d_model)
        self.ff = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))
        # Dropout on the embeddings and each residual branch, not on the attention probabilities: no fused CPU
        # attention kernel takes dropout. The unfused path builds batch x heads x length x length probabilities and a
        # mask as large, which cost two thirds of attention's time (the One device chapter profiles a step).
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln_attn(x)).view(batch, length, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=attend[:, None, None, :])  # padded keys masked out
        x = x + self.drop(self.proj(attn.transpose(1, 2).reshape(batch, length, width)))
        return x + self.drop(self.ff(self.ln_ff(x)))


class TransformerClassifier(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} does not divide into {cfg.n_heads} heads")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_out = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        attend = ids != PAD_ID
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.tok_emb(ids) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x, attend)
        x = self.ln_out(x)
        weights = attend.unsqueeze(-1).to(x.dtype)  # the mean over real tokens only
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self.head(pooled)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
