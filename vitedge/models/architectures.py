"""Today's ViT families beyond the plain timm/torchvision ViT, read from state_dict keys.

Each family is a recogniser in ``FAMILIES`` (a registry, tried in order): it reads what
the weights say (widths, depths, heads from relative-position tables, window and patch
grid) and names the registered timm / torchvision builder whose other settings (rotary
embedding reference grid, activation, norm epsilon, preprocessing) the weights cannot
say. The builder is then called with the shapes read from the weights and the
state_dict is loaded strictly, so a wrong guess is a one-line error, never a silent
mismatch.

    relpos     timm VisionTransformerRelPos (vit_relpos_*): relative position MLP or bias
    eva        timm Eva (EVA-02: rotary embeddings, SwiGLU MLP; EVA-01 without them)
    beit       timm Beit (BEiT / BEiT v2: relative position bias tables, layer scale)
    swin       timm SwinTransformer (shifted-window attention, relative position bias)
    swin-tv    torchvision SwinTransformer (swin_t / swin_s / swin_b; v2 blocks too)

The MAP attention-pool head (SigLIP, ``global_pool='map'``) is a plain timm ViT and is
read by ``layouts.py``.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.models.loading import count_indices, load_strict, require_library
from vitedge.bundle.spec import SOURCE_FILE, SOURCE_FLAG, SOURCE_PRESET

# Heads of every published model of a width, per family (tiny/small/base/large/...).
_HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16, 1408: 16, 1152: 16}


@dataclass
class FamilyLayout:
    """What the weights say about a model of one of the families above."""

    family: str  # timm or torchvision (whose builder makes it)
    variant: str  # relpos, eva02, eva, beit, swin
    base_arch: str  # the registered builder whose remaining settings are used
    patch_size: int
    embed_dim: int
    depth: int  # transformer blocks in all stages
    num_classes: int  # 0 = encoder
    num_prefix_tokens: int
    kwargs: dict[str, Any] = field(default_factory=dict)  # shapes read from the weights
    heads: int | tuple[int, ...] | None = None  # read from relative-position tables
    grid: tuple[int, int] | None = None  # trained patch grid; None = the weights fit any size
    grid_multiple: int = 1  # the input must be a multiple of patch_size * this
    in_chans: int = 3

    @property
    def first_heads(self) -> int | None:
        return self.heads[0] if isinstance(self.heads, tuple) else self.heads


def _has(sd: dict[str, Any], *keys: str) -> bool:
    return all(k in sd for k in keys)


def _any(sd: dict[str, Any], pattern: str) -> bool:
    rx = re.compile(pattern)
    return any(rx.match(k) for k in sd)


def _head_classes(sd: dict[str, Any], *keys: str) -> int:
    for k in keys:
        if k in sd:
            return int(sd[k].shape[0])
    return 0


def _table_grid(rows: int, extra: int) -> tuple[int, int] | None:
    """(2H-1)(2W-1) + extra rows -> (H, W) for a square window."""
    side = math.isqrt(rows - extra)
    if side * side != rows - extra or side % 2 == 0:
        return None
    return ((side + 1) // 2, (side + 1) // 2)


def _by_width(width: int, names: dict[int, str], fallback: str) -> str:
    return names.get(width, fallback)


# --------------------------------------------------------------------------- timm relpos


def _is_relpos(sd: dict[str, Any]) -> bool:
    return "pos_embed" not in sd and _any(sd, r"(blocks\.0\.attn\.rel_pos\.|shared_rel_pos\.)")


def _read_relpos(sd: dict[str, Any], where: str) -> FamilyLayout:
    proj = sd["patch_embed.proj.weight"]
    dim, patch = int(proj.shape[0]), int(proj.shape[-1])
    depth = count_indices(sd, r"blocks\.(\d+)\.")
    prefix = "shared_rel_pos." if _any(sd, r"shared_rel_pos\.") else "blocks.0.attn.rel_pos."
    kwargs: dict[str, Any] = {
        "embed_dim": dim, "depth": depth, "patch_size": patch,
        "mlp_ratio": int(sd["blocks.0.mlp.fc1.weight"].shape[0]) / dim,
        "qkv_bias": "blocks.0.attn.qkv.bias" in sd or "blocks.0.attn.q_bias" in sd,
        "class_token": "cls_token" in sd, "fc_norm": "fc_norm.weight" in sd,
        "global_pool": "avg" if "fc_norm.weight" in sd or "cls_token" not in sd else "token",
        "shared_rel_pos": prefix == "shared_rel_pos.",
        "init_values": 1e-5 if "blocks.0.ls1.gamma" in sd else None,
    }
    grid = None
    if f"{prefix}mlp.fc2.weight" in sd:
        heads = int(sd[f"{prefix}mlp.fc2.weight"].shape[0])
        kwargs["rel_pos_type"] = "mlp"
        kwargs["rel_pos_dim"] = int(sd[f"{prefix}mlp.fc1.weight"].shape[0])
    elif f"{prefix}relative_position_bias_table" in sd:
        table = sd[f"{prefix}relative_position_bias_table"]
        heads = int(table.shape[1])
        kwargs["rel_pos_type"] = "bias"
        grid = _table_grid(int(table.shape[0]), 0)
        if grid is None:
            raise ModelLoadError(f"{where}: relative position table of {table.shape[0]} rows fits no square patch grid; the file looks damaged")
    else:
        raise ModelLoadError(f"{where}: a relative-position ViT with neither a rel_pos MLP nor a bias table; the file looks damaged")
    base = "vit_relpos_base_patch16_clsgap_224" if kwargs["class_token"] else "vit_relpos_base_patch16_224"
    return FamilyLayout("timm", "relpos", base, patch, dim, depth, _head_classes(sd, "head.weight"), int(kwargs["class_token"]),
                        kwargs, heads, grid, in_chans=int(proj.shape[1]))


# --------------------------------------------------------------------------- timm EVA / EVA-02


def _is_eva(sd: dict[str, Any]) -> bool:
    return (_any(sd, r"blocks\.0\.mlp\.(fc1_g|fc1_x|norm)\.") or _has(sd, "blocks.0.attn.q_bias", "pos_embed")
            or _any(sd, r"blocks\.0\.attn\.q_proj\.")) and "blocks.0.attn.relative_position_bias_table" not in sd


def _read_eva(sd: dict[str, Any], where: str) -> FamilyLayout:
    proj = sd["patch_embed.proj.weight"]
    dim, patch = int(proj.shape[0]), int(proj.shape[-1])
    depth = count_indices(sd, r"blocks\.(\d+)\.")
    fc2_in = int(sd["blocks.0.mlp.fc2.weight"].shape[1])
    unfused_glu = "blocks.0.mlp.fc1_g.weight" in sd
    fc1_out = int(sd["blocks.0.mlp.fc1_g.weight" if unfused_glu else "blocks.0.mlp.fc1.weight"].shape[0])
    swiglu = unfused_glu or fc1_out == 2 * fc2_in
    prefix = int("cls_token" in sd) + (int(sd["reg_token"].shape[1]) if "reg_token" in sd else 0)
    pos = sd.get("pos_embed")
    grid = None
    no_embed_class = False
    if pos is not None:
        tokens = int(pos.shape[1])
        side = math.isqrt(tokens - prefix)
        if side * side == tokens - prefix:
            grid = (side, side)
        elif prefix and math.isqrt(tokens) ** 2 == tokens:
            grid, no_embed_class = (math.isqrt(tokens),) * 2, True
    if grid is None:
        raise ModelLoadError(f"{where}: cannot read the patch grid of this EVA model from pos_embed; pass --arch NAME")
    kwargs: dict[str, Any] = {
        "embed_dim": dim, "depth": depth, "patch_size": patch,
        "mlp_ratio": fc2_in / dim, "swiglu_mlp": swiglu,
        "scale_mlp": "blocks.0.mlp.norm.weight" in sd,
        "qkv_fused": "blocks.0.attn.qkv.weight" in sd,
        "qkv_bias": "blocks.0.attn.q_bias" in sd or "blocks.0.attn.q_proj.bias" in sd,
        "class_token": "cls_token" in sd, "no_embed_class": no_embed_class,
        "use_fc_norm": "fc_norm.weight" in sd,
        "global_pool": "avg" if "fc_norm.weight" in sd or "cls_token" not in sd else "token",
        "init_values": 1e-5 if "blocks.0.gamma_1" in sd else None,
    }
    if swiglu:
        # EVA-02 (rotary embeddings with their 16x16 reference grid); EVA-01 has a GELU MLP.
        base = _by_width(dim, {384: "eva02_small_patch14_224", 768: "eva02_base_patch14_224", 1024: "eva02_large_patch14_224"}, "eva02_tiny_patch14_224")
        variant = "eva02"
    else:
        base, variant = "eva_giant_patch14_224", "eva"
    if "reg_token" in sd:
        kwargs["num_reg_tokens"] = int(sd["reg_token"].shape[1])
    return FamilyLayout("timm", variant, base, patch, dim, depth, _head_classes(sd, "head.weight"), prefix, kwargs,
                        None, grid, in_chans=int(proj.shape[1]))


# --------------------------------------------------------------------------- timm BEiT


def _is_beit(sd: dict[str, Any]) -> bool:
    return _any(sd, r"(blocks\.0\.attn\.relative_position_bias_table|rel_pos_bias\.relative_position_bias_table)") and _any(sd, r"blocks\.0\.")


def _read_beit(sd: dict[str, Any], where: str) -> FamilyLayout:
    proj = sd["patch_embed.proj.weight"]
    dim, patch = int(proj.shape[0]), int(proj.shape[-1])
    depth = count_indices(sd, r"blocks\.(\d+)\.")
    shared = "rel_pos_bias.relative_position_bias_table" in sd
    table = sd["rel_pos_bias.relative_position_bias_table" if shared else "blocks.0.attn.relative_position_bias_table"]
    grid = _table_grid(int(table.shape[0]), 3)  # + cls->token, token->cls, cls->cls
    if grid is None:
        raise ModelLoadError(f"{where}: BEiT relative position table of {table.shape[0]} rows fits no square patch grid; the file looks damaged")
    kwargs: dict[str, Any] = {
        "embed_dim": dim, "depth": depth, "patch_size": patch,
        "mlp_ratio": int(sd["blocks.0.mlp.fc1.weight"].shape[0]) / dim if "blocks.0.mlp.fc1.weight" in sd else 4.0,
        "qkv_bias": "blocks.0.attn.q_bias" in sd,
        "use_abs_pos_emb": "pos_embed" in sd,
        "use_rel_pos_bias": not shared, "use_shared_rel_pos_bias": shared,
        "init_values": 0.1 if "blocks.0.gamma_1" in sd else None,
        "use_fc_norm": "fc_norm.weight" in sd,
        "global_pool": "avg" if "fc_norm.weight" in sd else "token",
    }
    base = "beit_large_patch16_224" if dim == 1024 else "beit_base_patch16_224"
    return FamilyLayout("timm", "beit", base, patch, dim, depth, _head_classes(sd, "head.weight"), 1, kwargs,
                        int(table.shape[1]), grid, in_chans=int(proj.shape[1]))


# --------------------------------------------------------------------------- timm Swin


def _is_swin(sd: dict[str, Any]) -> bool:
    return _any(sd, r"layers\.0\.blocks\.0\.attn\.relative_position_bias_table") and "patch_embed.proj.weight" in sd


def _read_swin(sd: dict[str, Any], where: str) -> FamilyLayout:
    proj = sd["patch_embed.proj.weight"]
    dim, patch = int(proj.shape[0]), int(proj.shape[-1])
    stages = count_indices(sd, r"layers\.(\d+)\.")
    depths = tuple(count_indices(sd, rf"layers\.{s}\.blocks\.(\d+)\.") for s in range(stages))
    tables = [sd[f"layers.{s}.blocks.0.attn.relative_position_bias_table"] for s in range(stages)]
    heads = tuple(int(t.shape[1]) for t in tables)
    window = _table_grid(int(tables[0].shape[0]), 0)
    if window is None:
        raise ModelLoadError(f"{where}: Swin relative position table of {tables[0].shape[0]} rows fits no square window; the file looks damaged")
    kwargs: dict[str, Any] = {
        "embed_dim": dim, "depths": depths, "num_heads": heads, "patch_size": patch, "window_size": window[0],
        "mlp_ratio": int(sd["layers.0.blocks.0.mlp.fc1.weight"].shape[0]) / dim,
        "qkv_bias": "layers.0.blocks.0.attn.qkv.bias" in sd,
    }
    base = {128: "swin_base_patch4_window7_224", 192: "swin_large_patch4_window7_224"}.get(dim, "swin_tiny_patch4_window7_224")
    return FamilyLayout("timm", "swin", base, patch, dim, sum(depths), _head_classes(sd, "head.fc.weight", "head.weight"), 0, kwargs,
                        heads, None, grid_multiple=2 ** (stages - 1) * window[0], in_chans=int(proj.shape[1]))


# --------------------------------------------------------------------------- torchvision Swin


def _is_tv_swin(sd: dict[str, Any]) -> bool:
    return "features.0.0.weight" in sd and _any(sd, r"features\.1\.0\.attn\.")


def _read_tv_swin(sd: dict[str, Any], where: str) -> FamilyLayout:
    proj = sd["features.0.0.weight"]
    dim, patch = int(proj.shape[0]), int(proj.shape[-1])
    # features: 0 patch embedding, then (stage, patch merging) pairs: 1, 3, 5, 7 are stages.
    stage_ids = sorted({int(m.group(1)) for k in sd if (m := re.match(r"features\.(\d+)\.\d+\.attn\.", k))})
    depths = tuple(count_indices(sd, rf"features\.{s}\.(\d+)\.attn\.") for s in stage_ids)
    v2 = "features.1.0.attn.logit_scale" in sd
    if v2:
        heads = tuple(int(sd[f"features.{s}.0.attn.logit_scale"].shape[0]) for s in stage_ids)
        window = None
    else:
        tables = [sd[f"features.{s}.0.attn.relative_position_bias_table"] for s in stage_ids]
        heads = tuple(int(t.shape[1]) for t in tables)
        window = _table_grid(int(tables[0].shape[0]), 0)
    index = sd.get("features.1.0.attn.relative_position_index")
    if window is None and index is not None:
        side = math.isqrt(int(index.numel()))
        window = (math.isqrt(side),) * 2 if math.isqrt(side) ** 2 == side else None
    if window is None:
        raise ModelLoadError(f"{where}: cannot read the window size of this torchvision Swin; the file looks damaged")
    kwargs: dict[str, Any] = {
        "patch_size": [patch, patch], "embed_dim": dim, "depths": list(depths), "num_heads": list(heads),
        "window_size": list(window), "mlp_ratio": int(sd["features.1.0.mlp.0.weight"].shape[0]) / dim, "v2": v2,
    }
    base = ("swin_v2_" if v2 else "swin_") + {96: "t", 128: "b"}.get(dim, "t")
    if dim == 96 and depths[2:3] == (18,):
        base = base[:-1] + "s"
    return FamilyLayout("torchvision", "swin", base, patch, dim, sum(depths), _head_classes(sd, "head.weight"), 0, kwargs,
                        heads, None, grid_multiple=2 ** (len(depths) - 1), in_chans=int(proj.shape[1]))


@dataclass(frozen=True)
class Family:
    name: str
    matches: Callable[[dict[str, Any]], bool]
    read: Callable[[dict[str, Any], str], FamilyLayout]


FAMILIES: tuple[Family, ...] = (
    Family("torchvision Swin", _is_tv_swin, _read_tv_swin),
    Family("timm Swin", _is_swin, _read_swin),
    Family("timm BEiT", _is_beit, _read_beit),
    Family("timm relative-position ViT", _is_relpos, _read_relpos),
    Family("timm EVA", _is_eva, _read_eva),
)


def recognise(sd: dict[str, Any], where: str) -> FamilyLayout | None:
    """The family layout of ``sd``, or None when it is none of these families."""
    for fam in FAMILIES:
        if fam.matches(sd):
            return fam.read(sd, where)
    return None


def resolve_heads(fl: FamilyLayout, flag: int | None, meta_heads: int | None) -> tuple[int | tuple[int, ...], str]:
    """Heads from the weights, then the flag / file metadata, then the width's standard value."""

    if fl.heads is not None:
        if flag and flag != fl.first_heads:
            raise UsageError(f"--num-heads {flag} contradicts the weights, whose relative position tables have {fl.first_heads} heads; drop --num-heads")
        return fl.heads, SOURCE_FILE
    if flag:
        heads, source = int(flag), SOURCE_FLAG
    elif meta_heads:
        heads, source = int(meta_heads), SOURCE_FILE
    elif fl.embed_dim in _HEADS_BY_WIDTH:
        heads, source = _HEADS_BY_WIDTH[fl.embed_dim], f"{SOURCE_PRESET} (every published {fl.variant} of width {fl.embed_dim})"
    else:
        raise ModelLoadError(
            f"the number of attention heads of this {fl.variant} model (width {fl.embed_dim}, depth {fl.depth}) cannot be read "
            "from its weights; pass --num-heads N"
        )
    if fl.embed_dim % heads:
        raise UsageError(f"embedding width {fl.embed_dim} is not divisible by {heads} heads; check --num-heads")
    return heads, source


