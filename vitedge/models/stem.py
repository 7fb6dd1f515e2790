"""The input size of a ViT whose tokens come from a convolutional stem, read from the module.

A plain ViT's patch embedding is one convolution whose kernel equals its stride, so the input side is
the patch side times the position grid. A Compact Convolutional Transformer (CCT) and other conv
tokenizers stack convolutions and poolings with their own kernels, strides and padding (a stride-2 conv
and a stride-2 max-pool turn 32x32 images into 8x8 tokens), so the first kernel says nothing of the
input size. Here the stem is walked: every ``Conv2d``, ``MaxPool2d`` and ``AvgPool2d`` before the first
token layer (``Linear``, attention, ``LayerNorm``), in the order the module declares them. Each layer's
output side comes from PyTorch's formula, and the input sides whose stem output is the position grid are
the candidates. The multiple of the stem's total stride is taken when it is one of them. Otherwise the
caller lists the candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StemLayer:
    kernel: int
    stride: int
    padding: int
    dilation: int = 1
    ceil_mode: bool = False

    def side(self, h: int) -> int:
        """PyTorch's output side of this layer for an input side ``h`` (0 when nothing is left)."""
        span = h + 2 * self.padding - self.dilation * (self.kernel - 1) - 1
        if span < 0:
            return 0
        out = (math.ceil if self.ceil_mode else math.floor)(span / self.stride) + 1
        if self.ceil_mode and (out - 1) * self.stride >= h + self.padding:  # PyTorch: the last window starts inside
            out -= 1
        return int(out)


@dataclass(frozen=True)
class StemSize:
    """What the stem says: the input side it takes (None when it cannot tell one), the sides whose tokens fill the
    position grid, the stem's total stride and the grid side."""

    side: int | None
    candidates: tuple[int, ...]
    stride: int
    grid: int


def _first(v: object) -> int:
    return int(v[0] if isinstance(v, (tuple, list)) else v)


def stem_layers(module: object) -> list[StemLayer]:
    """The stem's spatial layers, up to the first token layer; [] for a module that is not an nn.Module or has no
    square convolution or pooling first."""
    import torch
    from torch import nn

    if not isinstance(module, nn.Module) or isinstance(module, torch.jit.ScriptModule):
        return []
    layers = []
    for _, m in module.named_modules():
        if isinstance(m, (nn.Linear, nn.MultiheadAttention, nn.LayerNorm, nn.TransformerEncoderLayer)):
            break
        if isinstance(m, nn.Conv2d):
            if m.kernel_size[0] != m.kernel_size[1] or m.stride[0] != m.stride[1] or isinstance(m.padding, str):
                return []
            layers.append(StemLayer(_first(m.kernel_size), _first(m.stride), _first(m.padding), _first(m.dilation)))
        elif isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
            stride = m.stride if m.stride is not None else m.kernel_size
            dilation = getattr(m, "dilation", 1)
            layers.append(StemLayer(_first(m.kernel_size), _first(stride), _first(m.padding), _first(dilation), bool(m.ceil_mode)))
    return layers


def stem_input_size(layers: list[StemLayer], tokens: int, prefixes: tuple[int, ...]) -> StemSize | None:
    """The square input side whose stem output, flattened, is ``tokens`` minus a prefix (class tokens), the first
    prefix in ``prefixes`` that leaves a square; None when the stem is one patch convolution (kernel = stride: the
    plain rule applies) or nothing fits."""
    if not layers or (len(layers) == 1 and layers[0].kernel == layers[0].stride and not layers[0].padding):
        return None
    stride = math.prod(layer.stride for layer in layers)
    for prefix in prefixes:
        grid = math.isqrt(max(tokens - prefix, 0))
        if grid <= 0 or grid * grid != tokens - prefix:
            continue
        found = tuple(h for h in range(max(1, (grid - 2) * stride), (grid + 2) * stride + 1) if _out_side(layers, h) == grid)
        if found:
            side = grid * stride if grid * stride in found else (found[0] if len(found) == 1 else None)
            return StemSize(side, found, stride, grid)
    return None


def _out_side(layers: list[StemLayer], h: int) -> int:
    for layer in layers:
        h = layer.side(h)
    return h


def candidates_text(size: StemSize) -> str:
    """"24, 25, 26 or 27": the candidate sides, for a message (ranges shortened)."""
    sides = list(size.candidates)
    if len(sides) > 6:
        return f"{sides[0]} to {sides[-1]}"
    return ", ".join(map(str, sides[:-1])) + (" or " if len(sides) > 1 else "") + str(sides[-1])
