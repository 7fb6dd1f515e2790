"""What vitedge understood about a model: architecture, input and preprocessing.

Plain dataclasses with no third-party imports, so the runtime can read them from a
manifest on a camera box that has no torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from vitedge.files.safefile import parse_json
from vitedge.core.errors import ModelLoadError
from vitedge.core.limits import MIN_CROP_PCT


class SpecError(ModelLoadError, ValueError):
    """A model spec or preprocessing record (from a file) with a field of the wrong type or value: one line, exit 2.
    A ValueError too, so the places that read one from a file and add where it came from still catch it."""


def _detail(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:120]}" if text else type(err).__name__

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos")
# One-channel models: ImageNet's statistics averaged over R, G and B.
GRAY_MEAN = (0.449,)
GRAY_STD = (0.226,)


def color_mode(channels: int) -> str:
    """The Pillow mode frames are converted to for a model with this many input channels:
    "L" (8-bit grey, ITU-R 601 luma) for 1, "RGB" for 3; other counts have no image mode
    and take arrays only ("4-channel" and so on)."""
    return {1: "L", 3: "RGB"}.get(int(channels), f"{int(channels)}-channel")


def default_stats(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean/std for a model that says nothing about its normalisation: ImageNet's for RGB,
    their average for grey, ImageNet's RGB followed by the average for extra channels."""
    if channels == 3:
        return IMAGENET_MEAN, IMAGENET_STD
    if channels < 3:
        return GRAY_MEAN * channels, GRAY_STD * channels
    extra = channels - 3
    return IMAGENET_MEAN + GRAY_MEAN * extra, IMAGENET_STD + GRAY_STD * extra


def fit_stats(values: tuple[float, ...], channels: int, what: str) -> tuple[float, ...]:
    """One value per channel: a single value broadcasts; a 3-value RGB statistic on a
    1-channel model becomes its average; any other count mismatch is an error."""
    values = tuple(float(v) for v in values)
    if len(values) == channels:
        return values
    if len(values) == 1:
        return values * channels
    if channels == 1 and len(values) == 3:
        return (round(sum(values) / 3.0, 6),)
    raise ValueError(f"{what} has {len(values)} values but the model takes {channels} channel(s); give {channels} values or one to broadcast")

# Where a value came from, printed by `vitedge inspect`.
SOURCE_FILE = "file"
SOURCE_PRESET = "preset"
SOURCE_DEFAULT = "default"
SOURCE_FLAG = "flag"


@dataclass(frozen=True)
class Preprocess:
    """How a frame becomes a model input.

    The frame is resized, keeping its aspect ratio, so that it covers
    ``crop_size / crop_pct``, then centre-cropped to ``crop_size`` (H, W), scaled to
    [0, 1] and normalised with ``mean``/``std`` per channel. For a square crop
    this is timm's and torchvision's "resize the shorter side to crop/crop_pct, then
    centre crop". ``channels`` is the model's input channel count: images are converted
    to ``color_mode`` ("L" for 1 channel, "RGB" for 3) before anything else.
    """

    crop_size: tuple[int, int] = (224, 224)
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    channels: int = 3

    def __post_init__(self) -> None:
        if not (isinstance(self.crop_pct, (int, float)) and MIN_CROP_PCT <= self.crop_pct <= 1.0):
            raise ValueError(f"crop_pct {self.crop_pct!r} is not in [{MIN_CROP_PCT:g}, 1] (the resize side is crop / crop_pct)")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(f"mean {tuple(self.mean)} and std {tuple(self.std)} need one value per channel ({self.channels})")

    @property
    def color_mode(self) -> str:
        return color_mode(self.channels)

    def with_channels(self, channels: int) -> "Preprocess":
        """The same preprocessing for a model with `channels` inputs (statistics fitted by `fit_stats`)."""
        if channels == self.channels:
            return self
        return replace(self, channels=int(channels), mean=fit_stats(self.mean, channels, "mean"), std=fit_stats(self.std, channels, "std"))

    @property
    def resize_size(self) -> tuple[int, int]:
        h, w = self.crop_size
        return (int(round(h / self.crop_pct)), int(round(w / self.crop_pct)))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["crop_size"] = list(self.crop_size)
        d["mean"] = list(self.mean)
        d["std"] = list(self.std)
        d["color_mode"] = self.color_mode
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Preprocess":
        """From a dict written by ``to_dict`` (a manifest, a checkpoint's metadata); SpecError when a field is malformed."""
        try:
            return cls._from_dict(d)
        except SpecError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as err:
            raise SpecError(f"the preprocessing record is malformed ({_detail(err)})") from None

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> "Preprocess":
        if "channels" not in d and len(d["mean"]) != len(d["std"]) and 1 not in (len(d["mean"]), len(d["std"])):
            raise ValueError(f"mean has {len(d['mean'])} values and std {len(d['std'])}; give one value per channel (or one to broadcast)")
        channels = int(d.get("channels", len(d["mean"])))
        crop_size = tuple(int(v) for v in d["crop_size"])
        if len(crop_size) != 2:
            raise ValueError(f"crop_size holds {len(crop_size)} values, not 2 (height, width)")
        interpolation = str(d.get("interpolation", "bilinear"))
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation {interpolation[:40]!r} is none of {', '.join(INTERPOLATIONS)}")
        return cls(
            channels=channels,
            crop_size=crop_size,  # type: ignore[arg-type]
            crop_pct=float(d.get("crop_pct", 1.0)),
            interpolation=interpolation,
            mean=fit_stats(tuple(d["mean"]), channels, "mean"),
            std=fit_stats(tuple(d["std"]), channels, "std"),
        )