def default_image_size(fl: FamilyLayout) -> tuple[int, int]:
    """The trained size when the weights say it, else the base architecture's."""
    if fl.grid is not None:
        return (fl.grid[0] * fl.patch_size, fl.grid[1] * fl.patch_size)
    return (224, 224)


def check_image_size(fl: FamilyLayout, size: tuple[int, int]) -> tuple[int, int]:
    step = fl.patch_size * fl.grid_multiple
    if size[0] % step or size[1] % step:
        what = f"the patch size {fl.patch_size}" if fl.grid_multiple == 1 else f"{step} (patch {fl.patch_size} x {fl.grid_multiple} for the {fl.variant} stages and windows)"
        raise UsageError(f"input size {size[0]}x{size[1]} is not a multiple of {what}; pass --input-size H W with multiples of {step}")
    return (int(size[0]), int(size[1]))


def build_family(fl: FamilyLayout, sd: dict[str, Any], *, heads, image_size: tuple[int, int], where: str):
    """The module of ``fl``'s family at ``image_size`` with ``sd`` loaded strictly."""

    if fl.family == "torchvision":
        require_library("torchvision", "torchvision (to build torchvision Swin models)", "models")
        module = _build_tv_swin(fl, heads)
        return load_strict(module, sd, where)
    require_library("timm", f"timm (to build {fl.variant} models)", "models")
    import timm

    kwargs = dict(fl.kwargs, num_classes=fl.num_classes, in_chans=fl.in_chans, img_size=image_size)
    kwargs.setdefault("num_heads", heads)
    module = timm.create_model(fl.base_arch, pretrained=False, **kwargs)
    if fl.grid is not None and tuple(image_size) != default_image_size(fl):
        sd = _resize_for(module, sd, fl, where)
    explicit_attention(module)
    return load_strict(module, sd, where)


