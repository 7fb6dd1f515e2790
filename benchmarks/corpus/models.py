"""Torch classes for the corpus checkpoints: small ViTs that other people trained and published.

Written for vitedge from the checkpoints' state_dict keys and shapes and from reading each
source repository's model code; no code is copied from those repositories (their licences
differ, several state none). Each class builds with no arguments into the configuration its
checkpoint was trained with, so ``vitedge build CKPT --model-class
benchmarks/corpus/models.py:Class`` loads the state_dict strictly, and names its submodules so
that the checkpoint's keys match exactly (``load_state_dict(strict=True)``).

Every class returns raw logits of shape (batch, classes) for any batch size (one source model
returns softmax probabilities and one a (logits, attentions) tuple: top-1 is the same, and the
difference is written next to the class). ``pretrained_cfg`` says the input size and the
normalisation its authors trained with, as timm does; vitedge reads it when the class is
given with ``--model-class``. benchmarks/corpus/manifest.toml records the same facts with
their sources.

Only torch is imported: this file is handed to ``--model-class`` and must import alone.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "AdrienDeiT",
    "AgentzzGapViT",
    "AlessioTinyImageNetPrunedViT",
    "AlessioTinyImageNetViT",
    "AshuConvEnrichedViT",
    "AshuViT",
    "GauravMnistViT",
    "JasonFashionHybridViT",
    "KavishkaShallowViT",
    "MldeTorchvisionViT",
    "NikCCT",
    "ProlaxmiSeqFirstViT",
    "ResearchaseMnistViT",
    "SmmkPostNormViT",
    "SonjuhyQkvViT",
    "SquarezhongPostNormViT",
    "TintnViT",
]


def _cfg(channels: int, size: int, mean, std) -> dict:
    return {"input_size": (channels, size, size), "mean": tuple(mean), "std": tuple(std), "crop_pct": 1.0,
            "interpolation": "bilinear"}


def _to_patch_rows(x: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, tokens, patch*patch*C), each row ordered (row-in-patch, column-in-patch, channel):
    the layout of einops' 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)'."""
    b, c, h, w = x.shape
    gh, gw = h // patch, w // patch
    x = x.reshape(b, c, gh, patch, gw, patch)
    x = x.permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, gh * gw, patch * patch * c)


class _PatchRows(nn.Module):
    """No weights: index 0 of a Sequential whose index 1 is the patch Linear."""

    def __init__(self, patch: int) -> None:
        super().__init__()
        self.patch = patch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _to_patch_rows(x, self.patch)


def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, d = t.shape
    return t.reshape(b, n, heads, d // heads).transpose(1, 2)


def _merge_heads(t: torch.Tensor) -> torch.Tensor:
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


# ---------------------------------------------------------------- researchase/vit-mnist-explorations


class _LnThen(nn.Module):
    """LayerNorm, then the wrapped layer (keys: norm.*, fn.*)."""

    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x))


class _FusedQkvAttention(nn.Module):
    """Attention with one bias-free qkv projection and heads * head_dim wider than the model."""

    def __init__(self, dim: int, heads: int, head_dim: int, out_in_sequential: bool = True) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.scale = head_dim ** -0.5
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(0.0)) if out_in_sequential else nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (_split_heads(t, self.heads) for t in self.to_qkv(x).chunk(3, dim=-1))
        weights = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
        return self.to_out(_merge_heads(torch.matmul(weights, v)))


