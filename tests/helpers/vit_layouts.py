"""ViT layouts others publish, written here from their published structure (our own code, random or
quickly-trained weights), for the rewrite tests and benchmarks/layout_speed.py:

* ``PerHeadViT``: DeiT with a distillation token, each head its own query/key/value ``nn.Linear(dim, head_dim)``
  (heads as a ``ModuleList``), the heads' outputs concatenated before the output projection;
* ``SeparateQKVViT``: one ``nn.Linear(dim, dim)`` each for query, key and value (per model, not per head);
* ``EncoderViT``: ``nn.TransformerEncoder`` (batch_first, ``norm_first=True``: packed ``in_proj`` weight), any
  channel count and input size (64x64x1 in the benchmark);
* ``CCT``: a Compact Convolutional Transformer: conv + ReLU + max-pool tokenizer, no class token, sequence pooling.

Every class takes its sizes as keyword arguments, so ``--model-class tests/helpers/vit_layouts.py:PerHeadViT
--model-kwargs '{...}'`` builds it the way a user's own class is built.
"""

from __future__ import annotations

import torch
from torch import nn

_CFG = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "crop_pct": 1.0, "interpolation": "bilinear"}


def _cfg(channels: int, image: int) -> dict:
    return {**_CFG, "mean": (0.5,) * channels, "std": (0.5,) * channels, "input_size": (channels, image, image)}


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class _Head(nn.Module):
    """One attention head with its own query, key and value layers (the per-head layout)."""

    def __init__(self, dim: int, head_dim: int):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(dim, head_dim) for _ in range(3))
        self.scale = head_dim ** -0.5

    def forward(self, x):
        att = (self.query(x) @ self.key(x).transpose(-2, -1)) * self.scale
        return att.softmax(dim=-1) @ self.value(x)


class _PerHeadAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = nn.ModuleList(_Head(dim, dim // heads) for _ in range(heads))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))


class _SeparateQKVAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = (f(x).reshape(b, n, self.heads, self.head_dim).permute(0, 2, 1, 3) for f in (self.q, self.k, self.v))
        att = (q @ k.transpose(-2, -1) / self.head_dim ** 0.5).softmax(dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, n, c))


class _Block(nn.Module):
    def __init__(self, attention: nn.Module, dim: int, mlp_ratio: int):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(dim), attention, nn.LayerNorm(dim), _Mlp(dim, dim * mlp_ratio)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _PatchViT(nn.Module):
    """Patch embedding, class (and distillation) tokens, pre-norm blocks, one or two heads."""

    def __init__(self, attention, dim, depth, heads, classes, image, patch, channels, mlp_ratio, distilled):
        super().__init__()
        self.pretrained_cfg = _cfg(channels, image)
        self.patch_embed = nn.Conv2d(channels, dim, patch, patch)
        tokens = 2 if distilled else 1
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.dist_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02) if distilled else None
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*[_Block(attention(dim, heads), dim, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.head_dist = nn.Linear(dim, classes) if distilled else None

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        tokens = [self.cls_token.expand(x.shape[0], -1, -1)]
        if self.dist_token is not None:
            tokens.append(self.dist_token.expand(x.shape[0], -1, -1))
        x = self.norm(self.blocks(torch.cat([*tokens, x], dim=1) + self.pos_embed))
        if self.head_dist is None:
            return self.head(x[:, 0])
        return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2  # DeiT's inference: the mean of both heads


class PerHeadViT(_PatchViT):
    """DeiT with a distillation token; every head its own query/key/value Linear."""

    def __init__(self, dim=48, depth=2, heads=3, classes=10, image=32, patch=8, channels=3, mlp_ratio=2, distilled=True):
        super().__init__(_PerHeadAttention, dim, depth, heads, classes, image, patch, channels, mlp_ratio, distilled)


class SeparateQKVViT(_PatchViT):
    """One query, one key and one value Linear per block."""

    def __init__(self, dim=48, depth=2, heads=3, classes=10, image=32, patch=8, channels=3, mlp_ratio=2, distilled=False):
        super().__init__(_SeparateQKVAttention, dim, depth, heads, classes, image, patch, channels, mlp_ratio, distilled)


class EncoderViT(nn.Module):
    """A pre-norm ``nn.TransformerEncoder`` ViT (packed ``in_proj`` weight)."""

    def __init__(self, dim=32, depth=2, heads=2, classes=10, image=32, patch=8, channels=3, mlp_ratio=2):
        super().__init__()
        self.pretrained_cfg = _cfg(channels, image)
        self.embed = nn.Conv2d(channels, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, mlp_ratio * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        for name, p in self.encoder.named_parameters():  # the encoder deep-copies one layer: give each its own weights
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif "bias" in name and "norm" not in name:
                nn.init.normal_(p, std=0.02)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.out(self.norm(self.encoder(x))[:, 0])


class _CCTAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, dim * 3, bias=False), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1) * (c // self.heads) ** -0.5).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, n, c))


class CCT(nn.Module):
    """Compact Convolutional Transformer: conv tokenizer (conv, ReLU, max-pool per stage), learned positions,
    pre-norm blocks, sequence pooling (a softmax over tokens), one Linear head."""

    def __init__(self, dim=32, depth=2, heads=2, classes=10, image=32, channels=3, stages=1, mlp_ratio=2):
        super().__init__()
        self.pretrained_cfg = _cfg(channels, image)
        convs, c = [], channels
        for i in range(stages):
            out = dim if i == stages - 1 else dim // 2
            convs += [nn.Conv2d(c, out, 3, 1, 1, bias=False), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
            c = out
        self.tokenizer = nn.Sequential(*convs)
        self.pos = nn.Parameter(torch.randn(1, (image // 2 ** stages) ** 2, dim) * 0.02)
        self.blocks = nn.Sequential(*[_Block(_CCTAttention(dim, heads), dim, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.attention_pool = nn.Linear(dim, 1)
        self.fc = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.tokenizer(x).flatten(2).transpose(1, 2) + self.pos
        x = self.norm(self.blocks(x))
        w = self.attention_pool(x).softmax(dim=1).transpose(-1, -2)
        return self.fc((w @ x).squeeze(-2))