def explicit_attention(module) -> None:
    """timm attention on its explicit softmax(q.k^T)v path: the same numbers, and it traces to
    ONNX (EVA's fused path passes is_causal as a traced tensor, which the exporter rejects)."""
    for m in module.modules():
        if getattr(m, "fused_attn", None) is True:
            m.fused_attn = False


def _resize_for(module, sd: dict[str, Any], fl: FamilyLayout, where: str) -> dict[str, Any]:
    """timm's own checkpoint filter resamples position embeddings / relative position tables."""

    mod = importlib.import_module(type(module).__module__)
    fn = getattr(mod, "checkpoint_filter_fn", None)
    if fn is None:
        raise UsageError(f"{where}: a {fl.variant} model cannot be exported at another --input-size; drop the flag")
    try:
        return fn(dict(sd), module)
    except Exception as err:  # timm raises plain errors for tables it cannot resample
        raise UsageError(f"{where}: resizing this {fl.variant} model's position tables failed ({str(err)[:120]}); drop --input-size") from err


def _build_tv_swin(fl: FamilyLayout, heads):
    import torch
    from torchvision.models import swin_transformer as tvs

    kw = dict(fl.kwargs)
    v2 = kw.pop("v2")
    extra = {"block": tvs.SwinTransformerBlockV2, "downsample_layer": tvs.PatchMergingV2} if v2 else {}
    module = tvs.SwinTransformer(num_classes=max(fl.num_classes, 1), **kw, **extra)
    if fl.num_classes == 0:
        module.head = torch.nn.Identity()
    return module
