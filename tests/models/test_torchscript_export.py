"""TorchScript files that the TorchScript-based ONNX exporter cannot take, and traced ViTs whose input size
only their weights say (issue 30 item 3). Small models built here; no corpus needed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from vitedge.core.errors import ExportError, ModelLoadError
from vitedge.models import export as export_module
from vitedge.models.export import export_onnx
from vitedge.models.intake import IntakeOptions, load_model
from vitedge.onnxkit.session import ort_session


def _traced(module: nn.Module, x: torch.Tensor, path) -> None:
    """Saved as users save: torch.jit.trace of the eval-mode module (with the attention fast path off: under
    it a trace records fused kernels that no ONNX exporter takes, another matter)."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        torch.jit.trace(module.eval(), x, check_trace=False).save(str(path))
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def _onnx_matches(out, module: nn.Module, shape: tuple[int, ...]) -> None:
    sess = ort_session(out)
    for batch in (1, 5):  # the batch stays dynamic
        x = torch.randn(batch, *shape)
        with torch.no_grad():
            ref = module(x).numpy()
        np.testing.assert_allclose(sess.run(None, {"input": x.numpy()})[0], ref, atol=1e-4, rtol=1e-4)


def test_traced_torchvision_vit_with_one_channel_exports(tmp_path):
    """torchvision's attention computes unflatten(-1, (3, E)) with E read from size(-1); in a TorchScript
    file nothing says that tensor's rank, and the TorchScript-based exporter stopped at "ONNX export of
    transpose for tensor of unknown rank"."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    m = VisionTransformer(image_size=28, patch_size=7, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=10)
    m.conv_proj = nn.Conv2d(1, 32, kernel_size=7, stride=7)
    nn.init.normal_(m.heads.head.weight, std=0.5)  # torchvision zero-initialises the head
    m.eval()
    path = tmp_path / "tv_traced.pt"
    _traced(m, torch.randn(2, 1, 28, 28), path)
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # as vitedge exports: the fused kernel has no ONNX form
    try:
        with pytest.raises(Exception, match="unknown rank"):  # the cause, as torch's exporter reports it
            torch.onnx.export(torch.jit.load(str(path)), (torch.randn(2, 1, 28, 28),), str(tmp_path / "direct.onnx"),
                              opset_version=17, dynamo=False, dynamic_axes={"input": {0: "batch"}}, input_names=["input"])
    finally:
        torch.backends.mha.set_fastpath_enabled(before)
    loaded = load_model(path)
    assert loaded.spec.family == "torchscript" and loaded.spec.image_size == (28, 28)
    assert loaded.spec.preprocess.channels == 1
    out = tmp_path / "tv.onnx"
    result = export_onnx(loaded, out)
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance
    _onnx_matches(out, m, (1, 28, 28))


class _LinearPatchViT(nn.Module):
    """Patches flattened and projected by a Linear (no convolution), a class token and a position table
    (``position=False``: positions from a second Linear of the patch pixels, as a corpus model does)."""

    def __init__(self, channels: int = 1, size: int = 28, patch: int = 4, dim: int = 32, classes: int = 10,
                 position: bool = True) -> None:
        super().__init__()
        self.patch = patch
        self.to_patch = nn.Linear(channels * patch * patch, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        if position:
            self.pos_embedding = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim))
        else:
            self.pos_from_pixels = nn.Linear(channels * patch * patch, dim)
        self.block = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p = self.patch
        rows = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, (h // p) * (w // p), p * p * c)
        tokens = self.to_patch(rows)
        if hasattr(self, "pos_from_pixels"):
            tokens = tokens + self.pos_from_pixels(rows)
        t = torch.cat([self.cls_token.expand(b, -1, -1), tokens], dim=1)
        if hasattr(self, "pos_embedding"):
            t = t + self.pos_embedding
        return self.head(self.block(t)[:, 0])


@pytest.mark.parametrize("channels,size,patch", [(1, 28, 4), (3, 32, 8)])
def test_traced_linear_patch_vit_size_comes_from_its_weights(tmp_path, channels, size, patch):
    torch.manual_seed(0)
    m = _LinearPatchViT(channels, size, patch).eval()
    path = tmp_path / "linear_patch.pt"
    _traced(m, torch.randn(2, channels, size, size), path)
    loaded = load_model(path)
    assert loaded.spec.image_size == (size, size)
    assert loaded.spec.preprocess.channels == channels
    assert loaded.spec.sources["image_size"].startswith("file")
    out = tmp_path / "linear_patch.onnx"
    export_onnx(loaded, out)
    _onnx_matches(out, m, (channels, size, size))


class _TwoDPositionViT(nn.Module):
    """A convolutional patch embedding and a position table kept without its batch axis, ``(tokens, width)``: as a
    parameter (Tiny ImageNet ViTs of the public corpus) or as an ``nn.Embedding``'s weight (a corpus DeiT)."""

    def __init__(self, size: int = 64, patch: int = 8, dim: int = 48, embedding: bool = False) -> None:
        super().__init__()
        self.patch_embeddings = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        tokens = (size // patch) ** 2 + 1
        if embedding:
            self.pos_emb = nn.Embedding(tokens, dim)
        else:
            self.position_embeddings = nn.Parameter(torch.randn(tokens, dim))
        self.block = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch_embeddings(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), t], dim=1)
        t = t + (self.pos_emb.weight if hasattr(self, "pos_emb") else self.position_embeddings)
        return self.head(self.block(t)[:, 0])


