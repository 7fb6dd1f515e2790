"""Bad input and a hostile environment, end to end through the CLI: each class gets its documented
exit code, one line on stderr without a traceback, and leaves no bundle, partial file or cache entry.

Every case here fails before calibration, so none builds anything. docs/reliability.md lists them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from conftest import CALIB_DIR, CUSTOM_VIT_SOURCE, VAL_DIR
from rel_cli import assert_one_line, cli, debris


class Ws:
    """One case's folder: the files a case makes, the output and cache paths it must not leave."""

    def __init__(self, root: Path, model: Path):
        self.root, self.model = root, model
        self.out = root / "out"
        self.cache = root / "cache"

    def build(self, model=None, *extra, calib=None) -> list:
        return ["build", model or self.model, "-t", "onnx", "--calib", calib or CALIB_DIR, "-o", self.out, "-q",
                "--no-latency", "--cache-dir", self.cache, *extra]

    def write(self, name: str, data: bytes | str) -> Path:
        p = self.root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return p

    def state_dict(self, name: str, change) -> Path:
        import torch

        obj = torch.load(self.model, weights_only=True)
        obj = change(obj) or obj
        p = self.root / name
        torch.save(obj, p)
        return p

    def profile(self, text: str) -> Path:
        return self.write("my.toml", text)

    def images(self, name: str, count: int, make=None) -> Path:
        from PIL import Image

        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (make or (lambda p: Image.new("RGB", (32, 32), (i * 7 % 255, 9, 9)).save(p)))(d / f"{i:03d}.png")
        return d


def _with_meta(**meta):
    def change(sd):
        return {"state_dict": sd, "vitedge": meta}
    return change


def _poison(value):
    def change(sd):
        key = "blocks.0.attn.qkv.weight"
        sd[key] = sd[key].clone()
        sd[key][0, 0] = value
    return change


def _npy(ws: Ws, name: str, shape, fill=None) -> Path:
    import numpy as np

    a = np.random.default_rng(0).random(shape, dtype=np.float32)
    if fill is not None:
        a[:, 0, 0, 0] = fill  # every row: a few bad rows are skipped and counted, not fatal
    p = ws.root / name
    np.save(p, a)
    return p


def _model_class(ws: Ws, body: str) -> list:
    src = ws.write("user_model.py", body + CUSTOM_VIT_SOURCE)
    import torch

    sd = ws.state_dict("custom_sd.pt", lambda sd: None)
    return ["--model-class", f"{src}:TinyViT"], sd


def _custom_sd(ws: Ws) -> Path:
    """A state_dict of conftest's TinyViT (what --model-class cases load)."""
    import importlib.util

    import torch

    src = ws.write("tiny_src.py", CUSTOM_VIT_SOURCE)
    spec = importlib.util.spec_from_file_location("tiny_src_rel", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    p = ws.root / "tiny_sd.pt"
    torch.save(mod.TinyViT().state_dict(), p)
    return p


def _model_class_case(body: str):
    def make(ws: Ws):
        sd = _custom_sd(ws)
        src = ws.write("user_model.py", body + CUSTOM_VIT_SOURCE)
        return ws.build(sd, "--model-class", f"{src}:TinyViT")
    return make


def _onnx_of(ws: Ws, name: str, module, shape=(1, 3, 32, 32), dynamic=True, output="logits") -> Path:
    import torch

    p = ws.root / name
    torch.onnx.export(module.eval(), (torch.zeros(*shape),), str(p), dynamo=False, input_names=["input"], output_names=[output],
                      dynamic_axes={"input": {0: "batch"}, output: {0: "batch"}} if dynamic else None, opset_version=17)
    return p


def _tokens_onnx(ws: Ws) -> Path:
    import timm
    import torch

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1, num_classes=0)

        def forward(self, x):
            return self.vit.forward_features(x)

    return _onnx_of(ws, "tokens.onnx", Tokens())


def _resnet_onnx(ws: Ws) -> Path:
    from torchvision.models import resnet18

    return _onnx_of(ws, "resnet.onnx", resnet18(num_classes=10))


def _fixed_batch_onnx(ws: Ws) -> Path:
    import timm

    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1, num_classes=10)
    return _onnx_of(ws, "fixed.onnx", m, dynamic=False)


def _fixed_batch_pt2(ws: Ws) -> Path:
    import timm
    import torch

    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1, num_classes=10).eval()
    p = ws.root / "fixed.pt2"
    torch.export.save(torch.export.export(m, (torch.zeros(1, 3, 32, 32),)), p)
    return p


def _whole_module(ws: Ws) -> Path:
    import torch
    from torch import nn

    p = ws.root / "whole.pt"
    torch.save(nn.Linear(2, 2), p)
    return p


