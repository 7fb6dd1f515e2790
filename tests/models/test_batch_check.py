"""A model whose output for one image depends on the other images in its batch is refused (vitedge/models/batch_check.py).

The layout seen in published checkpoints, written here as our own small ViTs: batch-first tokens (B, T, D) fed to an
``nn.MultiheadAttention`` or an ``nn.TransformerEncoder`` left at ``batch_first=False``, so attention runs across the
images of a batch. Read out by mean-pooling the tokens, each image's logits depend on its batch; read out through the
class token, they depend on nothing (the class token attends only to the same class token of every image). Both are
refused through the CLI in one line, exit 2, before calibration and with no bundle (an ``nn.TransformerEncoder`` so fed
exports a graph that cannot run another batch size at all: refused too); the same models with ``batch_first=True``
build. Self-contained: the model file is written into the test's folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import vitedge_in_process
from helpers.profiles import untimed_onnx_profile

REPO = Path(__file__).resolve().parents[2]
CALIB = REPO / "calibration" / "digits" / "calib"

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, dim, heads, batch_first):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=batch_first)
            self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

        def forward(self, x):  # x is (B, T, D) whatever batch_first says; query, key and value normed apart, as published
            x = x + self.attn(self.norm1(x), self.norm1(x), self.norm1(x))[0]
            return x + self.mlp(self.norm2(x))


    class TinyViT(nn.Module):
        """readout "mean": the tokens' mean; "cls": the class token. encoder: nn.TransformerEncoder instead of Blocks."""

        def __init__(self, batch_first=False, readout="mean", encoder=False, dim=32, heads=2, depth=2, image=32, patch=8,
                     classes=10, batchnorm=False):
            super().__init__()
            self.readout = readout
            self.patch = nn.Conv2d(3, dim, patch, patch)
            self.bn = nn.BatchNorm2d(dim) if batchnorm else nn.Identity()
            self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
            self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.5)
            if encoder:
                layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=batch_first, norm_first=True)
                self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
            else:
                self.blocks = nn.Sequential(*[Block(dim, heads, batch_first) for _ in range(depth)])
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, classes)
            nn.init.normal_(self.head.weight, std=0.5)

        def forward(self, x):
            x = self.bn(self.patch(x)).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
            x = self.norm(self.blocks(x))
            return self.head(x.mean(dim=1) if self.readout == "mean" else x[:, 0])