@pytest.mark.parametrize("embedding", [False, True])
def test_traced_vit_with_a_two_d_position_table_reads_its_size(tmp_path, embedding):
    """The 64x64 Tiny ImageNet corpus models keep their positions as (65, width): the size comes from that table and
    the patch kernel, as from a (1, 65, width) one; a 2-D weight named for positions whose width no patch embedding
    makes is not read as one."""
    torch.manual_seed(0)
    m = _TwoDPositionViT(embedding=embedding).eval()
    path = tmp_path / "two_d_pos.pt"
    _traced(m, torch.randn(2, 3, 64, 64), path)
    loaded = load_model(path)
    assert loaded.spec.image_size == (64, 64) and loaded.spec.sources["image_size"].startswith("file")
    out = tmp_path / "two_d_pos.onnx"
    export_onnx(loaded, out)
    _onnx_matches(out, m, (3, 64, 64))
    from vitedge.models.channels import input_size_from_weights
    sd = dict(m.state_dict())
    sd.pop("pos_emb.weight" if embedding else "position_embeddings")
    assert input_size_from_weights(dict(sd, pos_scale=torch.randn(65, 17))) is None  # width 17: no patch embedding's
    assert input_size_from_weights(dict(sd, relative_position_bias_table=torch.randn(65, 48))) is None


def test_traced_vit_whose_weights_cannot_say_names_input_size(tmp_path):
    torch.manual_seed(0)
    m = _LinearPatchViT(position=False).eval()  # no position table: nothing in the weights fixes the size
    path = tmp_path / "no_pos.pt"
    _traced(m, torch.randn(2, 1, 28, 28), path)
    with pytest.raises(ModelLoadError, match=r"pass --input-size H W") as err:
        load_model(path)
    assert "\n" not in str(err.value)
    loaded = load_model(path, IntakeOptions(input_size=(28, 28)))
    assert loaded.spec.image_size == (28, 28) and loaded.spec.preprocess.channels == 1


HAND_WRITTEN_VIT = '''
import torch
from torch import nn


class HandWrittenViT(nn.Module):
    """Attention by hand (no num_heads attribute), positions from a Linear of the pixels (no table)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(49, 16)
        self.pos = nn.Linear(49, 16)
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16)
        self.v = nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)
        self.pretrained_cfg = {"input_size": (1, 28, 28), "mean": (0.5,), "std": (0.5,)}

    def forward(self, x):
        b = x.shape[0]
        rows = x.reshape(b, 1, 4, 7, 4, 7).permute(0, 2, 4, 1, 3, 5).reshape(b, 16, 49)
        t = self.embed(rows) + self.pos(rows)
        w = torch.softmax(self.q(t) @ self.k(t).transpose(-1, -2) * 0.25, dim=-1)
        return self.head((w @ self.v(t))[:, 0])


class NotAViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.pretrained_cfg = {"input_size": (1, 28, 28)}

    def forward(self, x):
        return self.fc(x.flatten(1))
'''


