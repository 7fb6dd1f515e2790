"""Named ViT configurations (the paper's table 1 and its successors).

A preset fills in what a state_dict cannot say (head count) and the preprocessing the
published weights were trained with. timm names are used because they are the names
users know; `--arch` takes any of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from vitedge.core.errors import UsageError
from vitedge.bundle.spec import IMAGENET_MEAN, IMAGENET_STD, Preprocess

INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ArchPreset:
    name: str
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    image_size: int = 224
    variant: str = "vit"  # vit, deit-distilled, hybrid-resnet
    preprocess: Preprocess = Preprocess()


_VIT_PRE = Preprocess(crop_size=(224, 224), crop_pct=0.9, interpolation="bicubic", mean=INCEPTION_MEAN, std=INCEPTION_STD)
_VIT_PRE_384 = Preprocess(crop_size=(384, 384), crop_pct=1.0, interpolation="bicubic", mean=INCEPTION_MEAN, std=INCEPTION_STD)
_DEIT_PRE = Preprocess(crop_size=(224, 224), crop_pct=0.875, interpolation="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD)
_TV_PRE = Preprocess(crop_size=(224, 224), crop_pct=224 / 256, interpolation="bilinear", mean=IMAGENET_MEAN, std=IMAGENET_STD)


def _p(name, patch, dim, depth, heads, size=224, variant="vit", pre=_VIT_PRE):
    return ArchPreset(name, patch, dim, depth, heads, size, variant, pre)


PRESETS: dict[str, ArchPreset] = {
    p.name: p
    for p in [
        _p("vit_tiny_patch16_224", 16, 192, 12, 3),
        _p("vit_small_patch16_224", 16, 384, 12, 6),
        _p("vit_small_patch32_224", 32, 384, 12, 6),
        _p("vit_base_patch16_224", 16, 768, 12, 12),
        _p("vit_base_patch32_224", 32, 768, 12, 12),
        _p("vit_base_patch16_384", 16, 768, 12, 12, 384, pre=_VIT_PRE_384),
        _p("vit_base_patch32_384", 32, 768, 12, 12, 384, pre=_VIT_PRE_384),
        _p("vit_large_patch16_224", 16, 1024, 24, 16),
        _p("vit_large_patch16_384", 16, 1024, 24, 16, 384, pre=_VIT_PRE_384),
        _p("vit_large_patch32_384", 32, 1024, 24, 16, 384, pre=_VIT_PRE_384),
        _p("vit_huge_patch14_224", 14, 1280, 32, 16),
        _p("deit_tiny_patch16_224", 16, 192, 12, 3, pre=_DEIT_PRE),
        _p("deit_small_patch16_224", 16, 384, 12, 6, pre=_DEIT_PRE),
        _p("deit_base_patch16_224", 16, 768, 12, 12, pre=_DEIT_PRE),
        _p("deit_base_patch16_384", 16, 768, 12, 12, 384, pre=Preprocess((384, 384), 1.0, "bicubic", IMAGENET_MEAN, IMAGENET_STD)),
        _p("deit_tiny_distilled_patch16_224", 16, 192, 12, 3, variant="deit-distilled", pre=_DEIT_PRE),
        _p("deit_small_distilled_patch16_224", 16, 384, 12, 6, variant="deit-distilled", pre=_DEIT_PRE),
        _p("deit_base_distilled_patch16_224", 16, 768, 12, 12, variant="deit-distilled", pre=_DEIT_PRE),
        _p("vit_base_r50_s16_224", 16, 768, 12, 12, variant="hybrid-resnet"),
        _p("vit_base_r50_s16_384", 16, 768, 12, 12, 384, variant="hybrid-resnet", pre=_VIT_PRE_384),
        _p("vit_small_r26_s32_224", 32, 384, 12, 6, variant="hybrid-resnet"),
        _p("vit_tiny_r_s16_p8_224", 8, 192, 12, 3, variant="hybrid-resnet"),
        # torchvision names, so `--arch vit_b_16` works too.
        _p("vit_b_16", 16, 768, 12, 12, pre=_TV_PRE),
        _p("vit_b_32", 32, 768, 12, 12, pre=_TV_PRE),
        _p("vit_l_16", 16, 1024, 24, 16, pre=_TV_PRE),
        _p("vit_l_32", 32, 1024, 24, 16, pre=_TV_PRE),
        _p("vit_h_14", 14, 1280, 32, 16, pre=Preprocess((518, 518), 1.0, "bicubic", IMAGENET_MEAN, IMAGENET_STD)),
    ]
}

# Every published ViT of these widths uses this many heads (ViT-Ti/S/B/L/H, DeiT).
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


def get_preset(name: str) -> ArchPreset:

    try:
        return PRESETS[name]
    except KeyError:
        close = sorted(n for n in PRESETS if name.split("_")[0] in n)[:6]
        hint = f"; similar: {', '.join(close)}" if close else ""
        raise UsageError(f"unknown --arch '{name}'{hint}; `vitedge inspect --list-archs` lists them") from None


def match_preset(*, embed_dim: int, depth: int, patch_size: int | None, image_size: int | None, variant: str) -> ArchPreset | None:
    """The preset with exactly these shapes, preferring the same variant and image size."""
    hits = [
        p
        for p in PRESETS.values()
        if p.embed_dim == embed_dim and p.depth == depth and (patch_size is None or p.patch_size == patch_size) and p.variant == variant
    ]
    hits.sort(key=lambda p: (p.image_size != image_size, p.name.startswith("vit_") is False and variant == "vit", p.name))
    return hits[0] if hits else None
