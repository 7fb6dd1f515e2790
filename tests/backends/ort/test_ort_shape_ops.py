"""The onnx target's two shape-op rewrites (vitedge/backends/onnxruntime/shape_constants.py, transpose_pairs.py):
the shape arithmetic of a dynamic-batch export becomes constants, and Transposes that undo each other around a GEMM
go. Outputs stay those of the graph as it was, at every batch size, on real exports (a timm ViT, a torchvision ViT,
a sequence-first nn.MultiheadAttention ViT) and on the INT8 artifact ``_fuse_file`` writes; hand-made graphs pin
what is left alone."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitedge.backends.onnxruntime.shape_constants import fold_shape_arithmetic
from vitedge.backends.onnxruntime.transpose_pairs import cancel_transpose_pairs
from vitedge.onnxkit.session import SessionSettings, ort_session

SHAPE_ARITHMETIC = ("Shape", "Gather", "Unsqueeze", "Concat", "Slice", "Equal", "Where", "ConstantOfShape")


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort_session(model.SerializeToString(), SessionSettings(threads=1))
    return session.run(None, {session.get_inputs()[0].name: x})


def _same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, channels: int = 3, size: int = 32) -> None:
    """The same outputs at batch 1, 5 and 8, up to the last bits: with constant shapes ONNX Runtime may fuse more
    (a MatMul and its Add into one kernel), which rounds apart."""
    for batch in (1, 5, 8):
        x = np.random.default_rng(batch).standard_normal((batch, channels, size, size)).astype(np.float32)
        for ya, yb in zip(_run(a, x), _run(b, x)):
            assert ya.shape == yb.shape
            np.testing.assert_allclose(ya, yb, rtol=1e-5, atol=1e-6)


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _unread(model: onnx.ModelProto) -> list[str]:
    """Nodes whose outputs nothing reads: ONNX Runtime still runs them."""
    read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    return [n.name for n in model.graph.node if not any(o in read for o in n.output)]


def _exported(path, tmp_path, **intake) -> onnx.ModelProto:
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    out = tmp_path / "model.fp32.onnx"
    export_onnx(load_model(path, IntakeOptions(**intake) if intake else None), out)
    return onnx.load(str(out))


@pytest.mark.parametrize("which,heads", [("timm_vit", None), ("torchvision_vit", 4)])
def test_exported_vits_lose_their_shape_arithmetic_with_the_same_outputs(which, heads, request, tmp_path):
    _, path = request.getfixturevalue(which)
    exported = _exported(path, tmp_path, **({"num_heads": heads} if heads else {}))
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(exported)
    report = fold_shape_arithmetic(rewritten)
    assert report.replaced > 0 and report.removed > 0 and not report.skipped
    before, after = _ops(exported), _ops(rewritten)
    assert sum(after[o] for o in SHAPE_ARITHMETIC) < sum(before[o] for o in SHAPE_ARITHMETIC)
    assert after["Shape"] < before["Shape"]
    assert after["Expand"] == before["Expand"] and after["MatMul"] == before["MatMul"]
    _same_outputs(exported, rewritten)
    onnx.checker.check_model(rewritten)
    assert _unread(rewritten) == []
    again = fold_shape_arithmetic(rewritten)
    assert again.replaced == 0  # nothing left to fold


def _seq_first_vit():
    import torch
    from torch import nn

    class SeqFirstViT(nn.Module):
        """Patch embedding, class token, blocks of pre-norm sequence-first nn.MultiheadAttention and an MLP."""

        def __init__(self, dim=32, depth=2, heads=2, image=32, patch=8):
            super().__init__()
            self.pretrained_cfg = {"input_size": (3, image, image), "mean": (0.5,) * 3, "std": (0.5,) * 3,
                                   "crop_pct": 1.0, "interpolation": "bilinear", "num_classes": 10}
            self.embed = nn.Conv2d(3, dim, patch, patch)
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
            self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2 * depth))
            self.attns = nn.ModuleList(nn.MultiheadAttention(dim, heads) for _ in range(depth))
            self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)) for _ in range(depth))
            self.head = nn.Linear(dim, 10)

        def forward(self, x):
            x = self.embed(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
            for k, (attn, mlp) in enumerate(zip(self.attns, self.mlps)):
                h = self.norms[2 * k](x).transpose(0, 1)  # sequence-first, as nn.MultiheadAttention takes by default
                x = x + attn(h, h, h, need_weights=False)[0].transpose(0, 1)
                x = x + mlp(self.norms[2 * k + 1](x))
            return self.head(x[:, 0])

    torch.manual_seed(0)
    return SeqFirstViT().eval()


@pytest.fixture(scope="module")
def seq_first(tmp_path_factory):
    """(the sequence-first ViT as TorchScript, its exported FP32 graph)."""
    import torch

    folder = tmp_path_factory.mktemp("seq-first")
    ckpt = folder / "seqfirst.pt"
    torch.jit.save(torch.jit.trace(_seq_first_vit(), torch.randn(2, 3, 32, 32), check_trace=False), str(ckpt))
    return ckpt, _exported(ckpt, folder, mean=(0.5,), std=(0.5,))


def test_a_sequence_first_attention_loses_its_transpose_pairs_in_the_fp32_reference(seq_first, tmp_path):
    """The FP32 reference as the build writes it (q/k/v merged, attention fused, then both rewrites): the Transposes
    around the q/k/v GEMM and around the output GEMM go, and its outputs are the exported graph's."""
    from vitedge.backends.onnxruntime.backend import _fuse_reference
    from vitedge.onnxkit.files import save_onnx

    _, exported = seq_first
    src = tmp_path / "exported.onnx"
    save_onnx(exported, src)
    _fuse_reference(src, tmp_path / "fused.onnx")
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    assert _ops(fused)["MultiHeadAttention"] == 2 and _unread(fused) == []
    assert _ops(fused)["Transpose"] < _ops(exported)["Transpose"]
    x = np.random.default_rng(3).standard_normal((5, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(fused, x)[0], _run(exported, x)[0], rtol=1e-4, atol=1e-5)  # the fused attention rounds apart


def test_the_int8_artifact_with_both_rewrites_computes_what_it_computed_without(seq_first, tmp_path, monkeypatch):
    from conftest import CALIB_DIR

    if not CALIB_DIR.is_dir():
        pytest.skip("calibration/digits is not in this checkout")
    from vitedge.backends.onnxruntime import backend
    from vitedge.datasources.sources import open_source
    from vitedge.models.intake import IntakeOptions, load_model
    from vitedge.onnxkit.files import save_onnx
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    ckpt, exported = seq_first
    fp32 = tmp_path / "model.fp32.onnx"
    save_onnx(exported, fp32)
    loaded = load_model(ckpt, IntakeOptions(mean=(0.5,), std=(0.5,)))
    source = open_source(CALIB_DIR, loaded.spec.preprocess, limit=8, seed=0, class_names=None)
    qdq = build_qdq(calibrate(fp32, source, QuantConfig(method="minmax"), cache_dir=tmp_path / "cache")).save(tmp_path / "qdq.onnx")
    backend._fuse_file(qdq, tmp_path / "with.onnx")
    monkeypatch.setattr(backend, "fold_shape_arithmetic", lambda graph: None)
    monkeypatch.setattr(backend, "cancel_transpose_pairs", lambda graph: 0)
    backend._fuse_file(qdq, tmp_path / "without.onnx")
    with_, without = (onnx.load(str(tmp_path / f)) for f in ("with.onnx", "without.onnx"))
    assert _ops(with_)["Transpose"] <= _ops(without)["Transpose"] - 8  # two pairs per block
    assert _unread(with_) == []
    assert _ops(with_)["Shape"] <= _ops(without)["Shape"]  # this export's shapes are constants but the batch already
    assert _ops(with_)["MatMulIntegerToFloat"] == _ops(without)["MatMulIntegerToFloat"] > 0
    _same_outputs(without, with_)


def _model(nodes, inits, dims=("n", 4, 6), inputs=None, out_dims=None):
    ins = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)
    graph = helper.make_graph(nodes, "g", ins, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.int64 if np.asarray(value).dtype.kind == "i" else np.float32), name)


