"""The intake of a state_dict: a custom class (--model-class), a timm architecture (--arch), a family
that models/architectures recognises, or a plain timm / torchvision ViT read off its keys (a preset,
the heads, the input size and a position table resampled to it).
"""

from __future__ import annotations

from typing import Any

from vitedge.bundle.spec import IMAGENET_MEAN, IMAGENET_STD, SOURCE_DEFAULT, SOURCE_FILE, SOURCE_FLAG, SOURCE_PRESET, ModelSpec
from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.models import architectures as families, checks, construct as build
from vitedge.models import channels as chan
from vitedge.models.formats import RawModel
from vitedge.models.intake_module import from_module
from vitedge.models.intake_spec import apply_preprocess_flags, preprocess_from_cfg, read_class_names, resolve_preprocess
from vitedge.models.intake_types import IntakeOptions, LoadedModel
from vitedge.models.layouts import Layout, infer_layout
from vitedge.models.presets import HEADS_BY_WIDTH, PRESETS, ArchPreset, get_preset, match_preset
from vitedge.models.timm_arch import load_timm_arch


def load_state_dict_checkpoint(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    import torch

    sd = raw.state_dict
    assert sd is not None
    where = str(raw.path)
    meta = raw.meta or {}
    checks.check_meta(meta, where)
    checks.check_finite_weights(sd, where)
    if opt.model_class:
        kwargs = dict(meta.get("model_kwargs", {}), **opt.model_kwargs)
        module = build.build_custom(opt.model_class, kwargs, sd, where)
        return from_module(raw, opt, module, family="custom", meta=meta, kwargs=kwargs)
    if opt.arch and opt.arch not in PRESETS:

        module = load_timm_arch(opt.arch, sd, where, input_size=opt.input_size)
        return from_module(raw, opt, module, family="timm", meta=meta, kwargs={}, arch_name=opt.arch)
    fam = families.recognise(sd, where)
    if fam is not None:
        return _load_family(raw, opt, sd, fam, meta)
    layout = infer_layout(sd, where)
    sources: dict[str, str] = {k: SOURCE_FILE for k in ("patch_size", "embed_dim", "depth", "num_classes", "image_size")}
    preset = get_preset(opt.arch) if opt.arch else None
    if preset is not None:
        _check_preset_fits(preset, layout, where)
    hybrid_name = None
    if layout.variant == "hybrid-resnet":
        hybrid_name = preset.name if preset else build.find_hybrid_arch(sd, where)
        layout.patch_size = build.hybrid_patch_size(hybrid_name)  # the grid stays what pos_embed says
        sources["patch_size"] = SOURCE_PRESET
        preset = preset or _maybe_preset(hybrid_name)
    matched = preset or match_preset(
        embed_dim=layout.embed_dim, depth=layout.depth, patch_size=layout.patch_size,
        image_size=layout.grid[0] * layout.patch_size, variant=layout.variant,
    )
    num_heads, sources["num_heads"] = _resolve_heads(opt, meta, preset, matched, layout, where)
    trained = (layout.grid[0] * layout.patch_size, layout.grid[1] * layout.patch_size)
    image_size = trained
    if opt.input_size is not None and tuple(opt.input_size) != trained:
        image_size = _check_divisible(tuple(opt.input_size), layout.patch_size)
        sd = _resample_state_dict(sd, layout, image_size)
        sources["image_size"] = SOURCE_FLAG
    builder = build.build_timm if layout.family == "timm" else build.build_torchvision
    kwargs = {"hybrid_name": hybrid_name} if layout.family == "timm" else {}
    module = builder(layout, sd, num_heads=num_heads, image_size=image_size, where=where, **kwargs)
    file_pre = meta.get("preprocess")
    pre_preset = matched if (matched and (opt.arch or _same_shape(matched, layout))) else None
    channels = chan.channels_from_weights(sd) or 3
    preprocess, pre_source = resolve_preprocess(opt, image_size, file_pre, pre_preset, family=layout.family, channels=channels)
    sources["preprocess"] = pre_source
    sources["channels"] = SOURCE_FILE
    variant = "encoder" if layout.num_classes == 0 else layout.variant
    spec = ModelSpec(
        family=layout.family,
        image_size=image_size,
        patch_size=layout.patch_size,
        embed_dim=layout.embed_dim,
        depth=layout.depth,
        num_heads=num_heads,
        num_classes=layout.num_classes or None,
        num_prefix_tokens=layout.num_prefix_tokens,
        num_params=sum(int(t.numel()) for t in module.state_dict().values() if isinstance(t, torch.Tensor) and t.is_floating_point()),
        preprocess=preprocess,
        variant=variant,
        output_kind="embedding" if layout.num_classes == 0 else "logits",
        class_names=read_class_names(meta, layout.num_classes),
        arch_name=hybrid_name or (matched.name if matched else None),
        sources=sources,
    )
    return LoadedModel(spec=spec, path=raw.path, module=module)


def _load_family(raw: RawModel, opt: IntakeOptions, sd: dict[str, Any], fam: "families.FamilyLayout", meta: dict) -> LoadedModel:
    """Swin, BEiT, EVA, relative-position ViTs: families.py reads and builds them."""
    import torch

    where = str(raw.path)
    heads, heads_source = families.resolve_heads(fam, opt.num_heads, meta.get("model_kwargs", {}).get("num_heads"))
    trained = families.default_image_size(fam)
    image_size = families.check_image_size(fam, tuple(opt.input_size) if opt.input_size else trained)
    size_source = SOURCE_FLAG if opt.input_size else (SOURCE_FILE if fam.grid else f"{SOURCE_DEFAULT} ({fam.base_arch}; --input-size to change)")
    module = families.build_family(fam, sd, heads=heads, image_size=image_size, where=where)
    cfg = getattr(module, "pretrained_cfg", None) or {}
    if fam.family == "torchvision":  # swin_t / swin_s / swin_b / v2 weights: resize 232 (v2: 260), crop 224, bicubic
        cfg = {"crop_pct": 224 / (260 if "v2" in fam.base_arch else 232), "interpolation": "bicubic", "mean": IMAGENET_MEAN, "std": IMAGENET_STD}
    file_pre = meta.get("preprocess")
    preprocess, pre_source = (resolve_preprocess(opt, image_size, file_pre, None, family=fam.family) if file_pre else
                              apply_preprocess_flags(preprocess_from_cfg(cfg, image_size), f"{SOURCE_PRESET} {fam.base_arch}", opt))
    sources = {k: SOURCE_FILE for k in ("patch_size", "embed_dim", "depth", "num_classes")}
    sources.update(num_heads=heads_source, image_size=size_source, preprocess=pre_source)
    spec = ModelSpec(
        family=fam.family,
        image_size=image_size,
        patch_size=fam.patch_size,
        embed_dim=fam.embed_dim,
        depth=fam.depth,
        num_heads=heads[0] if isinstance(heads, tuple) else heads,
        num_classes=fam.num_classes or None,
        num_prefix_tokens=fam.num_prefix_tokens,
        num_params=sum(int(t.numel()) for t in module.state_dict().values() if isinstance(t, torch.Tensor) and t.is_floating_point()),
        preprocess=preprocess,
        variant="encoder" if fam.num_classes == 0 else fam.variant,
        output_kind="embedding" if fam.num_classes == 0 else "logits",
        class_names=read_class_names(meta, fam.num_classes),
        arch_name=fam.base_arch,
        sources=sources,
    )
    return LoadedModel(spec=spec, path=raw.path, module=module)


def _maybe_preset(name: str) -> ArchPreset | None:

    return PRESETS.get(name)


def _same_shape(p: ArchPreset, layout: Layout) -> bool:
    return p.embed_dim == layout.embed_dim and p.depth == layout.depth and p.patch_size == layout.patch_size


def _check_preset_fits(p: ArchPreset, layout: Layout, where: str) -> None:
    if p.embed_dim != layout.embed_dim:
        raise UsageError(f"{where} has embedding width {layout.embed_dim} but --arch {p.name} has {p.embed_dim}; pick the matching --arch")
    if layout.variant != "hybrid-resnet" and p.patch_size != layout.patch_size:
        raise UsageError(f"{where} has patch size {layout.patch_size} but --arch {p.name} has {p.patch_size}; pick the matching --arch")


def _resolve_heads(opt, meta, preset, matched, layout: Layout, where: str) -> tuple[int, str]:
    checks.check_heads_agree(opt.num_heads, meta.get("model_kwargs", {}).get("num_heads"), f"{where} records in its metadata")
    if preset is not None:
        checks.check_heads_agree(opt.num_heads, preset.num_heads, f"--arch {preset.name} has")
    if opt.num_heads:
        heads, source = int(opt.num_heads), SOURCE_FLAG
    elif meta.get("model_kwargs", {}).get("num_heads"):
        heads, source = int(meta["model_kwargs"]["num_heads"]), SOURCE_FILE
    elif preset is not None:
        heads, source = preset.num_heads, f"{SOURCE_PRESET} {preset.name}"
    elif matched is not None:
        heads, source = matched.num_heads, f"{SOURCE_PRESET} {matched.name}"
    elif layout.embed_dim in HEADS_BY_WIDTH:
        heads, source = HEADS_BY_WIDTH[layout.embed_dim], f"{SOURCE_PRESET} (every published ViT of width {layout.embed_dim})"
    else:
        raise ModelLoadError(
            f"{where}: the number of attention heads cannot be read from a state_dict (embedding width {layout.embed_dim}, "
            f"depth {layout.depth}, no matching preset); pass --num-heads N or --arch NAME"
        )
    if layout.embed_dim % heads:
        raise UsageError(f"embedding width {layout.embed_dim} is not divisible by {heads} heads; check --num-heads / --arch")
    return heads, source


def _check_divisible(size: tuple[int, int], patch: int) -> tuple[int, int]:
    if size[0] % patch or size[1] % patch:
        raise UsageError(f"--input-size {size[0]} {size[1]} is not a multiple of the patch size {patch}")
    return (int(size[0]), int(size[1]))


def _resample_state_dict(sd: dict[str, Any], layout: Layout, image_size: tuple[int, int]) -> dict[str, Any]:
    new_grid = (image_size[0] // layout.patch_size, image_size[1] // layout.patch_size)
    sd = dict(sd)
    if layout.family == "timm":
        prefix = 0 if layout.timm_kwargs.get("no_embed_class") else layout.num_prefix_tokens
        sd["pos_embed"] = build.resample_pos_embed(sd["pos_embed"], layout.grid, new_grid, prefix)
    else:
        sd["encoder.pos_embedding"] = build.resample_pos_embed(sd["encoder.pos_embedding"], layout.grid, new_grid, 1)
    return sd
