"""A small Compact Convolutional Transformer as people write one (Hassani et al., 2021): a convolutional tokenizer
(a stride-2 conv and a stride-2 max-pool, so 32x32 images give 8x8 = 64 tokens), no class token, learned positions,
pre-norm ``nn.TransformerEncoder`` blocks and sequence pooling (an attention-weighted mean of the tokens) before the
head. Handed to vitedge with ``--model-class tests/helpers/cct_vit.py:CCT`` (random weights: the tests plant the
values they need)."""

from __future__ import annotations

import torch
from torch import nn


class CCT(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 2, heads: int = 2, classes: int = 10, channels: int = 3, image: int = 32,
                 pool: str = "max", padding: int = 1, kernel: int = 3) -> None:
        super().__init__()
        pooling = nn.MaxPool2d(3, 2, 1) if pool == "max" else nn.AvgPool2d(2, 2)
        self.tokenizer = nn.Sequential(nn.Conv2d(channels, dim, kernel, 2, padding, bias=False), nn.ReLU(), pooling)
        with torch.no_grad():  # the token count the stem makes at this image size
            tokens = self.tokenizer(torch.zeros(1, channels, image, image)).flatten(2).shape[-1]
        self.positional_emb = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.attention_pool = nn.Linear(dim, 1)
        self.fc = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tokenizer(x).flatten(2).transpose(1, 2) + self.positional_emb
        x = self.norm(self.encoder(x))
        w = self.attention_pool(x).softmax(dim=1)
        return self.fc((w.transpose(1, 2) @ x).squeeze(1))
