"""Small real ViTs of every shape vitedge meets (random weights), for the test_quantize_* modules:
each model is built, saved as users save it, loaded with vitedge's intake and exported with
vitedge's exporter once per process."""

from __future__ import annotations

import atexit
import collections
import functools
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
CALIB_DIR = REPO / "calibration" / "digits" / "calib"
VAL_DIR = REPO / "calibration" / "digits" / "val"
DIGITS_PT = REPO / "examples" / "digits_vit.pt"
POSTNORM_PT = REPO / "examples" / "postnorm_vit.pt"
POSTNORM_PY = REPO / "examples" / "postnorm_vit.py"

_WORK = Path(tempfile.mkdtemp(prefix="vitedge-test-quantize-"))
atexit.register(shutil.rmtree, _WORK, True)

# Hand-written ViTs: the --model-class path. Written to a file because that is how a
# user hands vitedge a class.
CUSTOM_SOURCE = '''
import torch
from torch import nn


class _Patches(nn.Module):
    def __init__(self, dim, patch=8, image=32):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)

    def forward(self, x):
        t = self.proj(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1) + self.pos


class PreNormEncoderViT(nn.Module):
    """nn.TransformerEncoder, norm_first=True (pre-norm)."""

    pretrained_cfg = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "crop_pct": 1.0, "interpolation": "bilinear", "input_size": (3, 32, 32)}

    def __init__(self, dim=32, depth=2, heads=2, classes=10):
        super().__init__()
        self.embed = _Patches(dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.norm(self.encoder(self.embed(x)))[:, 0])


class SplitQKVViT(nn.Module):
    """Separate q/k/v Linear layers (Hugging Face style): one LayerNorm output feeds three."""

    pretrained_cfg = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "crop_pct": 1.0, "interpolation": "bilinear", "input_size": (3, 32, 32)}

    def __init__(self, dim=32, depth=2, heads=2, classes=10):
        super().__init__()
        self.heads = heads
        self.embed = _Patches(dim)
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(nn.ModuleDict({
                "ln1": nn.LayerNorm(dim), "q": nn.Linear(dim, dim), "k": nn.Linear(dim, dim), "v": nn.Linear(dim, dim),
                "o": nn.Linear(dim, dim), "ln2": nn.LayerNorm(dim), "fc1": nn.Linear(dim, 2 * dim), "fc2": nn.Linear(2 * dim, dim),
            }))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x)
        b, n, d = x.shape
        h = self.heads
        for blk in self.blocks:
            y = blk["ln1"](x)
            q, k, v = (blk[p](y).reshape(b, n, h, d // h).transpose(1, 2) for p in ("q", "k", "v"))
            a = torch.softmax(q @ k.transpose(-2, -1) * (d // h) ** -0.5, dim=-1)
            x = x + blk["o"]((a @ v).transpose(1, 2).reshape(b, n, d))
            x = x + blk["fc2"](nn.functional.gelu(blk["fc1"](blk["ln2"](x))))
        return self.head(self.norm(x)[:, 0])
'''

MODELS = ("timm", "torchvision", "deit_distilled", "prenorm_encoder", "postnorm", "split_qkv")


@functools.lru_cache(maxsize=None)
def fp32_model(name: str) -> tuple[Path, object]:
    """(FP32 ONNX path, ModelSpec) of a small random-weight model, exported once per process."""
    import torch

    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    torch.manual_seed(0)
    pt = _WORK / f"{name}.pt"
    opts = IntakeOptions()
    if name == "timm":
        import timm

        m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10)
        opts = IntakeOptions(num_heads=3)
    elif name == "torchvision":
        from torchvision.models.vision_transformer import VisionTransformer

        m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10)
        torch.nn.init.normal_(m.heads.head.weight, std=0.5)
        opts = IntakeOptions(num_heads=2)
    elif name == "deit_distilled":
        from timm.models.deit import VisionTransformerDistilled

        m = VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10)
        torch.nn.init.normal_(m.head.weight, std=0.2)
        torch.nn.init.normal_(m.head_dist.weight, std=0.2)
        opts = IntakeOptions(num_heads=3)
    elif name == "postnorm":
        import importlib.util

        spec = importlib.util.spec_from_file_location("vitedge_test_postnorm", POSTNORM_PY)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        kwargs = dict(dim=32, depth=2, heads=2, mlp_dim=64)
        m = mod.PostNormViT(**kwargs)
        opts = IntakeOptions(model_class=f"{POSTNORM_PY}:PostNormViT", model_kwargs=kwargs)
    elif name in ("prenorm_encoder", "split_qkv"):
        src = _WORK / "custom_vits.py"
        if not src.exists():
            src.write_text(CUSTOM_SOURCE)
        cls = {"prenorm_encoder": "PreNormEncoderViT", "split_qkv": "SplitQKVViT"}[name]
        namespace: dict = {}
        exec(compile(CUSTOM_SOURCE, str(src), "exec"), namespace)
        m = namespace[cls]()
        opts = IntakeOptions(model_class=f"{src}:{cls}")
    else:  # pragma: no cover
        raise KeyError(name)
    torch.save(m.eval().state_dict(), pt)
    loaded = load_model(pt, opts)
    out = _WORK / f"{name}.onnx"
    export_onnx(loaded, out)
    return out, loaded.spec


@functools.lru_cache(maxsize=None)
def bundled_model(which: str = "digits") -> tuple[Path, object]:
    """The trained example models (skips the test when they are not in the checkout)."""
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    pt = DIGITS_PT if which == "digits" else POSTNORM_PT
    if not pt.exists():
        pytest.skip(f"{pt.relative_to(REPO)} is not in this checkout")
    opts = IntakeOptions() if which == "digits" else IntakeOptions(model_class=f"{POSTNORM_PY}:PostNormViT")
    loaded = load_model(pt, opts)
    out = _WORK / f"bundled_{which}.onnx"
    export_onnx(loaded, out)
    return out, loaded.spec


def source_for(spec, limit: int | None = 16, seed: int = 0, path: Path = CALIB_DIR):
    from vitedge.datasources.sources import open_source

    return open_source(path, spec.preprocess, limit=limit, seed=seed, class_names=spec.class_names)


def graph_io(model):
    """producer and consumers maps of an onnx ModelProto."""
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            consumers[i].append(n)
    return producer, consumers


def run_ort(model_or_path, x: np.ndarray) -> np.ndarray:
    from vitedge.onnxkit.session import ort_session

    src = model_or_path.SerializeToString() if hasattr(model_or_path, "SerializeToString") else Path(model_or_path)
    sess = ort_session(src, threads=2)
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]