def _shape_chain(prefix: str, index: int) -> list:
    """Shape(x) -> Gather(index) -> Unsqueeze: one entry of x's shape as a 1-element tensor."""
    return [helper.make_node("Shape", ["x"], [f"{prefix}_s"]),
            helper.make_node("Gather", [f"{prefix}_s", "i" + str(index)], [f"{prefix}_g"], axis=0),
            helper.make_node("Unsqueeze", [f"{prefix}_g", "ax0"], [f"{prefix}_u"])]


def test_a_reshape_target_it_cannot_write_as_constants_stays_computed():
    """[2n, -1, 6]: -1 is taken, and 2n is no dimension of the input there (neither -1 nor 0 can stand for it)."""
    inits = [_const("i0", 0), _const("ax0", [0]), _const("two", [2]), _const("m1", [-1]), _const("six", [6])]
    nodes = _shape_chain("b", 0) + [
        helper.make_node("Mul", ["b_u", "two"], ["b2"]),
        helper.make_node("Concat", ["b2", "m1", "six"], ["rshape"], axis=0),
        helper.make_node("Reshape", ["x", "rshape"], ["y"]),
    ]
    model = _model(nodes, inits, dims=("n", 4, 6))
    assert fold_shape_arithmetic(model).replaced == 0
    assert _ops(model)["Shape"] == 1
    x = np.random.default_rng(0).standard_normal((3, 4, 6)).astype(np.float32)
    assert _run(model, x)[0].shape == (6, 2, 6)


