"""`--arch NAME` for any timm architecture, and the nearest timm architectures of a state_dict.

``load_timm_arch`` builds timm's own class for NAME (the head sized from the weights),
refuses a model that is not a vision transformer, and loads the state_dict strictly.
``closest_archs`` ranks timm architectures by how many of their keys and shapes the
state_dict shares; building each candidate takes a second or two even on the meta
device, so the candidates are first narrowed by key structure, patch size and width.
"""

from __future__ import annotations

import re
from typing import Any

from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.models.architectures import explicit_attention
from vitedge.models.loading import require_library

MAX_CANDIDATES = 6

# timm modules whose models are vision transformers, by the key structure they share.
_BLOCK_MODULES = ("vision_transformer", "vision_transformer_relpos", "eva", "beit", "deit", "vision_transformer_hybrid")
_STAGE_MODULES = ("swin_transformer", "swin_transformer_v2")
# Keys that name a family, and the prefix of its timm names (first hit wins).
_FAMILY_HINTS = (("layers.0.blocks.", "swin"), ("relative_position_bias_table", "beit"), ("rel_pos.", "vit_relpos"), ("attn_pool.", "vit_"), ("dist_token", "deit"),
                 ("gamma_1", "beit"), ("q_bias", "eva"))
_WIDTH_WORDS = {192: ("tiny",), 384: ("small",), 512: ("medium", "mediumd"), 768: ("base",), 1024: ("large",), 1280: ("huge",),
                1152: ("so400m",), 1408: ("giant",), 96: ("tiny", "small"), 128: ("base",)}


def _timm():

    return require_library("timm", "timm (for --arch with timm architectures)", "models")


def _is_transformer(module) -> bool:
    return any(isinstance(getattr(m, "num_heads", None), int) or type(m).__name__.endswith("Attention") for m in module.modules())


def _family_of(module) -> str:
    return type(module).__module__.rsplit(".", 1)[-1]


def load_timm_arch(name: str, sd: dict[str, Any], where: str, *, input_size: tuple[int, int] | None = None):
    """timm's ``name`` with ``sd`` loaded strictly (the head sized from the weights)."""
    timm = _timm()
    import torch

    if not timm.is_model(name):
        token = name.split("_")[0]
        close = [n for n in timm.list_models(f"{token}*") if n != name][:6]
        hint = f"; similar timm names: {', '.join(close)}" if close else ""
        raise UsageError(f"unknown --arch '{name}': neither a vitedge preset nor a timm architecture{hint}")
    with torch.device("meta"):
        probe = timm.create_model(name, pretrained=False)
    if not _is_transformer(probe):
        raise ModelLoadError(
            f"--arch {name} is a {type(probe).__name__} (timm family '{_family_of(probe)}') with no attention layers, "
            "not a vision transformer; vitedge deploys ViT-family models"
        )
    head = _classifier_key(probe)
    kwargs: dict[str, Any] = {}
    if head is not None:
        kwargs["num_classes"] = int(sd[head].shape[0]) if head in sd else 0
    if input_size is not None:
        kwargs["img_size"] = tuple(int(v) for v in input_size)
    try:
        module = timm.create_model(name, pretrained=False, **kwargs)
    except TypeError as err:
        raise UsageError(f"--arch {name} cannot be built at --input-size {input_size}: {err}; drop --input-size") from err
    missing, unexpected, mismatched = _fit(module.state_dict(), sd)
    if missing or unexpected or mismatched:
        parts = [f"{len(missing)} missing (e.g. {missing[0]})" if missing else "",
                 f"{len(unexpected)} unexpected (e.g. {unexpected[0]})" if unexpected else "",
                 f"{len(mismatched)} of another shape (e.g. {mismatched[0]})" if mismatched else ""]
        best = closest_archs(sd, exclude=name)
        hint = f"; closest timm architectures: {format_matches(best)}" if best else ""
        raise ModelLoadError(f"{where}: the weights do not fit timm's {name}: {'; '.join(p for p in parts if p)}{hint}")
    module.load_state_dict(sd, strict=True)

    explicit_attention(module)
    return module.eval()


def _classifier_key(module) -> str | None:
    try:
        clf = module.get_classifier()
    except Exception:
        return None
    for prefix, m in module.named_modules():
        if m is clf and hasattr(m, "weight"):
            return f"{prefix}.weight"
    return None


def _fit(want: dict[str, Any], sd: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    mismatched = [k for k in want if k in sd and tuple(want[k].shape) != tuple(sd[k].shape)]
    return missing, unexpected, mismatched


def _score(want: dict[str, Any], sd: dict[str, Any]) -> float:
    """Shared keys plus shared shapes over twice the keys of either side: 1.0 is an exact fit,
    0.5 the same keys at other widths."""
    keys = sum(1 for k in sd if k in want)
    shapes = sum(1 for k, v in sd.items() if k in want and tuple(want[k].shape) == tuple(v.shape))
    return (keys + shapes) / max(2 * len(set(want) | set(sd)), 1)


def _candidates(sd: dict[str, Any], exclude: str | None) -> list[str]:
    timm = _timm()
    keys = list(sd)
    if any(re.match(r"layers\.\d+\.blocks\.", k) for k in keys):
        modules = _STAGE_MODULES
    elif any(k.startswith("blocks.") for k in keys):
        modules = _BLOCK_MODULES
    else:
        return []
    names: list[str] = []
    for mod in modules:
        try:
            names += timm.list_models(module=mod)
        except Exception:  # an older timm without module filtering
            return []
    proj = sd.get("patch_embed.proj.weight")
    patch = int(proj.shape[-1]) if proj is not None and getattr(proj, "ndim", 0) == 4 else None
    width = int(proj.shape[0]) if proj is not None else None
    words = _WIDTH_WORDS.get(width or 0, ())

    family = next((prefix for key, prefix in _FAMILY_HINTS if any(key in k for k in keys)), None)

    def rank(n: str) -> tuple[int, int, int, int, str]:
        parts = n.split("_")
        return (
            0 if family is not None and n.startswith(family) else 1,
            0 if patch is not None and (f"patch{patch}" in parts or f"p{patch}" in parts) else 1,
            0 if any(w in parts for w in words) else 1,
            0 if parts[-1] == "224" else 1,
            n,
        )

    hits = [n for n in sorted(set(names), key=rank) if n != exclude]
    return hits[:MAX_CANDIDATES]


def closest_archs(sd: dict[str, Any], *, exclude: str | None = None, top: int = 3) -> list[tuple[str, float]]:
    """The timm architectures whose keys and shapes match ``sd`` best, with the share that matches."""
    try:
        timm = _timm()
        import torch
    except Exception:
        return []
    scored: list[tuple[str, float]] = []
    for name in _candidates(sd, exclude):
        try:
            with torch.device("meta"):
                m = timm.create_model(name, pretrained=False)
        except Exception:  # some configs cannot be built offline
            continue
        scored.append((name, _score(m.state_dict(), sd)))
    scored.sort(key=lambda t: -t[1])
    return [s for s in scored[:top] if s[1] > 0]


def format_matches(matches: list[tuple[str, float]]) -> str:
    return ", ".join(f"{n} ({100 * s:.0f}% of keys and shapes)" for n, s in matches)