def test_hand_written_vit_without_heads_or_position_table_is_taken_and_a_mlp_is_not(tmp_path):
    """Attention shows when the class runs: a class with no num_heads and no position table is a ViT if its
    forward pass computes a softmax over a matmul; a plain MLP is still refused."""
    src = tmp_path / "hand_vit.py"
    src.write_text(HAND_WRITTEN_VIT)
    import importlib.util

    spec = importlib.util.spec_from_file_location("hand_vit_for_tests", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("HandWrittenViT", "NotAViT"):
        torch.save(getattr(mod, name)().state_dict(), tmp_path / f"{name}.pt")
    loaded = load_model(tmp_path / "HandWrittenViT.pt", IntakeOptions(model_class=f"{src}:HandWrittenViT"))
    assert loaded.spec.image_size == (28, 28) and loaded.spec.num_classes == 10
    with pytest.raises(ModelLoadError, match="not a Vision Transformer"):
        load_model(tmp_path / "NotAViT.pt", IntakeOptions(model_class=f"{src}:NotAViT"))


class _ChunkedQkvViT(nn.Module):
    """q, k, v from one projection, split by a generator over chunk(): scripted, a loop of run-time length."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 16, 8, 8)
        self.pos_embed = nn.Parameter(torch.randn(1, 16, 16))
        self.qkv = nn.Linear(16, 48)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2) + self.pos_embed
        q, k, v = [c.reshape(c.shape[0], c.shape[1], 2, 8).transpose(1, 2) for c in self.qkv(t).chunk(3, dim=-1)]
        w = torch.softmax(torch.matmul(q, k.transpose(-1, -2)), dim=-1)
        return self.head(torch.matmul(w, v).transpose(1, 2).reshape(t.shape[0], t.shape[1], 16).mean(1))


class _SeqFirstMhaViT(nn.Module):
    """nn.MultiheadAttention on (tokens, batch, dim), as a corpus model uses it: scripted, its forward holds
    the fast-path checks (aten::is_autocast_enabled under an if) that the TorchScript exporter refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 16, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 16))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, 16))
        self.norm = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 4)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), t], dim=1) + self.pos_embed
        s = self.norm(t).transpose(0, 1)
        t = t + self.attn(s, s, s, need_weights=False)[0].transpose(0, 1)
        return self.head(t[:, 0])


@pytest.mark.parametrize("cls", [_ChunkedQkvViT, _SeqFirstMhaViT])
def test_scripted_vit_exports_with_a_dynamic_batch_and_nothing_on_stdout(tmp_path, capfd, cls):
    """Neither the TorchScript exporter ("transpose for tensor of unknown rank", "is_autocast_enabled") nor
    torch's TorchScript-to-torch.export converter takes these; the program recorded from the aten ops the
    module runs at batch 2 and 3 does (vitedge/models/torchscript.py)."""
    torch.manual_seed(0)
    m = cls().eval()
    path = tmp_path / "scripted.pt"
    torch.jit.script(m).save(str(path))
    loaded = load_model(path)
    assert loaded.spec.image_size == (32, 32)
    capfd.readouterr()
    out = tmp_path / "scripted.onnx"
    result = export_onnx(loaded, out)
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance
    assert capfd.readouterr().out == ""
    _onnx_matches(out, m, (3, 32, 32))


def test_recorded_program_refuses_a_module_whose_constants_follow_the_batch():
    """A value that depends on the batch other than in proportion cannot become a dynamic batch."""
    from vitedge.models.torchscript import NotBatchGeneric, dynamic_batch_program

    class Odd(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1)[:, : x.shape[0] * x.shape[0]]  # batch squared

    with pytest.raises(NotBatchGeneric, match="not in proportion"):
        dynamic_batch_program(torch.jit.script(Odd()), (3, 4, 4))


class _MhaViT(nn.Module):
    """A conv-stem ViT on nn.MultiheadAttention: ``batch_first`` or on (tokens, batch, dim) as a corpus model
    uses it, or ``encoder``: a post-norm nn.TransformerEncoder (batch first; ``encoder_pre``: pre-norm, GELU)."""

    def __init__(self, layout: str) -> None:
        super().__init__()
        self.layout = layout
        self.patch = nn.Conv2d(3, 16, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 16))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, 16))
        self.norm = nn.LayerNorm(16)
        if layout.startswith("encoder"):
            pre = layout == "encoder_pre"
            layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=pre,
                                               activation="gelu" if pre else "relu")
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        else:
            self.attn = nn.MultiheadAttention(16, 4, batch_first=layout == "batch_first")
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), t], dim=1) + self.pos_embed
        if self.layout.startswith("encoder"):
            return self.head(self.norm(self.encoder(t))[:, 0])
        s = self.norm(t) if self.layout == "batch_first" else self.norm(t).transpose(0, 1)
        a = self.attn(s, s, s, need_weights=False)[0]
        return self.head((t + (a if self.layout == "batch_first" else a.transpose(0, 1)))[:, 0])


