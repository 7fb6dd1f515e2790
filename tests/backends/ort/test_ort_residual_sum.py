"""The onnx target writes a post-norm block's residual Add as Sum (vitedge/backends/onnxruntime/residual_sum.py):
ONNX Runtime then forms no SkipLayerNormalization (measured slower than Add + LayerNormalization on ViT token shapes),
and the outputs are the same. A hand-made graph for the rule, and a small post-norm, sequence-first
nn.TransformerEncoder ViT quantized and rewritten as the build does."""

from __future__ import annotations

import collections
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitedge.backends.onnxruntime.residual_sum import unfuse_skip_norm
from vitedge.onnxkit.session import SessionSettings, ort_session


def _graph():
    """post: x + s read only by a LayerNormalization (ORT fuses it); pre: a residual sum also read by the next Add
    (no fusion); bias: an Add of a constant before a LayerNormalization (no residual)."""
    d = 16
    inits = [numpy_helper.from_array(np.linspace(0.5, 1.5, d, dtype=np.float32), "g"),
             numpy_helper.from_array(np.linspace(-0.1, 0.1, d, dtype=np.float32), "b"),
             numpy_helper.from_array(np.linspace(-1, 1, d, dtype=np.float32), "c")]
    nodes = [
        helper.make_node("Add", ["x", "s"], ["post"], name="/post/Add"),
        helper.make_node("LayerNormalization", ["post", "g", "b"], ["post_n"], name="/post/norm", axis=-1, epsilon=1e-5),
        helper.make_node("Add", ["post_n", "x"], ["pre"], name="/pre/Add"),
        helper.make_node("LayerNormalization", ["pre", "g", "b"], ["pre_n"], name="/pre/norm", axis=-1, epsilon=1e-5),
        helper.make_node("Add", ["pre_n", "pre"], ["pre2"], name="/pre/Add2"),
        helper.make_node("Add", ["pre2", "c"], ["biased"], name="/bias/Add"),
        helper.make_node("LayerNormalization", ["biased", "g", "b"], ["y"], name="/bias/norm", axis=-1, epsilon=1e-5),
    ]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 5, d]) for n in ("x", "s")]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5, d])
    return helper.make_model(helper.make_graph(nodes, "g", ins, [out], inits), opset_imports=[helper.make_opsetid("", 17)])


def _optimized_ops(model: onnx.ModelProto) -> collections.Counter:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "opt.onnx"
        ort_session(model.SerializeToString(), SessionSettings(threads=1, optimization="all", optimized_model_path=out))
        return collections.Counter(n.op_type for n in onnx.load(str(out)).graph.node)


def _outputs(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort_session(model.SerializeToString(), SessionSettings(threads=1)).run(None, feed)


def test_only_the_residual_add_a_layer_norm_alone_reads_becomes_sum():
    model = _graph()
    assert _optimized_ops(model)["SkipLayerNormalization"] == 1  # what ONNX Runtime does with the graph as it is
    rewritten = _graph()
    assert unfuse_skip_norm(rewritten) == 1
    kinds = {n.name: n.op_type for n in rewritten.graph.node}
    assert kinds["/post/Add"] == "Sum" and kinds["/pre/Add"] == "Add" and kinds["/bias/Add"] == "Add"
    assert _optimized_ops(rewritten)["SkipLayerNormalization"] == 0
    rng = np.random.default_rng(0)
    feed = {k: rng.standard_normal((3, 5, 16)).astype(np.float32) for k in ("x", "s")}
    np.testing.assert_allclose(_outputs(model, feed)[0], _outputs(rewritten, feed)[0], rtol=1e-5, atol=1e-5)  # SkipLN rounds alike
    assert unfuse_skip_norm(rewritten) == 0  # nothing left to rewrite


def _post_norm_vit():
    import torch
    from torch import nn

    class PostNormViT(nn.Module):
        """Patch embedding, class token, a post-norm sequence-first nn.TransformerEncoder, a Linear head."""

        def __init__(self, dim=32, depth=2, heads=2, image=32, patch=8, channels=1):
            super().__init__()
            self.pretrained_cfg = {"input_size": (channels, image, image), "mean": (0.5,) * channels, "std": (0.5,) * channels,
                                   "crop_pct": 1.0, "interpolation": "bilinear", "num_classes": 10}
            self.embed = nn.Conv2d(channels, dim, patch, patch)
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
            layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, activation="relu", norm_first=False)
            self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
            for p in self.encoder.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
            self.out = nn.Linear(dim, 10)

        def forward(self, x):
            x = self.embed(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
            return self.out(self.encoder(x.transpose(0, 1))[0])

    torch.manual_seed(0)
    return PostNormViT().eval()


def test_a_post_norm_encoders_int8_graph_runs_no_skip_layer_norm(tmp_path):
    """Two residual Adds per post-norm block become Sum in the onnx artifact; ONNX Runtime's graph of it holds no
    SkipLayerNormalization; its outputs are the Q/DQ graph's."""
    import torch
    from conftest import CALIB_DIR

    if not CALIB_DIR.is_dir():
        pytest.skip("calibration/digits is not in this checkout")
    from vitedge.backends.onnxruntime.backend import _fuse_file
    from vitedge.datasources.sources import open_source
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    ckpt = tmp_path / "postnorm.pt"
    torch.jit.save(torch.jit.trace(_post_norm_vit(), torch.randn(2, 1, 32, 32), check_trace=False), str(ckpt))
    loaded = load_model(ckpt, IntakeOptions(mean=(0.5,), std=(0.5,)))
    fp32 = tmp_path / "model.fp32.onnx"
    export_onnx(loaded, fp32)
    source = open_source(CALIB_DIR, loaded.spec.preprocess, limit=16, seed=0, class_names=None)
    qdq = build_qdq(calibrate(fp32, source, QuantConfig(method="minmax"), cache_dir=tmp_path / "cache")).save(tmp_path / "model.qdq.onnx")
    artifact = tmp_path / "model.int8.onnx"
    _fuse_file(qdq, artifact)
    graph = onnx.load(str(artifact))
    sums = [n for n in graph.graph.node if n.op_type == "Sum"]
    assert len(sums) == 4  # 2 blocks x (attention, MLP)
    assert _optimized_ops(graph)["SkipLayerNormalization"] == 0
    for n in sums:  # the same artifact with its residual Adds: ONNX Runtime fuses them
        n.op_type = "Add"
    assert _optimized_ops(graph)["SkipLayerNormalization"] == 4
    x = np.random.default_rng(1).standard_normal((3, 1, 32, 32)).astype(np.float32)
    ref, out = (_run(p, x) for p in (qdq, artifact))
    assert float(np.max(np.abs(ref - out))) <= 1e-3 * float(np.max(np.abs(ref))) + 1e-6


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort_session(str(path), SessionSettings(threads=1))
    return session.run(None, {session.get_inputs()[0].name: x})[0]
