"""The onnx target removes Adds of zeros (vitedge/backends/onnxruntime/zero_add.py): a block whose heads were all
pruned returns ``zeros_like(x)``, exported as ``LayerNormalization -> Shape -> ConstantOfShape(0) -> Add``; the chain
goes from the FP32 reference and from the INT8 graph alike, and the outputs stay the same bits. Hand-made graphs pin
what is left alone: zeros that broadcast to a larger shape, a nonzero ConstantOfShape, an Add that is a graph output."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import torch
from torch import nn

from vitedge.backends.onnxruntime.zero_add import drop_zero_adds
from vitedge.onnxkit.session import SessionSettings, ort_session

CHAINS = {"state_dict": ("Shape", "ConstantOfShape"), "torchscript": ("Shape", "Expand")}


class Block(nn.Module):
    """Pre-norm block; with ``heads=0`` its attention returns zeros_like(x), as a block whose heads were all pruned."""

    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True) if heads else None
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + (self.attn(h, h, h, need_weights=False)[0] if self.attn is not None else torch.zeros_like(h))
        return x + self.mlp(self.norm2(x))


class PrunedViT(nn.Module):
    """Patch embedding, class token, three pre-norm blocks (``pruned`` ones without a head), a Linear head."""

    def __init__(self, dim=32, depth=3, image=32, patch=8, channels=1, pruned=(1,)):
        super().__init__()
        self.embed = nn.Conv2d(channels, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, 0 if i in pruned else 2) for i in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)[:, 0])


def _export(folder: Path, form: str, pruned=(1,)):
    """(the loaded model, its FP32 export by vitedge): a state_dict with its class (the TorchScript-based exporter:
    zeros_like as ConstantOfShape) or a traced TorchScript file (exported through torch.export: zeros_like as Expand)."""
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    torch.manual_seed(0)
    model = PrunedViT(pruned=pruned).eval()
    kwargs = {"pruned": list(pruned)}
    if form == "state_dict":
        ckpt = folder / "pruned.pth"
        torch.save(model.state_dict(), ckpt)
        options = IntakeOptions(model_class=f"{Path(__file__).resolve()}:PrunedViT", model_kwargs=kwargs, mean=(0.5,), std=(0.5,),
                                input_size=(32, 32))
    else:
        ckpt = folder / "pruned.pt"
        torch.jit.save(torch.jit.trace(model, torch.randn(2, 1, 32, 32), check_trace=False), str(ckpt))
        options = IntakeOptions(mean=(0.5,), std=(0.5,))
    loaded = load_model(ckpt, options)
    fp32 = folder / "model.fp32.onnx"
    export_onnx(loaded, fp32)
    return loaded, fp32


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _run(model, x: np.ndarray) -> np.ndarray:
    session = ort_session(model if isinstance(model, str) else model.SerializeToString(), SessionSettings(threads=1))
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _same_bits(a, b) -> None:
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 1, 32, 32)).astype(np.float32)
        ya, yb = _run(a, x), _run(b, x)
        assert ya.shape == yb.shape == (batch, 10)
        np.testing.assert_array_equal(ya, yb)


@pytest.fixture(scope="module", params=["state_dict", "torchscript"])
def pruned(request, tmp_path_factory):
    """(the export form, the loaded model, its FP32 export) of a 3-block ViT whose middle block has no head."""
    return (request.param, *_export(tmp_path_factory.mktemp("pruned"), request.param))


def _zero_adds(graph: onnx.ModelProto, form: str) -> int:
    """How many Adds read a zeros chain (Shape -> ConstantOfShape, or Shape -> Expand)."""
    producer = {o: n for n in graph.graph.node for o in n.output}
    zeros = CHAINS[form][1]
    made = {n.output[0] for n in graph.graph.node if n.op_type == zeros
            and getattr(producer.get(n.input[-1 if zeros == "Expand" else 0]), "op_type", None) == "Shape"}
    return sum(1 for n in graph.graph.node if n.op_type == "Add" and any(i in made for i in n.input))


def test_the_zeros_chain_goes_from_the_export_with_the_same_outputs(pruned):
    form, _, fp32 = pruned
    exported = onnx.load(str(fp32))
    assert _zero_adds(exported, form) == 1  # what the export holds: the pruned block's Add of zeros
    rewritten = onnx.load(str(fp32))
    report = drop_zero_adds(rewritten)
    assert report.dropped == 1 and _zero_adds(rewritten, form) == 0
    ops, before = _ops(rewritten), _ops(exported)
    assert before["Add"] - ops["Add"] == 1 and before["LayerNormalization"] - ops["LayerNormalization"] == 1  # its norm1 too
    assert report.removed == sum(before.values()) - sum(ops.values()) - (before["Constant"] - ops["Constant"])
    _same_bits(exported, rewritten)
    again = drop_zero_adds(rewritten)
    assert (again.dropped, again.removed) == (0, 0)


def test_the_fp32_reference_and_the_int8_graph_both_lose_the_chain(pruned, tmp_path):
    """As the build writes them: ``_fuse_reference`` (FP32) and ``_fuse_file`` (INT8, after quantization)."""
    from conftest import CALIB_DIR

    if not CALIB_DIR.is_dir():
        pytest.skip("calibration/digits is not in this checkout")
    from vitedge.backends.onnxruntime.backend import _fuse_file, _fuse_reference
    from vitedge.datasources.sources import open_source
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    form, loaded, fp32 = pruned
    reference = tmp_path / "reference.fp32.onnx"
    _fuse_reference(fp32, reference)
    source = open_source(CALIB_DIR, loaded.spec.preprocess, limit=16, seed=0, class_names=None)
    qdq = build_qdq(calibrate(fp32, source, QuantConfig(method="minmax"), cache_dir=tmp_path / "cache")).save(tmp_path / "model.qdq.onnx")
    assert _zero_adds(onnx.load(str(qdq)), form) == 1  # quantization kept the chain, with no Q/DQ on the zeros
    artifact = tmp_path / "model.int8.onnx"
    _fuse_file(qdq, artifact)
    for path in (reference, artifact):
        graph = onnx.load(str(path))
        assert _zero_adds(graph, form) == 0, path.name
        assert _ops(graph)["LayerNormalization"] == _ops(onnx.load(str(fp32)))["LayerNormalization"] - 1, path.name  # norm1 went
    qdq_dropped = onnx.load(str(qdq))
    assert drop_zero_adds(qdq_dropped).dropped == 1
    _same_bits(str(qdq), qdq_dropped)  # the INT8 graph computes what it computed with the chain
    x = np.random.default_rng(3).standard_normal((3, 1, 32, 32)).astype(np.float32)
    ref, out = _run(str(qdq), x), _run(str(artifact), x)
    assert float(np.max(np.abs(ref - out))) <= 1e-3 * float(np.max(np.abs(ref))) + 1e-6


def test_a_vit_without_a_pruned_block_is_unchanged(tmp_path):
    _, fp32 = _export(tmp_path, "state_dict", pruned=())
    graph = onnx.load(str(fp32))
    report = drop_zero_adds(graph)
    assert (report.dropped, report.removed) == (0, 0)
    assert graph.SerializeToString() == onnx.load(str(fp32)).SerializeToString()


def _graph(a_dims, b_dims, value=None, start=None, add_is_output=False, zeros_first=True):
    """y = (Add(a, zeros of b's shape) read by a Relu), a = LayerNorm(x) and b = LayerNorm of x or of a graph input."""
    d = 8
    inits = [numpy_helper.from_array(np.ones(d, np.float32), "g"), numpy_helper.from_array(np.zeros(d, np.float32), "bias")]
    cos = {} if value is None else {"value": numpy_helper.from_array(np.array([value], np.float32))}
    shape = {} if start is None else {"start": start}
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "bias"], ["a"], name="norm_a"),
             helper.make_node("LayerNormalization", ["z" if b_dims != a_dims else "x", "g", "bias"], ["b"], name="norm_b"),
             helper.make_node("Shape", ["b"], ["s"], name="shape", **shape),
             helper.make_node("ConstantOfShape", ["s"], ["zeros"], name="zeros", **cos),
             helper.make_node("Add", ["zeros", "a"] if zeros_first else ["a", "zeros"], ["sum"], name="add"),
             helper.make_node("Relu", ["sum"], ["y"], name="relu")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, a_dims)]
    if b_dims != a_dims:
        ins.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, b_dims))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if add_is_output:
        outs.append(helper.make_tensor_value_info("sum", TensorProto.FLOAT, None))
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs, inits), opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("zeros_first", [True, False])
def test_zeros_of_the_others_shape_go_in_either_order(zeros_first):
    model = _graph(["n", 5, 8], ["n", 5, 8], zeros_first=zeros_first)
    report = drop_zero_adds(model)
    assert report.dropped == 1 and report.removed == 4  # Add, ConstantOfShape, Shape, and the LayerNorm only Shape read
    assert [n.name for n in model.graph.node] == ["norm_a", "relu"] and list(model.graph.node[1].input) == ["a"]
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(model, x), _run(_graph(["n", 5, 8], ["n", 5, 8], zeros_first=zeros_first), x))


@pytest.mark.parametrize("case", [
    {"a_dims": ["n", 1, 8], "b_dims": ["n", 5, 8]},  # zeros broadcast a to a larger shape
    {"a_dims": ["n", 5, 8], "b_dims": ["n", 5, 8], "value": 1.0},  # not zeros
    {"a_dims": ["n", 5, 8], "b_dims": ["n", 5, 8], "start": 1},  # zeros of part of the shape: they could broadcast
    {"a_dims": ["n", 5, 8], "b_dims": ["n", 5, 8], "add_is_output": True},  # the Add's output is the graph's
    {"a_dims": ["n", 5, 8], "b_dims": ["m", 5, 8]},  # the same rank but another tensor's shape: not proved equal
])
def test_what_is_not_an_add_of_zeros_of_the_same_shape_is_left_alone(case):
    model = _graph(**case)
    before = model.SerializeToString()
    report = drop_zero_adds(model)
    assert (report.dropped, report.removed) == (0, 0)
    assert model.SerializeToString() == before


def test_an_explicit_zero_value_counts_as_zeros():
    model = _graph(["n", 5, 8], ["n", 5, 8], value=-0.0)
    assert drop_zero_adds(model).dropped == 1
