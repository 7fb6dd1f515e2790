"""Recognise a ViT from its state_dict keys and tensor shapes.

Two layouts are read (timm's, which DeiT and most training code share, and
torchvision's); a state_dict that is not a ViT gets a one-line error naming what it
looks like instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vitedge.core.errors import ModelLoadError
from vitedge.models.loading import count_indices
from vitedge.models.timm_arch import closest_archs, format_matches


@dataclass
class Layout:
    family: str  # timm or torchvision
    variant: str  # vit, deit-distilled, hybrid-resnet
    patch_size: int
    embed_dim: int
    depth: int
    mlp_dim: int
    num_classes: int  # 0 = encoder without a classification head
    grid: tuple[int, int]  # patch grid the position embedding was trained for
    num_prefix_tokens: int
    timm_kwargs: dict[str, Any] = field(default_factory=dict)
    representation_size: int | None = None  # torchvision pre-logits layer


def _square_grid(tokens: int) -> tuple[int, int] | None:
    side = math.isqrt(tokens)
    return (side, side) if side * side == tokens and side > 0 else None


def infer_layout(sd: dict[str, Any], where: str) -> Layout:
    if "conv_proj.weight" in sd and any(k.startswith("encoder.layers.") for k in sd):
        return _torchvision_layout(sd, where)
    if any(k.startswith("blocks.0.") for k in sd) and ("pos_embed" in sd or "patch_embed.proj.weight" in sd):
        return _timm_layout(sd, where)
    raise ModelLoadError(_not_a_vit_message(sd, where))


def _not_a_vit_message(sd: dict[str, Any], where: str) -> str:
    keys = list(sd)
    has = lambda *prefixes: any(k.startswith(prefixes) for k in keys)  # noqa: E731
    if has("layer1.", "layer4.") and "fc.weight" in sd:
        what = "a ResNet-style CNN (keys conv1, layer1..layer4, fc)"
    elif has("features.") and has("classifier."):
        what = "a CNN with features/classifier blocks (VGG, MobileNet, EfficientNet style)"
    elif "conv_stem.weight" in sd:
        what = "an EfficientNet/MobileNet-style CNN (timm keys conv_stem, blocks, conv_head)"
    elif any(".conv_dw." in k for k in keys) and has("stem.", "stages."):
        what = "a ConvNeXt-style CNN (keys stem, stages.N.blocks.M.conv_dw)"
    elif not any(("attn" in k or "attention" in k or "qkv" in k) for k in keys) and any(getattr(v, "ndim", 0) == 4 for v in sd.values()):
        convs = sum(1 for v in sd.values() if getattr(v, "ndim", 0) == 4)
        what = f"a convolutional network ({convs} convolution weights and no attention layer)"
    elif any(("word_embeddings" in k or k.startswith(("wte.", "transformer.wte")) or "embed_tokens" in k) for k in keys):
        what = "a text model (it has a token-embedding table)"
    elif has("vit.", "deit.", "embeddings.patch_embeddings."):
        what = "a Hugging Face ViT state_dict"
        return f"{where}: found {what}; pass the model folder with its config.json instead of the weights file alone"
    else:
        what = f"a state_dict of {len(keys)} tensors that matches no known ViT layout (first keys: {', '.join(keys[:4])})"

        best = closest_archs(sd)
        hint = f"; closest timm architectures (pass one as --arch NAME): {format_matches(best)}" if best else ""
        return f"{where}: found {what}{hint}; if it is your own ViT class, pass --model-class path/to/file.py:ClassName"
    return f"{where}: found {what}, not a Vision Transformer; vitedge deploys ViT/DeiT models"


def _timm_layout(sd: dict[str, Any], where: str) -> Layout:
    hybrid = any(k.startswith("patch_embed.backbone.") for k in sd)
    proj = sd.get("patch_embed.proj.weight")
    if proj is None or proj.ndim != 4:
        raise ModelLoadError(f"{where}: timm-style ViT without a patch_embed.proj convolution weight; the file looks damaged")
    embed_dim = int(proj.shape[0])
    patch = int(proj.shape[-1])
    if hybrid:
        # The ResNet stem downsamples 16x (s16) or 32x (s32); the 1x1 projection follows it.
        patch = _hybrid_stride(sd) * patch
    depth = count_indices(sd, r"blocks\.(\d+)\.")
    fc1 = sd.get("blocks.0.mlp.fc1.weight")
    mlp_dim = int(fc1.shape[0]) if fc1 is not None else 4 * embed_dim
    has_cls = "cls_token" in sd
    has_dist = "dist_token" in sd
    reg = int(sd["reg_token"].shape[1]) if "reg_token" in sd else 0
    prefix = int(has_cls) + int(has_dist) + reg
    pos = sd.get("pos_embed")
    no_embed_class = False
    grid = None
    if pos is not None:
        tokens = int(pos.shape[1])
        grid = _square_grid(tokens - prefix)
        if grid is None and prefix and _square_grid(tokens):
            grid, no_embed_class = _square_grid(tokens), True
    if grid is None:
        raise ModelLoadError(
            f"{where}: cannot read the patch grid from pos_embed {tuple(pos.shape) if pos is not None else None}; "
            "pass --arch NAME or --input-size H W"
        )
    head = sd.get("head.weight")
    num_classes = int(head.shape[0]) if head is not None else 0
    kwargs: dict[str, Any] = {
        "patch_size": int(proj.shape[-1]),
        "embed_dim": embed_dim,
        "depth": depth,
        "mlp_ratio": mlp_dim / embed_dim,
        "qkv_bias": "blocks.0.attn.qkv.bias" in sd,
        "num_classes": num_classes,
        "class_token": has_cls,
        "no_embed_class": no_embed_class,
        "reg_tokens": reg,
        "in_chans": int(proj.shape[1]) if not hybrid else 3,
    }
    if "blocks.0.ls1.gamma" in sd:
        kwargs["init_values"] = 1e-5  # the values themselves come from the checkpoint
    if "norm_pre.weight" in sd:
        kwargs["pre_norm"] = True
    if "fc_norm.weight" in sd:
        kwargs["global_pool"] = "avg"
        kwargs["fc_norm"] = True
    elif not has_cls:
        kwargs["global_pool"] = "avg"
    if "attn_pool.latent" in sd:  # MAP attention-pool head (SigLIP): pools all tokens, fc_norm only if present
        kwargs["global_pool"], kwargs["fc_norm"] = "map", "fc_norm.weight" in sd
    if "blocks.0.attn.q_norm.weight" in sd:
        kwargs["qk_norm"] = True
    variant = "hybrid-resnet" if hybrid else ("deit-distilled" if has_dist else "vit")
    return Layout("timm", variant, patch, embed_dim, depth, mlp_dim, num_classes, grid, prefix, kwargs)


def _hybrid_stride(sd: dict[str, Any]) -> int:
    stages = count_indices(sd, r"patch_embed\.backbone\.stages\.(\d+)\.")
    # stem /4, then every stage after the first halves the resolution.
    return 4 * 2 ** max(stages - 1, 0) if stages else 16


def _torchvision_layout(sd: dict[str, Any], where: str) -> Layout:
    proj = sd["conv_proj.weight"]
    embed_dim, patch = int(proj.shape[0]), int(proj.shape[-1])
    depth = count_indices(sd, r"encoder\.layers\.encoder_layer_(\d+)\.")
    mlp_key = next((k for k in ("encoder.layers.encoder_layer_0.mlp.0.weight", "encoder.layers.encoder_layer_0.mlp.linear_1.weight") if k in sd), None)
    mlp_dim = int(sd[mlp_key].shape[0]) if mlp_key else 4 * embed_dim
    pos = sd.get("encoder.pos_embedding")
    grid = _square_grid(int(pos.shape[1]) - 1) if pos is not None else None
    if grid is None:
        raise ModelLoadError(f"{where}: cannot read the patch grid from encoder.pos_embedding; the file looks damaged")
    head = sd.get("heads.head.weight")
    num_classes = int(head.shape[0]) if head is not None else 0
    rep = sd.get("heads.pre_logits.weight")
    return Layout(
        "torchvision", "vit", patch, embed_dim, depth, mlp_dim, num_classes, grid, 1,
        representation_size=int(rep.shape[0]) if rep is not None else None,
    )