@dataclass(frozen=True)
class ModelSpec:
    """Architecture and input facts of a ViT, with where each came from."""

    family: str  # timm, torchvision, huggingface, custom, torchscript, torch.export, onnx
    image_size: tuple[int, int]
    patch_size: int | None
    embed_dim: int | None
    depth: int | None
    num_heads: int | None
    num_classes: int | None  # None for encoders that output an embedding
    num_prefix_tokens: int | None  # class token (+ distillation token, + registers)
    num_params: int | None
    preprocess: Preprocess
    variant: str = "vit"  # vit, deit-distilled, hybrid-resnet, encoder
    output_kind: str = "logits"  # logits or embedding
    class_names: tuple[str, ...] | None = None
    arch_name: str | None = None  # the preset / timm name when one matched
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int | None:
        if self.patch_size is None or self.num_prefix_tokens is None:
            return None
        h, w = self.image_size
        return (h // self.patch_size) * (w // self.patch_size) + self.num_prefix_tokens

    @property
    def grid(self) -> tuple[int, int] | None:
        if self.patch_size is None:
            return None
        return (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)

    def with_changes(self, **changes: object) -> "ModelSpec":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "preprocess":
                v = v.to_dict()
            elif isinstance(v, tuple):
                v = list(v)
            d[f.name] = v
        d["num_tokens"] = self.num_tokens
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelSpec":
        """From a dict written by ``to_dict`` (an ONNX file's metadata, a manifest); SpecError when a field is malformed."""
        try:
            return cls._from_dict(d)
        except SpecError:
            raise
        except KeyError as err:
            raise SpecError(f"the model spec lacks '{err.args[0]}'") from None
        except (TypeError, ValueError, AttributeError, OverflowError) as err:
            raise SpecError(f"the model spec is malformed ({_detail(err)})") from None

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> "ModelSpec":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["image_size"] = tuple(kw["image_size"])
        if len(kw["image_size"]) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in kw["image_size"]):
            raise ValueError(f"image_size must be two positive integers, got {kw['image_size']!r}")
        for name in ("patch_size", "embed_dim", "depth", "num_heads", "num_classes", "num_prefix_tokens"):
            value = kw.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or null, got {value!r}")
        kw["preprocess"] = Preprocess.from_dict(kw["preprocess"])
        if kw.get("class_names") is not None:
            kw["class_names"] = tuple(kw["class_names"])
            if not all(isinstance(n, str) for n in kw["class_names"]):
                raise ValueError("class_names must be a list of strings")
        kw["sources"] = dict(kw.get("sources") or {})
        return cls(**kw)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelSpec":
        """The spec in ``text`` (a model's metadata, a graph's), in one line when it is not JSON, nests too deep or holds
        NaN (BadDocument) or lacks or mistypes a field (SpecError, from ``from_dict``); both are ValueErrors, never
        KeyError or RecursionError."""
        return cls.from_dict(parse_json(text, "the model spec", what="model spec"))
