"""The facts of a model's spec every loader of the intake resolves alike: the preprocessing (the
file's, a preset's, a family's default or the flags', fitted to the model's channels) and the class names.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vitedge.bundle.spec import IMAGENET_MEAN, IMAGENET_STD, SOURCE_DEFAULT, SOURCE_FILE, SOURCE_PRESET, Preprocess, default_stats, fit_stats
from vitedge.core.errors import UsageError
from vitedge.core.limits import within
from vitedge.models.intake_types import IntakeOptions
from vitedge.models.presets import ArchPreset


def read_class_names(meta: dict[str, Any], num_classes: int | None) -> tuple[str, ...] | None:
    names = meta.get("class_names")
    if names and num_classes and len(names) == num_classes:
        return tuple(str(n) for n in names)
    return None


SMALL_INPUT = 64  # px: at or below, the default feeds the whole image (no resize-and-centre-crop)


def default_crop_pct(image_size) -> float:
    """The centre crop when nothing says one: ImageNet's 0.875 for ImageNet-sized inputs; 1.0 (the whole
    image) for inputs of at most 64 px, which small-image models (MNIST, CIFAR, SVHN) are trained and tested
    on without a crop. Measured on the corpus models (FP32 top-1 on 1,000 test images, 28x28 and 32x32):
    a 0.875 crop cost 1.2-26.9 points on 7 of 8 (kavishka-shallow 88.9 -> 62.0 %); tintn-mayank +0.1 with it;
    see docs/corpus.md."""
    return 1.0 if max(int(v) for v in image_size) <= SMALL_INPUT else 0.875


def resolve_preprocess(opt: IntakeOptions, image_size, file_pre: dict | None, preset: ArchPreset | None, *, family: str,
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
    base = fit_channels(base, channels, source)
    return apply_preprocess_flags(Preprocess(crop_size=tuple(image_size), crop_pct=base.crop_pct, interpolation=base.interpolation,
                                              mean=base.mean, std=base.std, channels=base.channels), source, opt)


def fit_channels(pre: Preprocess, channels: int, source: str) -> Preprocess:
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


def apply_preprocess_flags(pre: Preprocess, source: str, opt: IntakeOptions) -> tuple[Preprocess, str]:

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


def preprocess_from_cfg(cfg: dict[str, Any], image_size) -> Preprocess:
    mean = tuple(cfg.get("mean", IMAGENET_MEAN))
    return Preprocess(
        channels=len(mean),
        crop_size=tuple(image_size),
        crop_pct=float(cfg.get("crop_pct", 1.0)),
        interpolation=str(cfg.get("interpolation", "bicubic")),
        mean=mean,
        std=tuple(cfg["std"]) if cfg.get("std") else default_stats(len(mean))[1],
    )
