"""Hugging Face model folders: config.json + weights, preprocessor_config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitedge.core import telemetry
from vitedge.core.errors import (
    MissingDependencyError,
    ModelLoadError,
    UnsafePickleError,
    UsageError,
)
from vitedge.models.construct import resample_pos_embed
from vitedge.files.safefile import read_json
from vitedge.bundle.spec import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    SOURCE_DEFAULT,
    SOURCE_FILE,
    Preprocess,
)

# PIL resample codes used in preprocessor_config.json
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}


def _wrapper_class():
    import torch

    class HuggingFaceViT(torch.nn.Module):
        """Tensor in, tensor out: logits for classifiers, the class-token embedding for encoders."""

        def __init__(self, model, output_kind: str):
            super().__init__()
            self.model = model
            self.output_kind = output_kind

        def forward(self, pixel_values):
            out = self.model(pixel_values=pixel_values, return_dict=True)
            if self.output_kind == "logits":
                return out.logits
            return out.last_hidden_state[:, 0]

    return HuggingFaceViT


def read_preprocess(folder: Path, image_size: tuple[int, int]) -> tuple[Preprocess, str]:
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        return Preprocess(crop_size=image_size, crop_pct=1.0, interpolation="bilinear", mean=IMAGENET_MEAN, std=IMAGENET_STD), SOURCE_DEFAULT
    try:
        cfg = read_json(path, what="preprocessor config")
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{err}; fix or remove {path.name}") from None
    mean = tuple(cfg.get("image_mean", IMAGENET_MEAN))
    std = tuple(cfg.get("image_std", IMAGENET_STD))
    interp = _RESAMPLE.get(int(cfg.get("resample", 2)), "bilinear")
    crop_pct = 1.0
    size = cfg.get("size") or {}
    crop = cfg.get("crop_size") or {}
    try:
        if cfg.get("do_center_crop") and isinstance(size, dict) and "shortest_edge" in size and crop.get("height"):
            crop_pct = float(crop["height"]) / float(size["shortest_edge"])
        return Preprocess(crop_size=image_size, crop_pct=crop_pct, interpolation=interp, mean=mean, std=std), SOURCE_FILE  # type: ignore[arg-type]
    except (ValueError, TypeError, ZeroDivisionError) as err:  # a crop ratio past its floor, a size of 0, a string
        raise ModelLoadError(f"{path}: its preprocessing does not fit ({str(err)[:160]}); fix its size, crop_size, "
                             "image_mean and image_std") from None


def load_hf_folder(folder: Path, *, input_size: tuple[int, int] | None) -> tuple[Any, dict[str, Any]]:
    """Returns (module, facts) where facts carries the architecture read from config.json."""
    telemetry.silence()  # Hugging Face Hub reads its telemetry switch when imported
    try:
        import transformers
    except ImportError:
        raise MissingDependencyError("transformers (to read Hugging Face model folders)", "pip install 'vitedge[hf]'") from None

    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as err:
        raise ModelLoadError(f"{folder}/config.json cannot be read by transformers ({str(err).splitlines()[0][:160]})") from err
    if not hasattr(config, "patch_size") or not hasattr(config, "image_size"):
        raise ModelLoadError(f"{folder}: found a Hugging Face '{config.model_type}' model, not a Vision Transformer; vitedge deploys ViT/DeiT models")
    archs = getattr(config, "architectures", None) or []
    is_classifier = any("ForImageClassification" in a for a in archs)
    auto = transformers.AutoModelForImageClassification if is_classifier else transformers.AutoModel
    try:
        model = auto.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    except Exception as err:
        if "Weights only load failed" in str(err):
            raise UnsafePickleError(f"{folder}: the weights file holds pickled Python objects, and unpickling can run arbitrary code; "
                                    "vitedge loads Hugging Face .bin weights as tensors only: save them as safetensors from a source you trust") from None
        raise ModelLoadError(f"{folder}: the weights cannot be loaded ({str(err).splitlines()[0][:160]})") from err
    trained = int(config.image_size)
    if input_size is not None and tuple(input_size) != (trained, trained):
        model = _resize_hf(model, config, input_size, auto)
    model.eval()
    output_kind = "logits" if is_classifier else "embedding"
    id2label = getattr(config, "id2label", None) or {}
    class_names = tuple(id2label[i] for i in sorted(id2label)) if is_classifier and id2label else None
    facts = {
        "patch_size": int(config.patch_size),
        "embed_dim": int(config.hidden_size),
        "depth": int(config.num_hidden_layers),
        "num_heads": int(config.num_attention_heads),
        "num_classes": int(config.num_labels) if is_classifier else None,
        "image_size": tuple(input_size) if input_size else (trained, trained),
        "trained_size": (trained, trained),
        "num_prefix_tokens": 2 if config.model_type == "deit" else 1,
        "variant": ("deit-distilled" if "WithTeacher" in "".join(archs) else "vit") if is_classifier else "encoder",
        "output_kind": output_kind,
        "class_names": class_names,
        "arch_name": archs[0] if archs else config.model_type,
    }
    return _wrapper_class()(model, output_kind).eval(), facts


def _resize_hf(model, config, input_size, auto):
    import torch


    if input_size[0] != input_size[1]:
        raise UsageError("Hugging Face ViT folders support square --input-size only")
    sd = model.state_dict()
    key = next((k for k in sd if k.endswith("embeddings.position_embeddings")), None)
    if key is None:
        raise ModelLoadError("this Hugging Face model has no learned position embeddings to resample")
    prefix = 2 if config.model_type == "deit" else 1
    old = int(config.image_size) // int(config.patch_size)
    new = int(input_size[0]) // int(config.patch_size)
    sd[key] = resample_pos_embed(sd[key], (old, old), (new, new), prefix)
    config.image_size = int(input_size[0])
    with torch.no_grad():
        resized = auto.from_config(config, attn_implementation="eager")
        resized.load_state_dict(sd)
    return resized