def test_a_graph_with_two_inputs_or_a_free_spatial_size_is_left_alone():
    inits = [_const("i1", 1), _const("ax0", [0]), _const("m1", [-1])]
    nodes = _shape_chain("c", 1) + [helper.make_node("Concat", ["m1", "c_u"], ["rshape"], axis=0),
                                     helper.make_node("Reshape", ["x", "rshape"], ["y"])]
    free = _model(nodes, inits, dims=("n", "h", 6))
    assert fold_shape_arithmetic(free).skipped == ["the input's dimensions other than the batch are not fixed"]
    two = _model(nodes, inits, inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 6]),
                                       helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4, 6])])
    assert "inputs" in fold_shape_arithmetic(two).skipped[0]
    fixed = _model(nodes, inits, dims=("n", 4, 6))
    assert fold_shape_arithmetic(fixed).replaced == 1 and _ops(fixed)["Shape"] == 0


def _pair_graph(middle: str, second_perm=(1, 0, 2)):
    w = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.linspace(-1, 1, 5, dtype=np.float32), "bias")]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("MatMul", ["t", "w"], ["m"]),
             helper.make_node("Add", ["m", "bias"], ["a"])]
    if middle == "softmax over the first axis":
        nodes.append(helper.make_node("Softmax", ["a"], ["s"], axis=0))
    elif middle == "a second reader":
        nodes.append(helper.make_node("Relu", ["a"], ["s"]))
        nodes.append(helper.make_node("Transpose", ["a"], ["other"], perm=[1, 0, 2]))
    else:
        nodes.append(helper.make_node("Relu", ["a"], ["s"]))
    nodes.append(helper.make_node("Transpose", ["s"], ["y"], perm=list(second_perm)))
    extra = [helper.make_tensor_value_info("other", TensorProto.FLOAT, None)] if middle == "a second reader" else []
    model = _model(nodes, inits, dims=("n", 4, 6))
    model.graph.output.extend(extra)
    return model


@pytest.mark.parametrize("middle,second,removed", [("row-wise", (1, 0, 2), 1), ("softmax over the first axis", (1, 0, 2), 0),
                                                   ("a second reader", (1, 0, 2), 0), ("row-wise", (0, 1, 2), 0)])
def test_only_a_transpose_pair_around_row_wise_ops_goes(middle, second, removed):
    model = _pair_graph(middle, second)
    x = np.random.default_rng(1).standard_normal((3, 4, 6)).astype(np.float32)
    before = _run(model, x)
    assert cancel_transpose_pairs(model) == removed
    assert _ops(model)["Transpose"] == (1 if middle == "a second reader" else 0) + 2 - 2 * removed
    for a, b in zip(before, _run(model, x)):
        np.testing.assert_array_equal(a, b)