''')

CAUSE = "batch_first=False"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("batch-models") / "tiny_vit.py"
    path.write_text(MODELS, encoding="utf-8")
    return path


def _module(model_file: Path, **kwargs):
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("batch_check_tiny_vit", model_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    return mod.TinyViT(**kwargs).eval()


def _checkpoint(tmp_path: Path, model_file: Path, **kwargs) -> Path:
    import torch

    path = tmp_path / "model.pt"
    torch.save(_module(model_file, **kwargs).state_dict(), path)
    return path


def _build(tmp_path: Path, model_file: Path, kwargs: dict, *extra):
    import json

    ckpt = _checkpoint(tmp_path, model_file, **kwargs)
    return vitedge_in_process(
        "build", ckpt, "--model-class", f"{model_file}:TinyViT", "--model-kwargs", json.dumps(kwargs), "--input-size", "32", "32",
        "--mean", "0.5", "--std", "0.5", "--crop-pct", "1.0", "-t", untimed_onnx_profile(tmp_path), "--calib", CALIB,
        "--calib-size", "16", "--no-latency", "--no-fallback", "-o", tmp_path / "out", "--cache-dir", tmp_path / "cache", *extra)


def _one_line(run, *fragments: str) -> str:
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("vitedge: "), run.stderr[-2000:]
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def test_attention_across_the_batch_is_refused_in_one_line(tmp_path, model_file):
    run = _build(tmp_path, model_file, {"batch_first": False}, "-q")
    line = _one_line(run, "depends on the other images in its batch", "4 calibration images", "when other images share its batch",
                     "top-1 differs on", CAUSE, "batch_first=True")
    assert "image " in line and "change by" in line
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "cache").exists() or not any(p.is_file() for p in (tmp_path / "cache").rglob("*"))  # before calibration


def test_transformer_encoder_across_the_batch_is_refused_in_one_line(tmp_path, model_file):
    """nn.TransformerEncoder(Layer) at batch_first=False fed batch-first: its exported graph keeps the traced batch (2) as
    the sequence length in a Reshape, so it cannot even run another batch size; refused, naming the node and the cause."""
    run = _build(tmp_path, model_file, {"batch_first": False, "encoder": True}, "-q")
    _one_line(run, "the FP32 graph cannot run a batch of 4", "Reshape node", "answers only at that batch size", CAUSE)
    assert not (tmp_path / "out").exists()


def test_class_token_readout_of_that_layout_is_refused_as_input_independent(tmp_path, model_file):
    run = _build(tmp_path, model_file, {"batch_first": False, "readout": "cls"}, "-q")
    _one_line(run, "gives the same logits for 4 different calibration images", "does not depend on the image", CAUSE)
    assert not (tmp_path / "out").exists()


def test_the_same_model_with_batch_first_builds(tmp_path, model_file):
    run = _build(tmp_path, model_file, {"batch_first": True})
    assert run.returncode in (0, 1), run.stderr[-2000:]  # a random-weight model: its gate may fail, its build does not
    assert "batch check: 4 calibration images give the same outputs alone as in one batch" in run.stdout + run.stderr
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_export_refuses_it_and_leaves_no_file(tmp_path, model_file):
    ckpt = _checkpoint(tmp_path, model_file, batch_first=False)
    out = tmp_path / "model.onnx"
    run = vitedge_in_process("export", ckpt, "--model-class", f"{model_file}:TinyViT", "--model-kwargs", '{"batch_first": false}',
                             "--input-size", "32", "32", "-o", out)
    _one_line(run, "depends on the other images in its batch", "seeded random inputs", CAUSE)
    assert not out.exists()


def test_measured_change_batchnorm_in_eval_passes_and_the_fault_is_far_off(tmp_path, model_file):
    """BatchNorm in eval mode uses its running statistics: not batch-dependent. The fault is far beyond the limit."""
    import torch

    from vitedge.core.errors import ModelLoadError
    from vitedge.models.batch_check import REL_TOL, check_batch_independence, measure_batch_independence
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    def graph(name: str, **kwargs):
        ckpt = tmp_path / f"{name}.pt"
        module = _module(model_file, **kwargs)
        if kwargs.get("batchnorm"):
            with torch.no_grad():
                module.bn.running_mean.uniform_(-0.5, 0.5)
                module.bn.running_var.uniform_(0.5, 2.0)
        torch.save(module.state_dict(), ckpt)
        loaded = load_model(ckpt, IntakeOptions(model_class=f"{model_file}:TinyViT", model_kwargs=kwargs, input_size=(32, 32)))
        export_onnx(loaded, tmp_path / f"{name}.onnx")
        return tmp_path / f"{name}.onnx", loaded.spec

    path, spec = graph("bn", batch_first=True, batchnorm=True)
    ok = check_batch_independence(path, spec)
    assert ok.inputs == "seeded random inputs" and ok.images == 4 and ok.change <= REL_TOL and ok.spread > 1e-3
    # a graph that takes uint8 frames (preprocessing baked in) is fed frames: the same verdict
    baked = check_batch_independence(_baked(path, spec, tmp_path / "bn.baked.onnx"), spec)
    assert baked.change <= REL_TOL and baked.spread > 1e-3
    path, spec = graph("mixed", batch_first=False)
    bad = measure_batch_independence(path, spec, np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32))
    assert bad.inputs == "calibration images" and bad.change > 100 * REL_TOL
    with pytest.raises(ModelLoadError, match="depends on the other images in its batch"):
        check_batch_independence(path, spec)
    with pytest.raises(ModelLoadError, match="depends on the other images in its batch"):
        check_batch_independence(_baked(path, spec, tmp_path / "mixed.baked.onnx"), spec)


def _baked(path: Path, spec, out: Path) -> Path:
    from vitedge.models.export import bake_file

    bake_file(path, out, spec.preprocess)
    return out


def test_non_finite_outputs_are_not_judged_and_say_so(tmp_path):
    """A graph whose outputs are NaN is left to the calibration, which names the activation; the line says it was not judged."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from vitedge.bundle.spec import ModelSpec, Preprocess
    from vitedge.models.batch_check import check_batch_independence

    nodes = [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("Mul", ["flat", "nan"], ["logits"])]
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 4, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 16])],
                              [numpy_helper.from_array(np.array([np.nan], np.float32), "nan")])
    path = tmp_path / "nan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    spec = ModelSpec(family="onnx", image_size=(4, 4), patch_size=None, embed_dim=None, depth=None, num_heads=None, num_classes=16,
                     num_prefix_tokens=None, num_params=None, preprocess=Preprocess(crop_size=(4, 4), mean=(0.5,), std=(0.5,), channels=1))
    check = check_batch_independence(path, spec)
    assert not check.finite and "not judged" in check.one_line() and "not all finite" in check.one_line()