class _ReluMlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        # indices 0 and 3 hold the weights: Linear, ReLU, Dropout, Linear, Dropout
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(0.0), nn.Linear(hidden, dim), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ResearchaseMnistViT(nn.Module):
    """MNIST, 1 channel, 28x28: Linear patch embedding (4x4 patches), class token, 6 pre-norm blocks
    of width 64 with 4 heads of 64 (attention 4x wider than the model), ReLU MLP of 128.
    Checkpoint: vit_mnist_gpu.pt of researchase/vit-mnist-explorations (MIT)."""

    def __init__(self, image_size: int = 28, patch_size: int = 4, channels: int = 1, dim: int = 64, depth: int = 6,
                 heads: int = 4, head_dim: int = 64, mlp_dim: int = 128, num_classes: int = 10) -> None:
        super().__init__()
        tokens = (image_size // patch_size) ** 2
        self.to_patch_embedding = nn.Sequential(_PatchRows(patch_size), nn.Linear(channels * patch_size ** 2, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.transformer = nn.Module()
        self.transformer.layers = nn.ModuleList(
            nn.ModuleList([_LnThen(dim, _FusedQkvAttention(dim, heads, head_dim)), _LnThen(dim, _ReluMlp(dim, mlp_dim))])
            for _ in range(depth)
        )
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))
        self.pretrained_cfg = _cfg(channels, image_size, (0.1307,), (0.3081,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.to_patch_embedding(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        for layer in self.transformer.layers:  # indexing, not unpacking: torch.jit.script takes this
            x = x + layer[0](x)
            x = x + layer[1](x)
        return self.mlp_head(x[:, 0])


# ---------------------------------------------------------------- kavishka-dot/shallow-vit-mnist


class _OneHead(nn.Module):
    """One attention head with its own bias-free key/query/value Linears. The source scales the scores
    by the model width (32) ** -0.5, not by the head width: kept, since the weights were trained so."""

    def __init__(self, dim: int, head_dim: int) -> None:
        super().__init__()
        self.key = nn.Linear(dim, head_dim, bias=False)
        self.query = nn.Linear(dim, head_dim, bias=False)
        self.value = nn.Linear(dim, head_dim, bias=False)
        self.scale = dim ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(self.query(x), self.key(x).transpose(-1, -2)) * self.scale
        return torch.matmul(torch.softmax(scores, dim=-1), self.value(x))


class _HeadList(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList(_OneHead(dim, dim // heads) for _ in range(heads))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))


class _KavishkaBlock(nn.Module):
    """A pre-norm block whose heads are separate modules (_HeadList), with a 4x MLP; kavishka-dot's uses ReLU,
    adrienmanciet-sys's the same block with GELU."""

    def __init__(self, dim: int, heads: int, act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.sa = _HeadList(dim, heads)
        self.ffwd = nn.Module()
        self.ffwd.net = nn.Sequential(nn.Linear(dim, 4 * dim), act(), nn.Linear(4 * dim, dim), nn.Dropout(0.0))
        self.ln1 = nn.LayerNorm(dim)
        self.ln2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd.net(self.ln2(x))


class KavishkaShallowViT(nn.Module):
    """MNIST, 1 channel, 28x28 cut into 16 patches of 7x7, no class token and no position table: a
    second Linear of the patch pixels is added as its "position embedding"; 3 pre-norm blocks of width 32
    with 4 hand-written heads of 8, ReLU MLP; the head runs on every token and the first token's output
    is the prediction. The source ends in a softmax (and reshapes to a fixed batch of 64); this class
    returns the logits before it, for any batch: same top-1.
    Checkpoint: models/vision_transformer.pth of kavishka-dot/shallow-vit-mnist (no licence stated)."""

    def __init__(self, patch_size: int = 7, dim: int = 32, depth: int = 3, heads: int = 4, num_classes: int = 10) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.encoder = nn.Linear(patch_size * patch_size, dim)
        self.pos_embedding = nn.Linear(patch_size * patch_size, dim)
        self.blocks = nn.Sequential(*(_KavishkaBlock(dim, heads) for _ in range(depth)))
        self.ln_f = nn.LayerNorm(dim)
        self.vit_head = nn.Linear(dim, num_classes)
        self.pretrained_cfg = _cfg(1, 28, (0.5,), (0.5,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p = self.patch_size
        # torch.Tensor.unfold on H then W, flattened per patch: rows of the (7, 7) patch, one channel
        rows = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)
        t = self.encoder(rows) + self.pos_embedding(rows)
        t = self.ln_f(self.blocks(t))
        return self.vit_head(t[:, 0])


# ---------------------------------------------------------------- GauravPBhagwat/Handwritten-Digit-Recognition...


class _Residual(nn.Module):
    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fn(x)


class _GeluMlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _ModelWidthScaledAttention(_FusedQkvAttention):
    """The early (2020) layout of this attention: heads split the model width and the scores are scaled
    by the model width ** -0.5 (not the head width)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__(dim, heads, dim // heads, out_in_sequential=False)
        self.scale = dim ** -0.5


class GauravMnistViT(nn.Module):
    """MNIST, 1 channel, 28x28: Linear patch embedding of 7x7 patches, class token, 6 blocks of width 64
    (residual around a pre-norm attention with 8 heads of 8, and around a pre-norm GELU MLP of 128), an
    MLP head (Linear, GELU, Linear) without a final LayerNorm.
    The repository's vit_mnist.py is a later, different model (a conv stem, 4x4 patches, 8 heads of 32)
    that this checkpoint does not fit; the layout here is read from the checkpoint's keys and shapes. Its
    head count is not in the file: measured on the MNIST test set, 8 heads (the published layout's default)
    give 97.94 % top-1; 16 give 96.40 %, 4 give 88.13 %, 2 give 58.77 %.
    Checkpoint: vit_mnist.pth of GauravPBhagwat/Handwritten-Digit-Recognition-Using-CNN-And-Vision-Transformer
    (no licence stated)."""

    def __init__(self, image_size: int = 28, patch_size: int = 7, dim: int = 64, depth: int = 6, heads: int = 8,
                 mlp_dim: int = 128, num_classes: int = 10) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.patch_to_embedding = nn.Linear(patch_size * patch_size, dim)
        self.pos_embedding = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, dim))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.transformer = nn.Module()
        self.transformer.layers = nn.ModuleList(
            nn.ModuleList([_Residual(_LnThen(dim, _ModelWidthScaledAttention(dim, heads))),
                           _Residual(_LnThen(dim, _GeluMlp(dim, mlp_dim)))])
            for _ in range(depth)
        )
        self.mlp_head = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, num_classes))
        self.pretrained_cfg = _cfg(1, image_size, (0.1307,), (0.3081,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_to_embedding(_to_patch_rows(x, self.patch_size))
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        for layer in self.transformer.layers:
            x = layer[1](layer[0](x))
        return self.mlp_head(x[:, 0])


# ---------------------------------------------------------------- smmk47/CIFAR10-Classification


class _ConvPatches(nn.Module):
    def __init__(self, channels: int, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class SmmkPostNormViT(nn.Module):
    """CIFAR-10, 3 channels, 32x32: conv patch embedding (4x4), class token, torch's
    nn.TransformerEncoder of 6 post-norm layers (width 128, 8 heads of 16, ReLU feed-forward of 256),
    head LayerNorm + Linear. Checkpoint: vit_cifar10.pth of smmk47/CIFAR10-Classification (no licence stated)."""

    def __init__(self, image_size: int = 32, patch_size: int = 4, dim: int = 128, depth: int = 6, heads: int = 8,
                 mlp_dim: int = 256, num_classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = _ConvPatches(3, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, dim))
        layer = nn.TransformerEncoderLayer(d_model=dim, nhead=heads, dim_feedforward=mlp_dim, dropout=0.0, batch_first=True)
        self.transformer = nn.TransformerEncoder(layer, num_layers=depth, enable_nested_tensor=False)
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))
        self.pretrained_cfg = _cfg(3, image_size, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.mlp_head(self.transformer(x)[:, 0])


# ---------------------------------------------------------------- AshuAhlawat/Convolutional-Transformer


class _AshuPatches(nn.Module):
    def __init__(self, dim: int, patch: int, enrich: bool) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        # a 3x3 convolution over the patch grid before the tokens are flattened (Identity: no weights)
        self.enrich = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1) if enrich else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.enrich(self.embed(x)).flatten(2).transpose(1, 2)


class _MhaBlock(nn.Module):
    """Pre-norm block around torch's nn.MultiheadAttention and a GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class AshuViT(nn.Module):
    """CIFAR-10, 3 channels, 32x32, pixels in [0, 1] (no normalisation): conv patch embedding (4x4),
    class token, 4 pre-norm blocks of width 64 with nn.MultiheadAttention (4 heads of 16) and a GELU
    MLP of 256, head LayerNorm + Linear. ``enrich=True`` adds the 3x3 convolution over the patch grid of
    the same repository's "convolution-enriched" model.
    Checkpoints: vit_model.pth and convt_model.pth of AshuAhlawat/Convolutional-Transformer (no licence stated)."""

    def __init__(self, enrich: bool = False, image_size: int = 32, patch_size: int = 4, dim: int = 64, depth: int = 4,
                 heads: int = 4, num_classes: int = 10) -> None:
        super().__init__()
        self.patch_embedding = _AshuPatches(dim, patch_size, enrich)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, dim))
        self.transformer_layers = nn.Sequential(*(_MhaBlock(dim, heads) for _ in range(depth)))
        self.out_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))
        self.pretrained_cfg = _cfg(3, image_size, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.out_head(self.transformer_layers(x)[:, 0])


class AshuConvEnrichedViT(AshuViT):
    """AshuViT with the convolution-enriched patch embedding (convt_model.pth)."""

    def __init__(self) -> None:
        super().__init__(enrich=True)


# ---------------------------------------------------------------- tintn/vision-transformer-from-scratch layout


class _TanhGelu(nn.Module):
    """GELU by its tanh approximation, as the source computes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class _TintnAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv_projection = nn.Linear(dim, 3 * dim)
        self.output_projection = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (_split_heads(t, self.heads) for t in self.qkv_projection(x).chunk(3, dim=-1))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return self.output_projection(_merge_heads(torch.matmul(torch.softmax(scores, dim=-1), v)))


class _TintnBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.attention = _TintnAttention(dim, heads)
        self.layernorm_1 = nn.LayerNorm(dim)
        self.mlp = nn.Module()
        self.mlp.dense_1 = nn.Linear(dim, hidden)
        self.mlp.activation = _TanhGelu()
        self.mlp.dense_2 = nn.Linear(hidden, dim)
        self.layernorm_2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.layernorm_1(x))
        m = self.mlp
        return x + m.dense_2(m.activation(m.dense_1(self.layernorm_2(x))))


class TintnViT(nn.Module):
    """CIFAR-10, 3 channels, 32x32, normalised with mean = std = 0.5: Hugging Face-style names
    (embedding.patch_embeddings.projection, encoder.blocks, classifier), conv patch embedding (4x4),
    4 pre-norm blocks of width 48 with 4 heads of 12, tanh-GELU MLP of 192, Linear head on the class
    token without a final LayerNorm. The source returns (logits, attentions); this class, the logits.
    Checkpoints: experiments/vit-with-10-epochs/model_final.pt of forks of
    tintn/vision-transformer-from-scratch (mayankmks12/Vision-transformer-: no licence stated;
    anzksdk/vision-transformer-from-scratch: MIT)."""

    def __init__(self, image_size: int = 32, patch_size: int = 4, dim: int = 48, depth: int = 4, heads: int = 4,
                 hidden: int = 192, num_classes: int = 10) -> None:
        super().__init__()
        self.embedding = nn.Module()
        self.embedding.patch_embeddings = nn.Module()
        self.embedding.patch_embeddings.projection = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.embedding.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.embedding.position_embeddings = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, dim))
        self.encoder = nn.Module()
        self.encoder.blocks = nn.ModuleList(_TintnBlock(dim, heads, hidden) for _ in range(depth))
        self.classifier = nn.Linear(dim, num_classes)
        self.pretrained_cfg = _cfg(3, image_size, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embedding
        x = e.patch_embeddings.projection(x).flatten(2).transpose(1, 2)
        x = torch.cat([e.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + e.position_embeddings
        for block in self.encoder.blocks:
            x = block(x)
        return self.classifier(x[:, 0])


# ---------------------------------------------------------------- Nik212/Compact-Convolutional-Transformer


class _NikAttention(nn.Module):
    """One in_proj Linear to q, k, v, heads computed one by one on slices of the width, scaled by head_dim ** -0.5."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.in_proj = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (_split_heads(t, self.heads) for t in self.in_proj(x).chunk(3, dim=-1))
        weights = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]), dim=-1)
        return self.out_proj(_merge_heads(torch.matmul(weights, v)))


class _NikBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.attention_pre_norm = nn.LayerNorm(dim)
        self.attention = _NikAttention(dim, heads)
        self.mlp_pre_norm = nn.LayerNorm(dim)
        # indices 0 and 3 hold the weights: Linear, GELU, Dropout, Linear, Dropout
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, dim), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_pre_norm(x))
        return x + self.mlp(self.mlp_pre_norm(x))


class NikCCT(nn.Module):
    """CIFAR-10, 3 channels, 32x32: a Compact Convolutional Transformer (CCT-4/3x1). Tokenizer: one bias-free 3x3
    convolution (stride 1) to width 128, ReLU, 3x3 max-pool of stride 2: 16x16 = 256 tokens, no class token; a
    learned position table; 4 pre-norm blocks with 4 heads of 32 and a GELU MLP of 256; LayerNorm, sequence pooling
    (softmax over the tokens of a Linear to 1, then the weighted sum) and a Linear head.
    The source's block adds ``attention(y)[0]``: the first image's attention output, broadcast to every image of the
    batch (it was trained and scored in batches of 50). This class adds each image's own attention output, which is
    the source's computation at batch 1 and does not depend on the batch. Its trained q/k projections are tiny
    (mean |w| 6e-5 in block 2): the attention contributes little.
    Checkpoint: model_checkpoint84_59.pt of Nik212/Compact-Convolutional-Transformer (no licence stated)."""

    def __init__(self, image_size: int = 32, dim: int = 128, depth: int = 4, heads: int = 4, mlp: int = 256,
                 num_classes: int = 10) -> None:
        super().__init__()
        self.tokenizer = nn.Module()
        self.tokenizer.tokenizer_layers = nn.Sequential(
            nn.Conv2d(3, dim, kernel_size=3, stride=1, padding=1, bias=False), nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
        self.positional_embeddings = nn.Parameter(torch.zeros(1, (image_size // 2) ** 2, dim))
        self.blocks = nn.Sequential(*(_NikBlock(dim, heads, mlp) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.pool = nn.Module()
        self.pool.attention_pool = nn.Linear(dim, 1)
        self.fc = nn.Linear(dim, num_classes)
        self.pretrained_cfg = _cfg(3, image_size, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tokenizer.tokenizer_layers(x).flatten(2).transpose(1, 2) + self.positional_embeddings
        x = self.norm(self.blocks(x))
        w = torch.softmax(self.pool.attention_pool(x), dim=1).transpose(1, 2)  # (B, 1, tokens)
        return self.fc(torch.matmul(w, x).squeeze(1))


# ---------------------------------------------------------------- adrienmanciet-sys/Vision_Transformers


# Heads as separate modules, each with bias-free key/query/value Linears of width head_dim, the scores scaled by the
# model width ** -0.5 (the source reads the width off its input), then a Linear projection: kavishka-dot's _HeadList.
# The blocks are kavishka-dot's with GELU.


class AdrienDeiT(nn.Module):
    """CIFAR-10, 3 channels, 32x32, normalised with mean = std = 0.5: a DeiT with a class token and a distillation
    token. Linear patch embedding of 4x4 patches (each flattened channel, row, column), a position table as an
    nn.Embedding of 66 rows, 4 pre-norm blocks of width 64 whose 4 heads of 16 each have their own key/query/value
    Linears (no final LayerNorm), GELU MLP of 256; the prediction is the mean of the class head on the class token
    and the distillation head on the distillation token (the source's evaluation output).
    Checkpoint: deit2.pth of adrienmanciet-sys/Vision_Transformers (no licence stated)."""

    def __init__(self, image_size: int = 32, patch_size: int = 4, dim: int = 64, depth: int = 4, heads: int = 4,
                 num_classes: int = 10) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj_layer = nn.Linear(3 * patch_size * patch_size, dim)
        self.pos_emb = nn.Embedding((image_size // patch_size) ** 2 + 2, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList(_KavishkaBlock(dim, heads, nn.GELU) for _ in range(depth))
        self.head_cls = nn.Linear(dim, num_classes)
        self.head_dist = nn.Linear(dim, num_classes)
        self.pretrained_cfg = _cfg(3, image_size, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p = self.patch_size
        # unfold over H then W, each patch flattened (channel, row, column)
        rows = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)
        t = self.proj_layer(rows)
        t = torch.cat([self.cls_token.expand(b, -1, -1), self.dist_token.expand(b, -1, -1), t], dim=1)
        t = t + self.pos_emb.weight[: t.shape[1]]
        for block in self.blocks:
            t = block(t)
        return (self.head_cls(t[:, 0]) + self.head_dist(t[:, 1])) / 2


# ---------------------------------------------------------------- squarezhong/EE340-Project1-Vision-Transformer


class _SquarezhongPostNormBlock(nn.Module):
    """Post-norm: x + attention(x), LayerNorm, + GELU MLP, LayerNorm; nn.MultiheadAttention, batch first."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attention(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.mlp(x))


class SquarezhongPostNormViT(nn.Module):
    """MNIST, 1 channel, 28x28, normalised with mean = std = 0.5: conv patch embedding (4x4), class token, 6
    post-norm blocks of width 128 around nn.MultiheadAttention (4 heads of 32) and a GELU MLP of 256, a final
    LayerNorm, then a head of Linear, tanh, Linear on the class token.
    Checkpoint: vision_transformer.pth of squarezhong/EE340-Project1-Vision-Transformer (no licence stated)."""

    def __init__(self, image_size: int = 28, patch_size: int = 4, dim: int = 128, depth: int = 6, heads: int = 4,
                 num_classes: int = 10) -> None:
        super().__init__()
        self.embedding = nn.Module()
        self.embedding.patch = nn.Conv2d(1, dim, kernel_size=patch_size, stride=patch_size)
        self.embedding.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.embedding.pos = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, dim))
        self.encoder = nn.Sequential(*(_SquarezhongPostNormBlock(dim, heads) for _ in range(depth)), nn.LayerNorm(dim))
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(dim, dim)
        self.mlp.fc2 = nn.Linear(dim, num_classes)
        self.pretrained_cfg = _cfg(1, image_size, (0.5,), (0.5,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embedding
        x = e.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([e.cls.expand(x.shape[0], -1, -1), x], dim=1) + e.pos
        x = self.encoder(x)[:, 0]
        return self.mlp.fc2(torch.tanh(self.mlp.fc1(x)))


# ---------------------------------------------------------------- agentzz1/transformer_poc


class _AgentzzBlock(nn.Module):
    """Post-norm: LayerNorm(x + attention(x)), LayerNorm(x + GELU feed-forward)."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ffn = nn.Module()
        self.ffn.fc1 = nn.Linear(dim, hidden)
        self.ffn.fc2 = nn.Linear(hidden, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.ffn.fc2(nn.functional.gelu(self.ffn.fc1(x))))


class AgentzzGapViT(nn.Module):
    """MNIST, 1 channel, 28x28: Linear patch embedding of 7x7 patches, no class token, a position table of 16,
    one post-norm block of width 32 with a single-head nn.MultiheadAttention and a GELU feed-forward of 64, a final
    LayerNorm, global average pooling over the tokens and a Linear head (the float model the repository trains
    before its FPGA quantisation).
    Checkpoint: mnist_vit.pth of agentzz1/transformer_poc (MIT)."""

    def __init__(self, patch_size: int = 7, dim: int = 32, heads: int = 1, hidden: int = 64, depth: int = 1,
                 num_classes: int = 10) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Linear(patch_size * patch_size, dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, (28 // patch_size) ** 2, dim))
        self.encoder = nn.Sequential(*(_AgentzzBlock(dim, heads, hidden) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.classifier = nn.Linear(dim, num_classes)
        self.pretrained_cfg = _cfg(1, 28, (0.1307,), (0.3081,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p = self.patch_size
        rows = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)
        x = self.encoder(self.patch_embed.proj(rows) + self.pos_embed)
        return self.classifier(self.norm(x).mean(dim=1))


# ---------------------------------------------------------------- sonjuhy/VLMStudy


class _SonjuhyAttention(nn.Module):
    """Three full-width Linear projections (query, key, value: one of each for the whole model width, as many
    tutorials write them) whose outputs go to an nn.MultiheadAttention as its separate query, key and value; that
    module projects them again with its own in_proj. Returns the attention output only."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.multihead_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.multihead_attention(self.query(x), self.key(x), self.value(x), need_weights=False)[0]


class _SonjuhyBlock(nn.Module):
    """Pre-norm with ONE LayerNorm used twice: x + attention(norm(x)), then x + MLP(norm(x)) with the same norm."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.multihead_attention = _SonjuhyAttention(dim, heads)
        self.FFL = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(0.0), nn.Linear(4 * dim, dim))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.multihead_attention(self.norm(x))
        return x + self.FFL(self.norm(x))


class SonjuhyQkvViT(nn.Module):
    """MNIST, 1 channel, 28x28, normalised with 0.1307/0.3081: conv patch embedding (7x7, width 49 = 7*7), class
    token, position table of 17, 5 pre-norm blocks (one shared LayerNorm per block) whose attention is separate
    full-width query/key/value Linear layers feeding nn.MultiheadAttention (7 heads of 7, batch first), GELU MLP of
    196, no final LayerNorm, Linear head on the class token (named "classifer" in the checkpoint).
    Checkpoint: vit_mnist_model.pth of sonjuhy/VLMStudy (MIT)."""

    def __init__(self, image_size: int = 28, patch_size: int = 7, heads: int = 7, depth: int = 5,
                 num_classes: int = 10) -> None:
        super().__init__()
        dim = patch_size * patch_size
        self.embedding = nn.Module()
        self.embedding.div_img = nn.Conv2d(1, dim, kernel_size=patch_size, stride=patch_size)
        self.embedding.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.embedding.position_div_imgs = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, dim))
        self.layers = nn.ModuleList(_SonjuhyBlock(dim, heads) for _ in range(depth))
        self.classifer = nn.Linear(dim, num_classes)
        self.pretrained_cfg = _cfg(1, image_size, (0.1307,), (0.3081,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embedding
        x = e.div_img(x).flatten(2).transpose(1, 2)
        x = torch.cat([e.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + e.position_div_imgs
        for layer in self.layers:
            x = layer(x)
        return self.classifer(x[:, 0])


# ---------------------------------------------------------------- mlde-ms/vision-transformer-from-scratch


class _TorchvisionStyleBlock(nn.Module):
    """torchvision's ViT encoder block layout: ln_1, nn.MultiheadAttention (batch first), residual; ln_2, MLP
    (Linear, GELU, Dropout, Linear, Dropout: weights at mlp.0 and mlp.3), residual. LayerNorm eps 1e-6."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp_dim, dim),
                                 nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        x = x + self.self_attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class MldeTorchvisionViT(nn.Module):
    """MNIST, 1 channel, 28x28, normalised with 0.1307/0.3081, in torchvision's VisionTransformer layout and names:
    conv_proj of 2x2 patches (14x14 = 196 tokens, 197 with the class token: the corpus's longest sequence), width
    64, 2 pre-norm blocks with 2 heads of 32 and a GELU MLP of 256, final LayerNorm, and a representation head
    (pre_logits Linear 64 -> 32, tanh, Linear 32 -> 10).
    Checkpoint: vit_weights.pth of mlde-ms/vision-transformer-from-scratch (no licence stated)."""

    def __init__(self, image_size: int = 28, patch_size: int = 2, dim: int = 64, depth: int = 2, heads: int = 2,
                 mlp_dim: int = 256, representation: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(1, dim, kernel_size=patch_size, stride=patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.encoder = nn.Module()
        self.encoder.pos_embedding = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, dim))
        self.encoder.layers = nn.Sequential()
        for i in range(depth):
            self.encoder.layers.add_module(f"encoder_layer_{i}", _TorchvisionStyleBlock(dim, heads, mlp_dim))
        self.encoder.ln = nn.LayerNorm(dim, eps=1e-6)
        self.heads = nn.Sequential()
        self.heads.add_module("pre_logits", nn.Linear(dim, representation))
        self.heads.add_module("act", nn.Tanh())
        self.heads.add_module("head", nn.Linear(representation, num_classes))
        self.pretrained_cfg = _cfg(1, image_size, (0.1307,), (0.3081,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.encoder.pos_embedding
        x = self.encoder.ln(self.encoder.layers(x))
        return self.heads(x[:, 0])


class _SeqFirstBlock(nn.Module):
    """Pre-norm block whose nn.MultiheadAttention keeps torch's default ``batch_first=False``: the tokens are
    turned to (sequence, batch, width) for the whole block and back. torch's fused attention path refuses a
    sequence-first module, so the attention runs as separate projections and matmuls. ReLU MLP."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.layer_norm_1 = nn.LayerNorm(dim)
        self.multi_head_attention = nn.MultiheadAttention(dim, heads)
        self.layer_norm_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.ReLU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(0, 1)
        y = self.layer_norm_1(x)
        x = x + self.multi_head_attention(y, y, y, need_weights=False)[0]
        x = x + self.mlp(self.layer_norm_2(x))
        return x.transpose(0, 1)


class _ProlaxmiHead(nn.Module):
    def __init__(self, dim: int, hidden: int, outputs: int) -> None:
        super().__init__()
        self.layer_norm_1 = nn.LayerNorm(dim)
        # two Linear layers with no activation between them
        self.mlp_head = nn.Sequential(nn.Linear(dim, hidden), nn.Linear(hidden, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_head(self.layer_norm_1(x))


class ProlaxmiSeqFirstViT(nn.Module):
    """MNIST, 1 channel, 28x28, normalised with 0.1307/0.3081: conv patch embedding (7x7, 16 tokens), class
    token, 6 pre-norm blocks of width 128 whose nn.MultiheadAttention is **sequence-first** (8 heads of 16,
    ``batch_first=False``, off torch's fast path), ReLU MLP 256, and a head of LayerNorm + two Linear layers
    (128 -> 256 -> 128) with no activation. The authors' head has 128 outputs, not 10: they trained it with
    cross-entropy over all 128 and take the argmax over all of them. This class returns outputs 0-9 (the
    digits); on the whole MNIST test set the argmax over 128 never falls outside 0-9 (the best of outputs
    10-127 stays at least 10.9 below the best digit), so top-1 is the same.
    Checkpoint: trained_vit_mnist.pth of pro-laxmi/Computer-Vision (README: MIT badge, no LICENSE file)."""

    def __init__(self, image_size: int = 28, patch_size: int = 7, dim: int = 128, depth: int = 6, heads: int = 8,
                 mlp_dim: int = 256) -> None:
        super().__init__()
        self.patch_embed = _ConvPatches(1, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, dim))
        self.transformer_blocks = nn.Sequential(*(_SeqFirstBlock(dim, heads, mlp_dim) for _ in range(depth)))
        self.mlp_head = _ProlaxmiHead(dim, mlp_dim, dim)
        self.pretrained_cfg = _cfg(1, image_size, (0.1307,), (0.3081,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.mlp_head(self.transformer_blocks(x)[:, 0])[:, :10]


# ---------------------------------------------------------------- Jason040114/FashionMnist-based-on-Transformer-CNN


class _ConvStem3(nn.Module):
    """Three 3x3 convolutions with ReLU, the first of stride 2 (1 -> 64 -> 64 -> 128 channels)."""

    def __init__(self, channels: int, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(64, 64, kernel_size=3, stride=1, padding=1)
        self.conv3 = nn.Conv2d(64, dim, kernel_size=3, stride=1, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv3(torch.relu(self.conv2(torch.relu(self.conv1(x))))))


class _GeluMlpDropoutSlots(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        # indices 0 and 3 hold the weights: Linear, GELU, Dropout, Linear, Dropout
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _TwoLinearReluHead(nn.Module):
    def __init__(self, dim: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(dim, hidden)
        self.linear2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(torch.relu(self.linear1(x)))


class JasonFashionHybridViT(nn.Module):
    """**Fashion-MNIST**, 1 channel, 28x28, **raw 0-255 pixels** (no scaling, no normalisation): a convolution
    stem (three 3x3 convolutions with ReLU, the first of stride 2) whose 14x14 feature map of 128 channels is
    the token sequence (196 tokens, the pixel grid of the stem: no patch embedding and **no position table**),
    a class token in front, 4 pre-norm blocks of width 128 with a bias-free fused qkv projection (4 heads of
    32), GELU MLP 256, no final LayerNorm, and a head of Linear 128 -> 64, ReLU, Linear 64 -> 10.
    Checkpoint: MyModel/Model_97.pth of Jason040114/FashionMnist-based-on-Transformer-CNN (no licence stated)."""

    def __init__(self, image_size: int = 28, channels: int = 1, dim: int = 128, depth: int = 4, heads: int = 4,
                 head_dim: int = 32, mlp_dim: int = 256, num_classes: int = 10) -> None:
        super().__init__()
        self.cnn = _ConvStem3(channels, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.transformer = nn.Module()
        self.transformer.layers = nn.ModuleList(
            nn.ModuleList([_LnThen(dim, _FusedQkvAttention(dim, heads, head_dim)),
                           _LnThen(dim, _GeluMlpDropoutSlots(dim, mlp_dim))])
            for _ in range(depth)
        )
        self.classifier = _TwoLinearReluHead(dim, 64, num_classes)
        # the authors feed float pixels 0-255: on vitedge's 0-1 scale that is mean 0 and std 1/255
        self.pretrained_cfg = _cfg(channels, image_size, (0.0,), (1.0 / 255.0,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cnn(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        for layer in self.transformer.layers:  # indexing, not unpacking: torch.jit.script takes this
            x = x + layer[0](x)
            x = x + layer[1](x)
        return self.classifier(x[:, 0])


# ---------------------------------------------------------------- Alessio-Olivieri/cv-proj2 (Tiny ImageNet, 64x64)


class _AlessioHead(nn.Module):
    """One head with its own biased key/query/value Linears (width -> head width), scores scaled by the head
    width ** -0.5."""

    def __init__(self, dim: int, head_dim: int) -> None:
        super().__init__()
        self.key = nn.Linear(dim, head_dim)
        self.query = nn.Linear(dim, head_dim)
        self.value = nn.Linear(dim, head_dim)
        self.scale = head_dim ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(self.query(x), self.key(x).transpose(-1, -2)) * self.scale
        return torch.matmul(torch.softmax(scores, dim=-1), self.value(x))


class _AlessioAttention(nn.Module):
    """All the block's heads are kept as modules (their weights are in the checkpoint), but only those in
    ``kept`` are computed, in index order, their outputs joined for an output projection as wide as the kept
    heads. A block that keeps no head adds zeros (the source returns a zero tensor of the input's shape and
    leaves its unused, unpruned output projection in the checkpoint)."""

    def __init__(self, dim: int, heads: int, kept: tuple[int, ...]) -> None:
        super().__init__()
        head_dim = dim // heads
        self.heads = nn.ModuleList(_AlessioHead(dim, head_dim) for _ in range(heads))
        self.keep = [i in kept for i in range(heads)]  # a list of bools, never empty: TorchScript infers its type
        self.any_head = bool(kept)
        self.output_projection = nn.Linear(head_dim * (len(kept) or heads), dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.any_head:
            return torch.zeros_like(x)
        outs = []
        for i, head in enumerate(self.heads):
            if self.keep[i]:
                outs.append(head(x))
        return self.output_projection(torch.cat(outs, dim=-1))


class _AlessioMlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.dense1 = nn.Linear(dim, hidden)
        self.dense2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense2(nn.functional.gelu(self.dense1(x)))


class _AlessioBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kept: tuple[int, ...], mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.attention = _AlessioAttention(dim, heads, kept)
        self.mlp = _AlessioMlp(dim, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(self.norm1(x)) + x
        return self.mlp(self.norm2(x)) + x


class _AlessioPatches(nn.Module):
    def __init__(self, dim: int, patch: int) -> None:
        super().__init__()
        self.projection = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x).flatten(2).transpose(1, 2)


class _AlessioEmbedding(nn.Module):
    def __init__(self, dim: int, patch: int, tokens: int) -> None:
        super().__init__()
        self.patch_embeddings = _AlessioPatches(dim, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.position_embeddings = nn.Parameter(torch.zeros(tokens + 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embeddings(x)
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.position_embeddings


class AlessioTinyImageNetViT(nn.Module):
    """**Tiny ImageNet**, 3 channels, **64x64** (no resize), ImageNet mean/std: a conv patch embedding of 8x8 patches
    (64 tokens + class token), position table, 6 pre-norm blocks of width 48 whose **8 heads of 6 each have their own
    biased query/key/value Linear** (48 -> 6), an output projection, GELU MLP 256, no final LayerNorm, the class token
    to a Linear head of 200 classes (Tiny ImageNet's, in the order of the Hugging Face copy the authors trained on;
    the corpus scores it on the 58 animal classes they trained it for, as argmax over all 200).
    Checkpoint: checkpoints/vit1 of Alessio-Olivieri/cv-proj2 at 83abcfd (a training checkpoint: the weights under
    'state_dict'; no licence stated)."""

    # the heads each block computes (the source's pruned_heads, which the checkpoint does not store): all here
    KEPT: tuple[tuple[int, ...], ...] = ((0, 1, 2, 3, 4, 5, 6, 7),) * 6

    def __init__(self, image_size: int = 64, patch_size: int = 8, dim: int = 48, heads: int = 8, mlp_dim: int = 256,
                 num_classes: int = 200) -> None:
        super().__init__()
        self.embedding = _AlessioEmbedding(dim, patch_size, (image_size // patch_size) ** 2)
        self.encoder = nn.Module()
        self.encoder.blocks = nn.ModuleList(_AlessioBlock(dim, heads, kept, mlp_dim) for kept in self.KEPT)
        self.classifier = nn.Linear(dim, num_classes)
        self.pretrained_cfg = _cfg(3, image_size, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embedding(x)
        for block in self.encoder.blocks:
            x = block(x)
        return self.classifier(x[:, 0])


class AlessioTinyImageNetPrunedViT(AlessioTinyImageNetViT):
    """As AlessioTinyImageNetViT, **heads pruned**: width 64 (8 heads of 8), a head of the 58 animal classes, and
    per block only the heads its authors kept: blocks 0, 1 and 3 compute 2, 4 and 1 heads (the output projection
    narrowed to 16, 32 and 8 inputs), **blocks 2, 4 and 5 none** (their attention adds zeros: the block is its MLP
    alone). The source marks pruned heads in a set the checkpoint does not store; the kept heads are the ones whose
    query bias is not zero (the pruned ones keep their initial weights and zero biases, and their count per block
    matches the output projection's width: tests/models/test_corpus_tiny_imagenet.py).
    Checkpoint: checkpoints/pruned_001_vit_fine.pth of Alessio-Olivieri/cv-proj2 at 9258dfa (no licence stated)."""

    KEPT = ((2, 5), (1, 2, 4, 7), (), (1,), (), ())

    def __init__(self, image_size: int = 64, patch_size: int = 8, dim: int = 64, heads: int = 8, mlp_dim: int = 256,
                 num_classes: int = 58) -> None:
        super().__init__(image_size, patch_size, dim, heads, mlp_dim, num_classes)
