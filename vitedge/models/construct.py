"""Build torch modules from a recognised layout, a user's own class, or a hub folder."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.models.layouts import Layout
from vitedge.models.loading import load_strict, require_library
from vitedge.models.user_code import import_user_file


def resample_pos_embed(pos_embed, old_grid: tuple[int, int], new_grid: tuple[int, int], num_prefix: int):
    """Interpolate a learned position embedding in 2D (bicubic), as the ViT paper does
    when fine-tuning at a higher resolution. Prefix tokens (class, distillation) keep
    their embeddings."""
    import torch
    import torch.nn.functional as F

    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    dim = grid.shape[-1]
    grid = grid.reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim).to(pos_embed.dtype)
    return torch.cat([prefix, grid], dim=1)


def build_timm(layout: Layout, sd: dict[str, Any], *, num_heads: int, image_size: tuple[int, int], hybrid_name: str | None, where: str):
    require_library("timm", "timm (to build timm / DeiT ViTs)", "models")
    import timm
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    if layout.variant == "hybrid-resnet":
        assert hybrid_name is not None
        module = timm.create_model(hybrid_name, pretrained=False, num_classes=layout.num_classes, img_size=image_size)
    else:
        kwargs = dict(layout.timm_kwargs, num_heads=num_heads, img_size=image_size)
        cls = VisionTransformerDistilled if layout.variant == "deit-distilled" else VisionTransformer
        module = cls(**kwargs)
    return load_strict(module, sd, where)


def find_hybrid_arch(sd: dict[str, Any], where: str) -> str:
    """The timm hybrid (ResNet stem + ViT) whose backbone and blocks have these exact shapes."""
    require_library("timm", "timm (to build hybrid ResNet+ViT models)", "models")
    import timm
    import torch

    ignore = ("pos_embed", "head.weight", "head.bias")
    want = {k: tuple(v.shape) for k, v in sd.items() if k not in ignore}
    names = sorted(set(timm.list_models("vit_*_r*_s*") + timm.list_models("vit_*_resnet*") + timm.list_models("vit_tiny_r_s16_p8*")))
    for name in names:
        try:
            with torch.device("meta"):
                m = timm.create_model(name, pretrained=False)
        except Exception:  # some hub-only configs cannot be built offline
            continue
        got = {k: tuple(v.shape) for k, v in m.state_dict().items() if k not in ignore}
        if got == want:
            return name
    raise ModelLoadError(f"{where}: a hybrid ResNet+ViT whose shapes match no timm model; pass --arch NAME")


def hybrid_patch_size(name: str) -> int:
    """Pixels per token of a hybrid: the ResNet stem's stride times the projection's kernel."""
    import timm
    import torch

    with torch.device("meta"):
        m = timm.create_model(name, pretrained=False)
    return int(m.patch_embed.img_size[0]) // int(m.patch_embed.grid_size[0])


def build_torchvision(layout: Layout, sd: dict[str, Any], *, num_heads: int, image_size: tuple[int, int], where: str):
    require_library("torchvision", "torchvision (to build torchvision ViTs)", "models")
    import torch
    from torchvision.models.vision_transformer import VisionTransformer

    if image_size[0] != image_size[1]:
        raise UsageError(f"torchvision's VisionTransformer takes square inputs only; got --input-size {image_size[0]} {image_size[1]}")
    module = VisionTransformer(
        image_size=image_size[0],
        patch_size=layout.patch_size,
        num_layers=layout.depth,
        num_heads=num_heads,
        hidden_dim=layout.embed_dim,
        mlp_dim=layout.mlp_dim,
        num_classes=max(layout.num_classes, 1),
        representation_size=layout.representation_size,
    )
    conv = sd.get("conv_proj.weight")
    if conv is not None and int(conv.shape[1]) != 3:  # torchvision builds RGB only: re-make the patch embedding
        module.conv_proj = torch.nn.Conv2d(int(conv.shape[1]), layout.embed_dim, kernel_size=layout.patch_size, stride=layout.patch_size)
    if layout.num_classes == 0:
        module.heads = torch.nn.Identity()  # encoder: the class-token embedding is the output
    return load_strict(module, sd, where)


def build_custom(spec: str, kwargs: dict[str, Any], sd: dict[str, Any] | None, where: str):
    """`--model-class path/to/file.py:ClassName` with `--model-kwargs JSON`."""
    import torch

    file_part, sep, class_name = spec.rpartition(":")
    if not sep or not file_part or not class_name:
        raise UsageError(f"--model-class must look like path/to/file.py:ClassName, got '{spec}'")
    path = Path(file_part)
    if not path.is_file():
        raise UsageError(f"--model-class file {path} does not exist")
    mod_name = f"vitedge_user_model_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UsageError(f"--model-class: cannot import {path} as Python")
    module_obj = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module_obj

    import_user_file(loader_spec.loader, module_obj, path)
    cls = getattr(module_obj, class_name, None)
    if cls is None:
        raise UsageError(f"--model-class: {path} defines no '{class_name}'")
    try:
        model = cls(**kwargs)
    except SystemExit as err:
        raise UsageError(f"--model-class: {class_name}(...) in {path} called sys.exit({err.code!r}); a model class must not exit") from None
    except TypeError as err:
        raise UsageError(f"--model-class: {class_name}(**{json.dumps(kwargs)}) failed: {err}; fix --model-kwargs") from err
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"--model-class: {class_name} is not a torch.nn.Module")
    if sd is not None:
        load_strict(model, sd, where)
    return model.eval()