def _resnet_sd(ws: Ws) -> Path:
    import torch
    from torchvision.models import resnet18

    p = ws.root / "resnet.pt"
    torch.save(resnet18(num_classes=10).state_dict(), p)
    return p


def _unreadable_images(ws: Ws) -> Path:
    d = ws.root / "broken"
    d.mkdir()
    for i in range(20):
        (d / f"{i}.png").write_bytes(b"not a png at all")
    return d


def _stray_image(ws: Ws) -> Path:
    import shutil

    d = ws.root / "val"
    shutil.copytree(VAL_DIR, d)
    first = next(p for p in sorted((d / "0").iterdir()))
    shutil.copy(first, d / "stray.png")
    return d


def _non_utf8(ws: Ws) -> Path:
    return Path(os.fsdecode(str(ws.root).encode() + b"/out-\xff"))


# id, make(ws) -> argv, exit code, fragments the one line must hold
CASES = [
    # --- the model file
    ("model-missing", lambda ws: ws.build(ws.root / "missing.pt"), 2, ["does not exist"]),
    ("model-empty-file", lambda ws: ws.build(ws.write("empty.pt", b"")), 2, ["empty"]),
    ("model-random-bytes", lambda ws: ws.build(ws.write("junk.pt", os.urandom(4096))), 2, ["corrupt"]),
    ("model-truncated-zip", lambda ws: ws.build(ws.write("cut.pt", ws.model.read_bytes()[:5000])), 2, ["corrupt"]),
    ("model-text-as-onnx", lambda ws: ws.build(ws.write("m.onnx", "hello")), 2, ["onnx"]),
    ("model-unknown-extension", lambda ws: ws.build(ws.write("m.h5", b"\x89HDF")), 2, [".h5"]),
    ("model-folder-not-hf", lambda ws: ws.build(ws.images("notamodel", 1)), 2, ["config.json"]),
    ("model-whole-pickle-untrusted", lambda ws: ws.build(_whole_module(ws)), 2, ["--trust-pickle"]),
    ("model-resnet-state-dict", lambda ws: ws.build(_resnet_sd(ws)), 2, ["vision transformer"]),
    ("model-resnet-onnx", lambda ws: ws.build(_resnet_onnx(ws)), 2, ["vision transformer"]),
    ("model-onnx-token-output", lambda ws: ws.build(_tokens_onnx(ws)), 2, ["(batch, classes)"]),
    ("model-onnx-fixed-batch", lambda ws: ws.build(_fixed_batch_onnx(ws)), 2, ["batch"]),
    ("model-pt2-fixed-batch", lambda ws: ws.build(_fixed_batch_pt2(ws)), 2, ["batch"]),
    ("weights-nan", lambda ws: ws.build(ws.state_dict("nan.pt", _poison(math.nan))), 2, ["blocks.0.attn.qkv.weight", "nan"]),
    ("weights-inf", lambda ws: ws.build(ws.state_dict("inf.pt", _poison(math.inf))), 2, ["blocks.0.attn.qkv.weight", "inf"]),
    ("meta-preprocess-garbage", lambda ws: ws.build(ws.state_dict("meta1.pt", _with_meta(preprocess="garbage"))), 2, ["preprocess"]),
    ("meta-model-kwargs-not-table", lambda ws: ws.build(ws.state_dict("meta2.pt", _with_meta(model_kwargs="x"))), 2, ["model_kwargs"]),
    ("meta-heads-not-number", lambda ws: ws.build(ws.state_dict("meta3.pt", _with_meta(model_kwargs={"num_heads": "three"}))), 2, ["num_heads"]),
    ("meta-preprocess-bad-std", lambda ws: ws.build(ws.state_dict("meta4.pt", _with_meta(
        preprocess={"mean": [0.5, 0.5, 0.5], "std": [0, 1, 1], "crop_pct": 1.0, "interpolation": "bicubic"}))), 2, ["std"]),
    # it said "std has 3 values but the model takes 7 channel(s)", counting the channels from the mean
    ("meta-preprocess-mean-std-lengths", lambda ws: ws.build(ws.state_dict("meta6.pt", _with_meta(
        preprocess={"mean": [0.5] * 7, "std": [1, 1, 1], "crop_pct": 1.0, "interpolation": "bicubic"}))), 2, ["mean has 7 values and std 3"]),
    # --- model flags
    ("heads-contradict-checkpoint", lambda ws: ws.build(ws.state_dict("meta5.pt", _with_meta(model_kwargs={"num_heads": 3})), "--num-heads", "2"), 2, ["--num-heads", "3"]),
    ("heads-not-dividing-width", lambda ws: ws.build(None, "--num-heads", "5"), 2, ["divisible"]),
    ("std-infinite", lambda ws: ws.build(None, "--std", "inf", "inf", "inf"), 2, ["--std", "finite"]),
    ("std-nan", lambda ws: ws.build(None, "--std", "nan", "1", "1"), 2, ["--std"]),
    ("std-zero", lambda ws: ws.build(None, "--std", "0", "1", "1"), 2, ["--std"]),
    ("mean-nan", lambda ws: ws.build(None, "--mean", "nan", "0", "0"), 2, ["--mean", "finite"]),
    ("mean-infinite", lambda ws: ws.build(None, "--mean", "0", "-inf", "0"), 2, ["--mean"]),
    ("crop-pct-out-of-range", lambda ws: ws.build(None, "--crop-pct", "1.5"), 2, ["--crop-pct"]),
    ("crop-pct-nan", lambda ws: ws.build(None, "--crop-pct", "nan"), 2, ["--crop-pct"]),
    ("input-size-not-patch-multiple", lambda ws: ws.build(None, "--input-size", "30", "32"), 2, ["multiple of the patch size"]),
    ("arch-unknown", lambda ws: ws.build(None, "--arch", "vit_nonexistent"), 2, ["--arch"]),
    ("arch-wrong-width", lambda ws: ws.build(None, "--arch", "vit_b_16"), 2, ["pick the matching --arch"]),
    ("model-kwargs-bad-json", lambda ws: ws.build(None, "--model-kwargs", "{bad"), 2, ["not valid JSON"]),
    ("model-kwargs-without-class", lambda ws: ws.build(None, "--model-kwargs", '{"dim": 8}'), 2, ["--model-class"]),
    ("model-class-file-missing", lambda ws: ws.build(None, "--model-class", str(ws.root / "nope.py:Net")), 2, ["does not exist"]),
    ("model-class-name-missing", lambda ws: ws.build(_custom_sd(ws), "--model-class", str(ws.write("m.py", CUSTOM_VIT_SOURCE)) + ":Nope"), 2, ["Nope"]),
    ("model-class-raises-at-import", _model_class_case("raise RuntimeError('no GPU here')\n"), 2, ["importing", "no GPU here"]),
    ("model-class-syntax-error", _model_class_case("def broken(:\n"), 2, ["importing"]),
    ("model-class-sys-exit-at-import", _model_class_case("import sys\nsys.exit(0)\n"), 2, ["sys.exit", "__main__"]),
    ("model-class-argparse-at-import", _model_class_case(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', required=True)\np.parse_args()\n"), 2, ["user_model.py", "exit"]),
    ("model-class-bad-kwargs", lambda ws: ws.build(_custom_sd(ws), "--model-class", str(ws.write("m.py", CUSTOM_VIT_SOURCE)) + ":TinyViT",
                                                   "--model-kwargs", '{"nope": 1}'), 2, ["--model-kwargs"]),
    # --- build settings and profiles
    ("target-unknown", lambda ws: ["build", ws.model, "-t", "raspberry", "--calib", CALIB_DIR, "-o", ws.out], 2, ["unknown target"]),
    ("target-twice", lambda ws: ["build", ws.model, "-t", "onnx", "-t", "onnx", "--calib", CALIB_DIR, "-o", ws.out], 2, ["twice"]),
    ("profile-file-missing", lambda ws: ["build", ws.model, "-t", ws.root / "no.toml", "--calib", CALIB_DIR, "-o", ws.out], 2, ["does not exist"]),
    ("profile-not-toml", lambda ws: ["build", ws.model, "-t", ws.profile("backend = [\n"), "--calib", CALIB_DIR, "-o", ws.out], 2, ["not valid TOML"]),
    ("profile-unknown-key", lambda ws: ["build", ws.model, "-t", ws.profile('backend = "onnxruntime"\nprecision = "int8"\nspeed = 1\n'),
                                        "--calib", CALIB_DIR, "-o", ws.out], 2, ["unknown key 'speed'"]),
    ("profile-threshold-nan", lambda ws: ["build", ws.model, "-t", ws.profile('backend = "onnxruntime"\nprecision = "int8"\n[thresholds]\nmin_agreement = nan\n'),
                                          "--calib", CALIB_DIR, "-o", ws.out], 2, ["my.toml", "thresholds", "min_agreement"]),
    ("profile-threshold-string", lambda ws: ["build", ws.model, "-t", ws.profile('backend = "onnxruntime"\nprecision = "int8"\n[thresholds]\nmin_speedup = "fast"\n'),
                                             "--calib", CALIB_DIR, "-o", ws.out], 2, ["min_speedup"]),
    ("profile-quant-mistake-named-as-profile", lambda ws: ["build", ws.model, "-t", ws.profile('backend = "onnxruntime"\nprecision = "int8"\n[quantization]\npercentile = 50.0\nmethod = "percentile"\n'),
                                                           "--calib", CALIB_DIR, "-o", ws.out], 2, ["my.toml", "quantization.percentile"]),
    ("openvino-device-gpu-on-cpu-machine", lambda ws: ["build", ws.model, "-t", ws.profile('backend = "openvino"\nprecision = "int8"\n[backend_options]\ndevice = "GPU"\n'),
                                                       "--calib", CALIB_DIR, "-o", ws.out, "-q", "--cache-dir", ws.cache], 2, ["GPU", "CPU"]),
    ("gate-nan-flag", lambda ws: ws.build(None, "--max-top1-drop", "nan"), 2, ["max_top1_drop"]),
    ("gate-infinite-speedup", lambda ws: ws.build(None, "--min-speedup", "inf"), 2, ["min_speedup"]),
    ("gate-agreement-above-one", lambda ws: ws.build(None, "--min-agreement", "1.5"), 2, ["min_agreement"]),
    ("percentile-out-of-range", lambda ws: ws.build(None, "--percentile", "50"), 2, ["--percentile"]),
    ("smoothquant-alpha-out-of-range", lambda ws: ws.build(None, "--smoothquant-alpha", "2"), 2, ["--smoothquant-alpha"]),
    ("smoothquant-contradiction", lambda ws: ws.build(None, "--no-smoothquant", "--smoothquant-alpha", "0.5"), 2, ["contradict"]),
    ("unknown-flag", lambda ws: ws.build(None, "--fast"), 2, ["--fast"]),
    # --- where the output goes
    ("output-under-a-file", lambda ws: ["build", ws.model, "-t", "onnx", "--calib", CALIB_DIR, "-o", ws.write("afile", "x") / "b", "-q"], 2, ["afile", "-o"]),
    ("cache-dir-is-a-file", lambda ws: ["build", ws.model, "-t", "onnx", "--calib", CALIB_DIR, "-o", ws.out, "-q",
                                        "--cache-dir", ws.write("cache.bin", "x")], 2, ["--cache-dir", "cache.bin cannot be created"]),
    ("output-path-not-utf8", lambda ws: ["build", ws.model, "-t", "onnx", "--calib", CALIB_DIR, "-o", _non_utf8(ws), "-q"], 2, ["UTF-8"]),
    ("model-path-not-utf8", lambda ws: ws.build(Path(os.fsdecode(str(ws.root).encode() + b"/m-\xff.pt"))), 2, ["UTF-8"]),
    # --- calibration data
    ("calib-missing", lambda ws: ws.build(None, calib=ws.root / "nothing"), 2, ["does not exist"]),
    # found before the model is read and exported (a corrupt model would be the error otherwise)
    ("calib-missing-before-the-model", lambda ws: ws.build(ws.write("broken.pt", "no checkpoint"), calib=ws.root / "nothing"), 2,
     ["nothing does not exist"]),
    ("val-missing-before-the-model", lambda ws: ws.build(ws.write("broken.pt", "no checkpoint"), "--val", ws.root / "noval"), 2,
     ["noval does not exist"]),
    ("calib-empty-folder", lambda ws: ws.build(None, calib=ws.images("empty", 0)), 2, ["empty"]),
    ("calib-too-few", lambda ws: ws.build(None, calib=ws.images("few", 3)), 2, ["3"]),
    ("calib-all-unreadable", lambda ws: ws.build(None, calib=_unreadable_images(ws)), 2, ["corrupt"]),
    ("calib-npy-wrong-shape", lambda ws: ws.build(None, calib=_npy(ws, "bad.npy", (20, 5, 32, 32))), 2, ["shape"]),
    ("calib-npy-nan", lambda ws: ws.build(None, calib=_npy(ws, "nan.npy", (20, 3, 32, 32), fill=math.nan)), 2, ["non-finite"]),
    ("calib-wrong-extension", lambda ws: ws.build(None, calib=ws.write("calib.txt", "1 2 3")), 2, ["calib.txt"]),
    ("val-stray-image-beside-class-folders", lambda ws: ws.build(None, "--val", _stray_image(ws)), 2, ["stray.png", "class folder"]),
    ("val-class-index-out-of-range", lambda ws: ws.build(None, "--val", ws.images("val/12", 2).parent), 2, ["class"]),
]


@pytest.mark.parametrize("make, code, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_in_one_line_and_leaves_nothing(make, code, fragments, timm_vit, tmp_path):
    ws = Ws(tmp_path, timm_vit[1])
    args = make(ws)
    run = cli(*args, cwd=tmp_path)
    assert_one_line(run, code, *fragments)
    assert not ws.out.exists() and not (tmp_path / "timm_vit-onnx").exists()
    assert debris(tmp_path) == []
    assert not ws.cache.exists() or not any(ws.cache.rglob("*.partial"))
