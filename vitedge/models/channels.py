"""Input channels and input size of a built model, read from its own weights.

A ViT says how many channels it takes in its patch embedding (the first convolution's
weight is (width, channels, k, k)) and what size it was trained for in its position
embedding ((1, prefix + grid_h * grid_w, width)) with the patch kernel, or, when patches
are flattened and projected by a Linear, with that Linear's fan-in (channels * k * k). These readers
serve TorchScript files, ``torch.export`` programs and modules of classes vitedge does
not know; a forward pass then checks what they found.
"""

from __future__ import annotations

import math
from typing import Any

PROBE_CHANNELS = (3, 1, 4, 2)  # tried in this order when the weights do not say


def _float_tensors(sd: dict[str, Any], ndim: int) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in sd.items() if getattr(v, "ndim", None) == ndim and getattr(v, "is_floating_point", lambda: False)()]


def _first_square_conv(sd: dict[str, Any]) -> Any:
    """The weight of the first convolution whose kernel is square, or None."""
    return next((w for _, w in _float_tensors(sd, 4) if int(w.shape[-1]) == int(w.shape[-2])), None)


def patch_conv(sd: dict[str, Any]) -> tuple[int, int] | None:
    """(input channels, kernel) of the first convolution whose kernel is square: the patch
    embedding of a plain ViT, the stem of a hybrid (whose input channels are the model's too)."""
    w = _first_square_conv(sd)
    return None if w is None else (int(w.shape[1]), int(w.shape[-1]))


def channels_from_weights(sd: dict[str, Any]) -> int | None:
    conv = patch_conv(sd)
    return conv[0] if conv else None


def patch_linear(sd: dict[str, Any], width: int) -> tuple[int, int] | None:
    """(input channels, patch side) of a Linear patch embedding: the first 2-D weight that maps
    channels * side * side pixels (1 or 3 channels) to the model width. A ViT without a convolution
    flattens each patch and projects it with a Linear, so that Linear's fan-in fixes the patch side
    (no integer is both a square and three times a square, so the channel count is never ambiguous)."""
    for _, w in _float_tensors(sd, 2):
        out_features, fan_in = int(w.shape[0]), int(w.shape[1])
        if out_features != width:
            continue
        for channels in (1, 3):
            side = math.isqrt(fan_in // channels) if fan_in % channels == 0 else 0
            if side > 1 and side * side * channels == fan_in:
                return channels, side
    return None


_NOT_A_POSITION_TABLE = ("relative", "bias", "index")  # Swin's relative-position bias tables and their indices


def position_tables(sd: dict[str, Any]) -> list[tuple[int, int, bool]]:
    """(tokens, width, 2-D) of the learned position tables: ``(1, tokens, width)`` parameters named for positions,
    and where there is none, 2-D ``(tokens, width)`` ones (an ``nn.Embedding`` of positions, or a parameter kept
    without its batch axis), which the caller checks against the patch embedding's width."""
    three = [(int(v.shape[1]), int(v.shape[2]), False) for k, v in _float_tensors(sd, 3)
             if "pos" in k.lower() and int(v.shape[0]) == 1]
    if three:
        return three
    return [(int(v.shape[0]), int(v.shape[1]), True) for k, v in _float_tensors(sd, 2)
            if "pos" in k.lower() and not any(w in k.lower() for w in _NOT_A_POSITION_TABLE)]


def conv_makes_width(sd: dict[str, Any], width: int) -> bool:
    """Some convolution of the weights outputs ``width`` channels (a tokenizer's last convolution, a patch embedding)."""
    return any(int(w.shape[0]) == width for _, w in _float_tensors(sd, 4))


def _patch_side(sd: dict[str, Any], width: int, two_d: bool) -> int | None:
    """The patch side of the convolutional (square kernel) or Linear patch embedding; for a 2-D position table only
    one whose output width is the table's, so no other 2-D weight named for positions is read as one."""
    conv = _first_square_conv(sd)
    if conv is not None:
        return int(conv.shape[-1]) if not two_d or int(conv.shape[0]) == width else None
    linear = patch_linear(sd, width)
    return linear[1] if linear is not None else None


def input_size_from_weights(sd: dict[str, Any], prefix_tokens: int | None = None) -> tuple[int, int] | None:
    """The square input size the position embedding and the patch kernel were made for,
    or None when the weights cannot say (no conv or Linear patch embedding, no position table (3-D, or 2-D of
    the patch embedding's width), or a token count that is not prefix + a square grid)."""
    tables = position_tables(sd)
    if not tables:
        return None
    tokens, width, two_d = tables[0]
    patch = _patch_side(sd, width, two_d)
    if patch is None:
        return None
    candidates = ([prefix_tokens] if prefix_tokens is not None else []) + [1, 0, 2, 5]
    for prefix in candidates:
        side = math.isqrt(max(tokens - prefix, 0))
        if side > 0 and side * side == tokens - prefix:
            return (side * patch, side * patch)
    return None


def module_channels(module, sd: dict[str, Any], cfg: Any, kwargs: dict[str, Any], example_shape) -> tuple[int | None, str]:
    """The model's input channels and where that came from (None: only a forward pass can tell)."""
    if example_shape is not None and len(example_shape) == 4:
        return int(example_shape[1]), "the exported program's input"
    for key in ("in_chans", "channels", "num_channels", "in_channels"):
        if isinstance(kwargs.get(key), int):
            return int(kwargs[key]), f"model kwargs {key}"
    found = channels_from_weights(sd)
    if found is not None:
        return found, "the patch-embedding weights"
    if isinstance(cfg, dict) and cfg.get("input_size") and len(cfg["input_size"]) == 3:
        return int(cfg["input_size"][0]), "pretrained_cfg input_size"
    return None, ""
