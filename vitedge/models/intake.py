"""Model intake: any supported file -> a torch module (or ONNX file) plus a ModelSpec.

Every fact in the spec records where it came from: the file itself, a named preset,
a flag, or a default. `vitedge inspect` prints them.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.core.limits import MIN_CROP_PCT, check_attention_fits, within
from vitedge.bundle.fields import check_spec_bounds
from vitedge.models import architectures as families, checks, construct as build
from vitedge.models import channels as chan
from vitedge.models.formats import RawModel, read_model_file
from vitedge.models.hf import load_hf_folder, read_preprocess
from vitedge.models.layouts import Layout, infer_layout
from vitedge.models.presets import (
    HEADS_BY_WIDTH,
    PRESETS,
    ArchPreset,
    get_preset,
    match_preset,
)
from vitedge.models.stem import candidates_text, stem_input_size, stem_layers
from vitedge.models.timm_arch import load_timm_arch
from vitedge.onnxkit.files import check_external_data
from vitedge.onnxkit.structure import graph_inputs
from vitedge.files.safefile import BadDocument
from vitedge.bundle.spec import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    INTERPOLATIONS,
    SOURCE_DEFAULT,
    SOURCE_FILE,
    SOURCE_FLAG,
    SOURCE_PRESET,
    ModelSpec,
    Preprocess,
    default_stats,
    fit_stats,
)

ONNX_SPEC_KEY = "vitedge.spec"


@dataclass(frozen=True)
class IntakeOptions:
    """Everything a user can tell vitedge about a model (the CLI's model flags)."""

    arch: str | None = None
    num_heads: int | None = None
    model_class: str | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    trust_pickle: bool = False
    input_size: tuple[int, int] | None = None
    output_kind: str | None = None  # logits / embedding, for models vitedge cannot tell
    mean: tuple[float, ...] | None = None  # one value per channel, or one that broadcasts
    std: tuple[float, ...] | None = None
    crop_pct: float | None = None
    interpolation: str | None = None

    def __post_init__(self) -> None:
        if self.input_size is not None and any(int(v) <= 0 for v in self.input_size):
            raise UsageError(f"--input-size must be two positive integers, got {self.input_size}")
        if self.crop_pct is not None and not MIN_CROP_PCT <= self.crop_pct <= 1.0:
            raise UsageError(f"--crop-pct must be in [{MIN_CROP_PCT:g}, 1] (the resize side is crop / crop-pct), got {self.crop_pct}")
        if self.interpolation is not None and self.interpolation not in INTERPOLATIONS:
            raise UsageError(f"--interpolation must be one of {', '.join(INTERPOLATIONS)}, got '{self.interpolation}'")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if values is not None and not all(math.isfinite(v) for v in values):
                raise UsageError(f"--{name} values must be finite numbers, got {' '.join(map(str, values))}")
        if self.std is not None and any(s <= 0 for s in self.std):
            raise UsageError(f"--std values must be positive, got {self.std}")
        if self.output_kind not in (None, "logits", "embedding"):
            raise UsageError(f"--output-kind must be logits or embedding, got '{self.output_kind}'")


@dataclass
class LoadedModel:
    spec: ModelSpec
    path: Path
    module: Any = None  # torch.nn.Module (or ScriptModule / ExportedProgram); None for ONNX input
    onnx_path: Path | None = None  # set when the input already is ONNX: export is skipped
    exporter: str = "torchscript"  # which torch.onnx path exports it: torchscript or dynamo

    @property
    def is_onnx(self) -> bool:
        return self.onnx_path is not None


def load_model(path: str | Path, options: IntakeOptions | None = None) -> LoadedModel:
    options = options or IntakeOptions()
    path = Path(path)
    raw = read_model_file(path, trust_pickle=options.trust_pickle)
    if options.model_class and raw.kind != "state_dict":
        raise UsageError(f"--model-class needs a state_dict checkpoint, but {path} holds a {raw.kind.replace('_', ' ')}")
    loader = _LOADERS[raw.kind]
    loaded = loader(raw, options)
    spec = loaded.spec
    # the bounds runtime.load holds a bundle's spec to (class count, sizes, mean/std), checked where the model is read
    check_spec_bounds(spec, str(path), ModelLoadError, "vitedge builds only what a bundle can hold and runtime.load accepts")
    check_attention_fits(spec.num_tokens, spec.num_heads, spec.image_size)  # before any export allocates for it
    return loaded


# --------------------------------------------------------------------------- state dicts


def _load_state_dict(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
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
        return _from_module(raw, opt, module, family="custom", meta=meta, kwargs=kwargs)
    if opt.arch and opt.arch not in PRESETS:

        module = load_timm_arch(opt.arch, sd, where, input_size=opt.input_size)
        return _from_module(raw, opt, module, family="timm", meta=meta, kwargs={}, arch_name=opt.arch)
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
    preprocess, pre_source = _resolve_preprocess(opt, image_size, file_pre, pre_preset, family=layout.family, channels=channels)
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
        class_names=_class_names(meta, layout.num_classes),
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
    preprocess, pre_source = (_resolve_preprocess(opt, image_size, file_pre, None, family=fam.family) if file_pre else
                              _apply_preprocess_flags(_preprocess_from_cfg(cfg, image_size), f"{SOURCE_PRESET} {fam.base_arch}", opt))
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
        class_names=_class_names(meta, fam.num_classes),
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


def _class_names(meta: dict[str, Any], num_classes: int | None) -> tuple[str, ...] | None:
    names = meta.get("class_names")
    if names and num_classes and len(names) == num_classes:
        return tuple(str(n) for n in names)
    return None


# --------------------------------------------------------------------------- preprocessing


SMALL_INPUT = 64  # px: at or below, the default feeds the whole image (no resize-and-centre-crop)


def default_crop_pct(image_size) -> float:
    """The centre crop when nothing says one: ImageNet's 0.875 for ImageNet-sized inputs; 1.0 (the whole
    image) for inputs of at most 64 px, which small-image models (MNIST, CIFAR, SVHN) are trained and tested
    on without a crop. Measured on the corpus models (FP32 top-1 on 1,000 test images, 28x28 and 32x32):
    a 0.875 crop cost 1.2-26.9 points on 7 of 8 (kavishka-shallow 88.9 -> 62.0 %); tintn-mayank +0.1 with it;
    see docs/corpus.md."""
    return 1.0 if max(int(v) for v in image_size) <= SMALL_INPUT else 0.875


def _resolve_preprocess(opt: IntakeOptions, image_size, file_pre: dict | None, preset: ArchPreset | None, *, family: str,
                        channels: int = 3) -> tuple[Preprocess, str]:
    if file_pre:
        try:
            base, source = Preprocess.from_dict(dict(file_pre, crop_size=list(image_size))), SOURCE_FILE
        except ValueError as err:
            raise UsageError(f"the model file's preprocessing is inconsistent: {err}; pass --mean/--std") from None
    elif preset is not None:
        base, source = preset.preprocess, SOURCE_PRESET
    elif family == "torchvision":
        base = Preprocess(crop_pct=224 / 256, interpolation="bilinear", mean=IMAGENET_MEAN, std=IMAGENET_STD)
        source = SOURCE_DEFAULT
    else:
        base = Preprocess(crop_pct=default_crop_pct(image_size), interpolation="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD)
        source = SOURCE_DEFAULT
    base = _fit_channels(base, channels, source)
    return _apply_preprocess_flags(Preprocess(crop_size=tuple(image_size), crop_pct=base.crop_pct, interpolation=base.interpolation,
                                              mean=base.mean, std=base.std, channels=base.channels), source, opt)


def _fit_channels(pre: Preprocess, channels: int, source: str) -> Preprocess:
    """The preprocessing for a `channels`-input model: a default's statistics are the
    channel count's defaults; a file's or preset's must fit (one value broadcasts, RGB
    averages to grey)."""
    if pre.channels == channels:
        return pre
    if source == SOURCE_DEFAULT:
        mean, std = default_stats(channels)
        return replace(pre, mean=mean, std=std, channels=channels)
    try:
        return pre.with_channels(channels)
    except ValueError as err:
        raise UsageError(f"the model takes {channels} channel(s) but its {source} preprocessing does not fit: {err}; pass --mean/--std") from None


def _check_stats_flag(name: str, values: tuple[float, ...]) -> None:
    """--mean/--std within the bounds a bundle's manifest holds them to (runtime.load refuses others)."""
    lo, hi, is_std = (0.0, 1e6, True) if name == "std" else (-1e6, 1e6, False)
    for v in values:
        if not within(v, lo, hi, lo_open=is_std):
            raise UsageError(f"--{name} {v:g} is outside {'(' if is_std else '['}{lo:g}, {hi:g}]: it would make every image one "
                             "input for the model; pass the --mean/--std the model was trained with")


def _apply_preprocess_flags(pre: Preprocess, source: str, opt: IntakeOptions) -> tuple[Preprocess, str]:

    changes: dict[str, Any] = {}
    for name in ("mean", "std", "crop_pct", "interpolation"):
        value = getattr(opt, name)
        if value is not None and name in ("mean", "std"):
            try:
                changes[name] = fit_stats(tuple(value), pre.channels, f"--{name}")
            except ValueError as err:
                raise UsageError(str(err)) from None
            _check_stats_flag(name, changes[name])
        elif value is not None:
            changes[name] = tuple(value) if isinstance(value, (list, tuple)) else value
    if not changes:
        return pre, source
    return replace(pre, **changes), f"{source} + flags ({', '.join(sorted(changes))})"


def _preprocess_from_cfg(cfg: dict[str, Any], image_size) -> Preprocess:
    mean = tuple(cfg.get("mean", IMAGENET_MEAN))
    return Preprocess(
        channels=len(mean),
        crop_size=tuple(image_size),
        crop_pct=float(cfg.get("crop_pct", 1.0)),
        interpolation=str(cfg.get("interpolation", "bicubic")),
        mean=mean,
        std=tuple(cfg["std"]) if cfg.get("std") else default_stats(len(mean))[1],
    )


# --------------------------------------------------------------------------- built modules


def _load_module(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    family = type(raw.module).__module__.split(".")[0]
    family = {"timm": "timm", "torchvision": "torchvision", "transformers": "huggingface"}.get(family, "custom")
    return _from_module(raw, opt, raw.module.eval(), family=family, meta=raw.meta or {}, kwargs={})


def _load_torchscript(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    return _from_module(raw, opt, raw.module.eval(), family="torchscript", meta={}, kwargs={})


def _load_exported(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    program = raw.module
    _refuse_fixed_batch(program, str(raw.path))
    loaded = _from_module(raw, opt, program.module(), family="torch.export", meta={}, kwargs={}, example_shape=_program_input_shape(program))
    loaded.module = program
    loaded.exporter = "dynamo"
    return loaded


def _refuse_fixed_batch(program, where: str) -> None:
    """A program exported with torch.export's defaults has its batch fixed (usually at 1); its ONNX graph
    would too, and validation (and a runtime batch) would fail at the end. Refuse it at once."""
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            node = next((n for n in program.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name), None)
            val = node.meta.get("val") if node is not None else None
            if val is not None and len(val.shape) == 4 and isinstance(val.shape[0], int):
                raise ModelLoadError(
                    f"{where} was exported with a fixed batch of {val.shape[0]}; vitedge validates and serves any batch size: "
                    "re-export with torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim('batch')},))"
                )
            return


def _program_input_shape(program) -> tuple[int, ...] | None:
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)
            val = node.meta.get("val")
            if val is not None:
                return tuple(int(d) if str(d).isdigit() else 1 for d in val.shape)
    return None


def _from_module(raw: RawModel, opt: IntakeOptions, module, *, family: str, meta: dict, kwargs: dict, example_shape=None,
                 arch_name: str | None = None) -> LoadedModel:
    """A built module of any class: its weights checked, its architecture read, its input size and channels
    found, its output probed, then its spec."""
    where = str(raw.path)
    sd, layout = _weights_and_layout(module, where)
    checks.check_meta(meta, where)
    checks.check_finite_weights(sd, where)
    facts = _describe_module(module, sd, layout)
    checks.check_heads_agree(opt.num_heads, facts.get("num_heads"), f"the attention layers of {where} have")
    cfg = getattr(module, "pretrained_cfg", None) or getattr(module, "default_cfg", None) or {}
    sources: dict[str, str] = {}
    image_size = _module_image_size(opt, sd, layout, facts, cfg, kwargs, example_shape, where, family, sources, module)
    channels, _ = chan.module_channels(module, sd, cfg, kwargs, example_shape)
    output, channels = _probe_output(module, image_size, where, channels)
    # a class that keeps no num_heads and no position table (attention written by hand, positions added
    # otherwise) shows its attention only when it runs
    if not facts.get("is_vit") and layout is None and not _runs_attention(module, image_size, channels):
        raise ModelLoadError(f"{where}: found a {type(module).__name__} with no patch embedding or attention layers, not a Vision Transformer")
    sources["channels"] = SOURCE_FILE
    file_pre = meta.get("preprocess") or (cfg if isinstance(cfg, dict) and cfg.get("mean") else None)
    if file_pre and "crop_size" not in file_pre:
        file_pre = _preprocess_from_cfg(file_pre, image_size).to_dict()
    preprocess, sources["preprocess"] = _resolve_preprocess(opt, image_size, file_pre, None, family=family, channels=channels)
    spec = _module_spec(opt, sd, layout, facts, sources, family=family, image_size=image_size, output=output,
                        preprocess=preprocess, meta=meta, arch_name=arch_name)
    return LoadedModel(spec=spec, path=raw.path, module=module)


def _weights_and_layout(module, where: str) -> tuple[dict[str, Any], Layout | None]:
    """The module's state_dict (empty when it has none to give) and the ViT layout its key names show."""
    try:
        sd = dict(module.state_dict().items())
    except Exception:
        sd = {}
    try:
        return sd, (infer_layout(sd, where) if sd else None)
    except ModelLoadError:
        return sd, None


def _size_from_stem(module, sd: dict[str, Any], facts: dict[str, Any], where: str, sources: dict[str, str]) -> tuple[int, int] | None:
    """The input size a convolutional stem with strides and pooling (a CCT's tokenizer) makes the position
    embedding's token count from (models/stem); None when the stem is one patch convolution or cannot tell.
    Several sizes fit and none is the stride's multiple: refused, listing them."""
    pos = [v for k, v in sd.items() if "pos" in k.lower() and getattr(v, "ndim", 0) == 3 and int(v.shape[0]) == 1]
    if not pos:
        return None
    prefix = facts.get("num_prefix_tokens")
    size = stem_input_size(stem_layers(module), int(pos[0].shape[1]), ((prefix,) if prefix is not None else ()) + (1, 0, 2, 5))
    if size is None:
        return None
    if size.side is None:
        raise ModelLoadError(f"{where}: cannot tell the input size: its convolutional stem (total stride {size.stride}) makes the "
                             f"{size.grid}x{size.grid} tokens of its position embedding from inputs of {candidates_text(size)} "
                             f"pixels a side; pass --input-size H W (e.g. --input-size {size.candidates[0]} {size.candidates[0]})")
    sources["image_size"] = f"{SOURCE_FILE} (position-embedding grid x the stem's total stride {size.stride})"
    return (size.side, size.side)


def _module_image_size(opt: IntakeOptions, sd: dict[str, Any], layout: Layout | None, facts: dict[str, Any], cfg,
                       kwargs: dict, example_shape, where: str, family: str, sources: dict[str, str],
                       module=None) -> tuple[int, int]:
    """The input size, from the first that says it: the file's example input, the layout, the class's
    config or constructor arguments, the weights (patch side x position grid); --input-size must agree
    with what the file fixes. Records its source in ``sources``."""
    image_size = None
    if example_shape is not None and len(example_shape) == 4:
        image_size, sources["image_size"] = (example_shape[2], example_shape[3]), SOURCE_FILE
    elif layout is not None:
        image_size, sources["image_size"] = (layout.grid[0] * layout.patch_size, layout.grid[1] * layout.patch_size), SOURCE_FILE
    elif isinstance(cfg, dict) and cfg.get("input_size"):
        image_size, sources["image_size"] = tuple(int(v) for v in cfg["input_size"][-2:]), SOURCE_FILE
    else:
        key = next((k for k in ("image_size", "img_size", "input_size") if k in kwargs), None)
        if key is not None:
            v = kwargs[key]
            image_size, sources["image_size"] = ((int(v), int(v)) if isinstance(v, int) else tuple(int(x) for x in v[-2:])), SOURCE_FILE
    if image_size is None and opt.input_size is None:
        image_size = _size_from_stem(module, sd, facts, where, sources)
    if image_size is None and opt.input_size is None:
        image_size = chan.input_size_from_weights(sd, facts.get("num_prefix_tokens"))
        if image_size is not None:
            sources["image_size"] = f"{SOURCE_FILE} (patch side x position-embedding grid)"
    if opt.input_size is not None:
        if image_size is not None and tuple(opt.input_size) != tuple(image_size):
            raise UsageError(
                f"{where} is a built {family} model for {image_size[0]}x{image_size[1]} inputs and cannot be re-sized; "
                "pass its state_dict to export at another --input-size"
            )
        image_size, sources["image_size"] = tuple(opt.input_size), SOURCE_FLAG
    if image_size is None:
        raise ModelLoadError(f"{where}: cannot tell the input size of this {family} model from its weights "
                             "(no convolutional or Linear patch embedding with a square position-embedding grid); pass --input-size H W")
    return tuple(image_size)  # type: ignore[return-value]


def _module_spec(opt: IntakeOptions, sd: dict[str, Any], layout: Layout | None, facts: dict[str, Any],
                 sources: dict[str, str], *, family: str, image_size: tuple[int, int], output, preprocess: Preprocess,
                 meta: dict, arch_name: str | None) -> ModelSpec:
    """The spec of a built module: architecture from its layout or its layers, output kind and classes."""
    import torch

    output_kind = opt.output_kind or ("embedding" if (layout is not None and layout.num_classes == 0) else "logits")
    sources["num_classes"] = SOURCE_FLAG if opt.output_kind else SOURCE_FILE
    patch = layout.patch_size if layout else facts.get("patch_size")
    heads = opt.num_heads or facts.get("num_heads")
    for k, v in (("patch_size", patch), ("embed_dim", layout.embed_dim if layout else facts.get("embed_dim")),
                 ("depth", layout.depth if layout else facts.get("depth")), ("num_heads", heads)):
        sources[k] = (SOURCE_FLAG if (k == "num_heads" and opt.num_heads) else SOURCE_FILE) if v else SOURCE_DEFAULT
    classes = int(output) if output_kind == "logits" else None
    return ModelSpec(
        family=family,
        image_size=tuple(image_size),  # type: ignore[arg-type]
        patch_size=patch,
        embed_dim=layout.embed_dim if layout else facts.get("embed_dim"),
        depth=layout.depth if layout else facts.get("depth"),
        num_heads=heads,
        num_classes=classes,
        num_prefix_tokens=layout.num_prefix_tokens if layout else facts.get("num_prefix_tokens"),
        num_params=sum(int(t.numel()) for t in sd.values() if isinstance(t, torch.Tensor) and t.is_floating_point()) or None,
        preprocess=preprocess,
        variant="encoder" if output_kind == "embedding" else (layout.variant if layout else "vit"),
        output_kind=output_kind,
        class_names=_class_names(meta, classes),
        arch_name=arch_name,
        sources=sources,
    )


def _describe_module(module, sd: dict[str, Any], layout: Layout | None) -> dict[str, Any]:
    """Architecture facts of a built module of unknown class, read from its layers."""
    import torch

    facts: dict[str, Any] = {}
    attn_heads = []
    depth = 0
    try:
        named = list(module.named_modules())
    except Exception:
        named = []
    for _, m in named:
        if isinstance(m, torch.nn.Conv2d) and "patch_size" not in facts and tuple(m.kernel_size) == tuple(m.stride):
            facts["patch_size"], facts["embed_dim"] = int(m.kernel_size[0]), int(m.out_channels)
        heads = getattr(m, "num_heads", None)
        if isinstance(heads, int):
            attn_heads.append(heads)
            depth += 1
    if attn_heads:
        facts["num_heads"], facts["depth"] = attn_heads[0], depth
    declared = getattr(module, "patch_size", None)
    if facts.get("patch_size") is None and isinstance(declared, int) and declared > 0:
        facts["patch_size"] = declared  # e.g. a Linear patch embedding on reshaped patches
    pos = [v for k, v in sd.items() if "pos" in k.lower() and getattr(v, "ndim", 0) == 3]
    if pos:
        facts.setdefault("embed_dim", int(pos[0].shape[-1]))
        if facts.get("patch_size") is None:
            pass
    cls_like = [k for k in sd if ("cls" in k.lower() or "class_token" in k.lower()) and getattr(sd[k], "ndim", 0) == 3]
    facts["num_prefix_tokens"] = len(cls_like) or None
    facts["is_vit"] = bool(attn_heads or pos) or _graph_has_attention(module)
    return facts


def _runs_attention(module, image_size, channels: int | None) -> bool:
    """Does one forward pass compute attention (a softmax over a matmul of tokens)? Traced at the input size,
    with the fused attention kernels off so that the plain ops show."""
    import torch

    if _graph_has_attention(module):
        return True
    if not isinstance(module, torch.nn.Module) or isinstance(module, torch.jit.ScriptModule):
        return False
    mha = getattr(torch.backends, "mha", None)
    before = mha.get_fastpath_enabled() if mha is not None else None
    try:
        if mha is not None:
            mha.set_fastpath_enabled(False)
        x = torch.zeros(1, int(channels or 3), int(image_size[0]), int(image_size[1]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module, x, check_trace=False)
        return _graph_has_attention(traced)
    except Exception:
        return False
    finally:
        if mha is not None:
            mha.set_fastpath_enabled(before)


_ATTENTION_KINDS = {"aten::scaled_dot_product_attention", "aten::_native_multi_head_attention",
                    "aten::_transformer_encoder_layer_fwd"}


def _graph_has_attention(module) -> bool:
    """A TorchScript file or a torch.export program keeps no layer attributes (num_heads) and may keep no
    position table (a ViT may add its positions otherwise): its graph still shows attention, a softmax over
    a matmul of tokens."""
    graph = getattr(module, "inlined_graph", None)
    try:
        if graph is not None:
            kinds = {node.kind() for node in graph.nodes()}
        elif hasattr(getattr(module, "graph", None), "nodes"):  # a torch.fx GraphModule (torch.export's .module())
            kinds = {"aten::" + str(getattr(n.target, "__name__", n.target)).split(".")[0]
                     for n in module.graph.nodes if n.op == "call_function"}
        else:
            return False
    except Exception:
        return False
    if "aten::_softmax" in kinds:
        kinds.add("aten::softmax")
    return bool(kinds & _ATTENTION_KINDS) or ("aten::softmax" in kinds and bool(kinds & {"aten::matmul", "aten::bmm", "aten::einsum"}))


def _probe_output(module, image_size, where: str, channels: int | None = None) -> tuple[int, int]:
    """(output width, input channels) from a forward pass on zeros; with `channels`
    unknown, the common counts are tried in turn (RGB first)."""
    import torch

    tries = (channels,) if channels else chan.PROBE_CHANNELS
    first_err: Exception | None = None
    for c in tries:
        x = torch.zeros(1, c, int(image_size[0]), int(image_size[1]))
        try:
            with torch.no_grad():
                y = module(x)
            channels = c
            break
        except Exception as err:
            first_err = first_err or err
    else:
        err = first_err
        shape = f"1x{tries[0]}x{image_size[0]}x{image_size[1]}" if len(tries) == 1 else f"1xCx{image_size[0]}x{image_size[1]} (C = {', '.join(map(str, tries))})"
        raise ModelLoadError(
            f"{where}: a forward pass on a {shape} input failed "
            f"({type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}); check --input-size / --model-kwargs"
        ) from err
    if isinstance(y, (tuple, list)):
        y = y[0]
    if not isinstance(y, torch.Tensor) or y.ndim != 2:
        raise ModelLoadError(f"{where}: the model's output is {type(y).__name__} {tuple(getattr(y, 'shape', ()))}; vitedge needs a (batch, classes) or (batch, features) tensor")
    return int(y.shape[1]), int(channels)


# --------------------------------------------------------------------------- Hugging Face, ONNX


def _load_huggingface(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    import torch


    module, facts = load_hf_folder(raw.path, input_size=opt.input_size)
    checks.check_finite_weights(module.state_dict(), str(raw.path))
    image_size = facts["image_size"]
    file_pre, source = read_preprocess(raw.path, image_size)
    channels = int(getattr(getattr(getattr(module, "model", module), "config", None), "num_channels", 3) or 3)
    preprocess, pre_source = _apply_preprocess_flags(_fit_channels(file_pre, channels, source), source, opt)
    sources = {k: SOURCE_FILE for k in ("patch_size", "embed_dim", "depth", "num_heads", "num_classes", "image_size")}
    if opt.input_size is not None:
        sources["image_size"] = SOURCE_FLAG
    sources["preprocess"] = pre_source
    spec = ModelSpec(
        family="huggingface",
        image_size=tuple(image_size),  # type: ignore[arg-type]
        patch_size=facts["patch_size"],
        embed_dim=facts["embed_dim"],
        depth=facts["depth"],
        num_heads=facts["num_heads"],
        num_classes=facts["num_classes"],
        num_prefix_tokens=facts["num_prefix_tokens"],
        num_params=sum(int(p.numel()) for p in module.parameters()),
        preprocess=preprocess,
        variant=facts["variant"],
        output_kind=facts["output_kind"],
        class_names=facts["class_names"],
        arch_name=facts["arch_name"],
        sources=sources,
    )
    del torch
    return LoadedModel(spec=spec, path=raw.path, module=module)


def _load_onnx(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    import onnx

    try:
        model = onnx.load(str(raw.path), load_external_data=False)
    except Exception as err:
        raise ModelLoadError(f"{raw.path} is truncated or corrupt and cannot be read as ONNX ({str(err).splitlines()[0][:120]})") from err
    check_external_data(model, Path(raw.path).parent, str(raw.path))
    checks.check_onnx_fp32(model, str(raw.path))
    props = {p.key: p.value for p in model.metadata_props}
    if ONNX_SPEC_KEY in props:
        checks.check_onnx_batch(model.graph, str(raw.path))
        try:
            spec = ModelSpec.from_json(props[ONNX_SPEC_KEY])
        except ValueError as err:  # BadDocument or SpecError: one line, here naming the file
            raise ModelLoadError(f"{raw.path}: its '{ONNX_SPEC_KEY}' metadata: {err}; re-export the model with `vitedge export`, "
                                 "or remove that metadata") from None
        spec = spec.with_changes(sources={k: SOURCE_FILE for k in spec.sources} | {"preprocess": SOURCE_FILE})
        pre, pre_source = _apply_preprocess_flags(spec.preprocess, SOURCE_FILE, opt)
        spec = spec.with_changes(preprocess=pre, sources=dict(spec.sources, preprocess=pre_source))
        return LoadedModel(spec=spec, path=raw.path, onnx_path=raw.path)
    graph = model.graph
    inputs = graph_inputs(graph)
    if len(inputs) != 1:
        raise ModelLoadError(f"{raw.path}: the ONNX graph has {len(inputs)} inputs; vitedge needs one image input")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inputs[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or not dims[1]:
        raise ModelLoadError(f"{raw.path}: the ONNX input has shape {dims}; vitedge needs (batch, channels, height, width) with a fixed channel count")
    checks.check_onnx_is_vit(graph, str(raw.path))
    checks.check_finite_onnx_weights(graph, str(raw.path))
    sources: dict[str, str] = {}
    if dims[2] and dims[3]:
        image_size, sources["image_size"] = (dims[2], dims[3]), SOURCE_FILE
        if opt.input_size and tuple(opt.input_size) != image_size:
            raise UsageError(f"{raw.path} has a fixed {dims[2]}x{dims[3]} input; --input-size cannot change it")
    elif opt.input_size:
        image_size, sources["image_size"] = tuple(opt.input_size), SOURCE_FLAG
    else:
        raise ModelLoadError(f"{raw.path}: the ONNX input height/width are not fixed; pass --input-size H W")
    out_dims = [d.dim_value if d.HasField("dim_value") else None for d in graph.output[0].type.tensor_type.shape.dim]
    ops = [n.op_type for n in graph.node]
    conv = next((n for n in graph.node if n.op_type == "Conv"), None)
    patch = embed = None
    weights = {i.name: i for i in graph.initializer}
    if conv is not None and conv.input[1] in weights:
        w = weights[conv.input[1]]
        embed, patch = int(w.dims[0]), int(w.dims[-1])
    output_kind = opt.output_kind or ("embedding" if "embed" in graph.output[0].name.lower() else "logits")
    width = out_dims[-1] if out_dims and out_dims[-1] else None
    pre, pre_source = _apply_preprocess_flags(
        _fit_channels(Preprocess(crop_size=tuple(image_size), crop_pct=default_crop_pct(image_size), interpolation="bicubic"),  # type: ignore[arg-type]
                      int(dims[1]), SOURCE_DEFAULT),
        SOURCE_DEFAULT, opt,
    )
    sources.update({"channels": SOURCE_FILE, "patch_size": SOURCE_FILE, "embed_dim": SOURCE_FILE, "depth": SOURCE_FILE, "num_classes": SOURCE_FILE, "preprocess": pre_source})
    spec = ModelSpec(
        family="onnx",
        image_size=tuple(image_size),  # type: ignore[arg-type]
        patch_size=patch,
        embed_dim=embed,
        depth=ops.count("Softmax") or None,
        num_heads=opt.num_heads,
        num_classes=width if output_kind == "logits" else None,
        num_prefix_tokens=None,
        num_params=sum(_numel(i) for i in graph.initializer) or None,
        preprocess=pre,
        variant="encoder" if output_kind == "embedding" else "vit",
        output_kind=output_kind,
        sources=sources,
    )
    return LoadedModel(spec=spec, path=raw.path, onnx_path=raw.path)


def _numel(t) -> int:
    n = 1
    for d in t.dims:
        n *= int(d)
    return n if t.data_type in (1, 10, 11, 16) else 0  # float, float16, double, bfloat16


_LOADERS = {
    "state_dict": _load_state_dict,
    "module": _load_module,
    "torchscript": _load_torchscript,
    "exported_program": _load_exported,
    "huggingface": _load_huggingface,
    "onnx": _load_onnx,
}
