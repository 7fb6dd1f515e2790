"""A 1-channel (grayscale) ViT, the way users write one: the channel-count example.

``GrayViT`` follows the shape of lucidrains' ``vit-pytorch`` ViT with ``channels=1``
(a patch embedding, a class token, learned positions, pre-norm blocks, a linear head)
but embeds patches with a strided ``nn.Conv2d`` as timm and torchvision do, so its
input channel count and patch size can be read from the weights. It carries no
``pretrained_cfg``: its trained weights (``examples/gray_digits_vit.pt``) are a vitedge
checkpoint that records the preprocessing, and ``--model-class`` builds the class.

Trained by ``examples/train_gray_digits_vit.py`` on scikit-learn's digits as
grayscale ("L") images.
"""

from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_dim: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GrayViT(nn.Module):
    def __init__(
        self,
        image_size: int = 32,
        patch_size: int = 4,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        mlp_dim: int = 128,
        num_classes: int = 10,
        channels: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        num_patches = (image_size // patch_size) ** 2
        self.to_patch_embedding = nn.Conv2d(channels, dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.layers = nn.ModuleList([Block(dim, heads, mlp_dim, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.pos_embedding, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.to_patch_embedding(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos_embedding
        for layer in self.layers:
            tokens = layer(tokens)
        return self.head(self.norm(tokens[:, 0]))