@pytest.mark.parametrize("layout", ["seq_first", "batch_first", "encoder"])
def test_traced_multihead_attention_vit_exports_with_a_dynamic_batch(tmp_path, capfd, layout):
    """A traced nn.MultiheadAttention: the TorchScript exporter stops at "unknown rank", the converter at a
    data-dependent guard (the trace keeps batch * heads as a tensor), and the aten ops the module runs include
    the fused CPU attention kernel and aten._convolution (no ONNX function for either); recorded with those
    decomposed into plain ops (models/torchscript.py), it exports with a dynamic batch and matches the module."""
    torch.manual_seed(0)
    m = _MhaViT(layout).eval()
    path = tmp_path / "traced.pt"
    _traced(m, torch.randn(2, 3, 32, 32), path)
    loaded = load_model(path)
    assert loaded.spec.image_size == (32, 32)
    capfd.readouterr()
    out = tmp_path / "traced.onnx"
    result = export_onnx(loaded, out)
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance
    assert capfd.readouterr().out == ""  # torch's C++ graph dump ("Torch IR graph at exception") is silenced
    _onnx_matches(out, m, (3, 32, 32))


@pytest.mark.parametrize("layout", ["batch_first", "encoder", "encoder_pre"])
def test_multihead_attention_traced_on_its_fast_path_exports(tmp_path, monkeypatch, layout):
    """Traced under no_grad, a batch-first nn.MultiheadAttention or nn.TransformerEncoderLayer takes its fast
    path and the trace records the fused op (aten::_native_multi_head_attention,
    aten::_transformer_encoder_layer_fwd): no ONNX function and no decomposition in torch; recorded with
    vitedge's plain-op forms of them (models/fused_ops.py), the file exports and matches the module, without a
    try of torch's TorchScript converter first (its program would keep the fused op and fail)."""
    tried = []

    def converter(*args):
        tried.append(args)
        return real_converter(*args)

    real_converter = export_module._ts2ep_program
    monkeypatch.setattr(export_module, "_ts2ep_program", converter)
    torch.manual_seed(0)
    m = _MhaViT(layout).eval()
    path = tmp_path / "traced.pt"
    with torch.no_grad():
        traced = torch.jit.trace(m, torch.randn(2, 3, 32, 32), check_trace=False)
    fused = [n.kind() for n in traced.inlined_graph.nodes() if n.kind().startswith(("aten::_native", "aten::_transformer"))]
    assert fused  # the fast path was taken: the fused op is in the file
    traced.save(str(path))
    out = tmp_path / "traced.onnx"
    result = export_onnx(load_model(path), out)
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance
    _onnx_matches(out, m, (3, 32, 32))
    assert tried == []


def test_torchscript_file_no_path_takes_fails_in_one_line_with_nothing_on_stdout(tmp_path, capfd):
    """A traced module whose batch dependence no dynamic batch expresses (it keeps batch-squared values):
    every path refuses it, in one line naming what to do instead."""

    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, 16, 8, 8)
            self.pos_embed = nn.Parameter(torch.randn(1, 16, 16))
            self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
            self.head = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = self.patch(x).flatten(2).transpose(1, 2) + self.pos_embed
            t = self.attn(t, t, t, need_weights=False)[0]
            return self.head(t.flatten(1)[:, : x.shape[0] * x.shape[0] * 4].reshape(x.shape[0], -1, 4).mean(1))

    torch.manual_seed(0)
    path = tmp_path / "traced.pt"
    _traced(Odd().eval(), torch.randn(2, 3, 32, 32), path)
    loaded = load_model(path)
    capfd.readouterr()
    with pytest.raises(ExportError, match="save the model with torch.export.save, or pass its state_dict with --model-class") as err:
        export_onnx(loaded, tmp_path / "traced.onnx")
    assert "\n" not in str(err.value) and "[Caused by" not in str(err.value)
    assert capfd.readouterr().out == ""  # torch's C++ graph dump ("Torch IR graph at exception") is silenced
    assert not (tmp_path / "traced.onnx").exists()
