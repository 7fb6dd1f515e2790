"""Attention fusion for the `onnx` target (vitedge.backends.onnxruntime.attention): every float
attention core of each ViT family vitedge takes becomes one com.microsoft.MultiHeadAttention
and computes what it computed before (checked with ONNX Runtime at two batch sizes); cores
that do not check out are left as they were, with a reason."""

from __future__ import annotations

import collections
import functools

import numpy as np
import onnx
import pytest
import torch
from conftest import CALIB_DIR, CUSTOM_VIT_SOURCE
from onnx import TensorProto, helper, numpy_helper

from vitedge.backends.onnxruntime.attention import MS_DOMAIN, fuse_attention
from vitedge.models.intake import IntakeOptions
from vitedge.onnxkit.session import ort_session

FAMILIES = ["timm_vit", "torchvision_vit", "deit_distilled", "custom_encoder_vit", "huggingface_vit"]


def _checkpoint(name, request, folder):
    """(checkpoint path, IntakeOptions) for one family, saved as users save it."""
    if name == "huggingface_vit":  # separate q/k/v projections; Softmax -> Cast -> Cast -> P.V in the export
        import json

        transformers = pytest.importorskip("transformers")
        torch.manual_seed(0)
        config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                        intermediate_size=96, num_labels=3, architectures=["ViTForImageClassification"])
        transformers.ViTForImageClassification(config).eval().save_pretrained(folder / "hf")
        (folder / "hf" / "preprocessor_config.json").write_text(json.dumps(
            {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 2, "size": {"height": 32, "width": 32}}))
        return folder / "hf", None
    if name == "custom_encoder_vit":
        src = folder / "tiny_vit.py"
        src.write_text(CUSTOM_VIT_SOURCE)
        namespace: dict = {}
        exec(compile(CUSTOM_VIT_SOURCE, str(src), "exec"), namespace)
        torch.manual_seed(0)
        ckpt = folder / "tiny.pt"
        torch.save(namespace["TinyViT"](dim=32, classes=4).eval().state_dict(), ckpt)
        return ckpt, IntakeOptions(model_class=f"{src}:TinyViT", model_kwargs={"dim": 32, "classes": 4})
    _, ckpt = request.getfixturevalue(name)
    return ckpt, IntakeOptions(num_heads=4) if name == "torchvision_vit" else None


@pytest.fixture(scope="module")
def exported(request, tmp_path_factory):
    """family -> (FP32 ONNX path, ModelSpec), loaded and exported with vitedge's own intake and exporter, once."""
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import load_model

    @functools.lru_cache(maxsize=None)
    def get(name):
        folder = tmp_path_factory.mktemp(name)
        ckpt, intake = _checkpoint(name, request, folder)
        loaded = load_model(ckpt, intake)
        path = folder / "model.fp32.onnx"
        export_onnx(loaded, path)
        return path, loaded.spec

    return get


def _fused(model):
    """(fused copy, AttentionFusion); the input model is left untouched."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m, fuse_attention(m)


def _ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


def _run(model, x):
    sess = ort_session(model.SerializeToString(), threads=2)
    return sess.run(None, {sess.get_inputs()[0].name: x})


def _assert_same_outputs(fused, ref_model, batches=(1, 3), size=(3, 32, 32)):
    for b in batches:
        x = np.random.default_rng(b).standard_normal((b, *size)).astype(np.float32)
        refs, gots = _run(ref_model, x), _run(fused, x)
        assert len(refs) == len(gots)
        for ref, got in zip(refs, gots):
            assert ref.shape == got.shape and got.shape[0] == b
            peak = float(np.max(np.abs(ref)))
            assert peak > 0  # a zero output would prove nothing
            diff = float(np.max(np.abs(got - ref)))
            assert diff <= 1e-4 * peak + 1e-6, f"batch {b}: max |fused - unfused| = {diff:g}, max |ref| = {peak:g}"


def _assert_all_fused(fused, report, depth, heads):
    assert report.fused == report.candidates == depth, report
    assert report.skipped == ()
    ops = _ops(fused)
    assert ops["Softmax"] == 0 and ops["MultiHeadAttention"] == depth
    mha = [n for n in fused.graph.node if n.op_type == "MultiHeadAttention"]
    assert all(n.domain == MS_DOMAIN for n in mha) and MS_DOMAIN in {o.domain for o in fused.opset_import}
    assert {helper.get_attribute_value(a) for n in mha for a in n.attribute if a.name == "num_heads"} == {heads}
    d = report.to_dict()
    assert d["operator"] == "com.microsoft.MultiHeadAttention" and d["fused"] == depth and d["num_heads"] == [heads]
    assert f"{depth} of {depth} cores" in report.one_line()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_float_core_fuses_and_computes_the_same(family, exported):
    path, spec = exported(family)
    model = onnx.load(path)
    fused, report = _fused(model)
    assert spec.depth == 2
    _assert_all_fused(fused, report, spec.depth, spec.num_heads)
    onnx.checker.check_model(fused)
    _assert_same_outputs(fused, model)
    assert fuse_attention(fused).candidates == 0  # nothing left to find


# --------------------------------------------------------------------------- Q/DQ graphs


@pytest.fixture(scope="module")
def qdq_graphs(exported, tmp_path_factory):
    """family -> (plain Q/DQ graph, Q/DQ graph with the attention matmuls quantized), from one calibration."""
    from vitedge.datasources.sources import open_source
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    cache = tmp_path_factory.mktemp("calib-cache")

    @functools.lru_cache(maxsize=None)
    def get(name):
        path, spec = exported(name)
        source = open_source(CALIB_DIR, spec.preprocess, limit=16, seed=0, class_names=None)
        cal = calibrate(path, source, QuantConfig(method="minmax", quantize_attention=True), cache_dir=cache)
        return build_qdq(cal, quantize_attention=False).model, build_qdq(cal, quantize_attention=True).model

    return get


@pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")
@pytest.mark.parametrize("family", FAMILIES)
def test_qdq_graph_fuses_only_float_attention(family, exported, qdq_graphs):
    _, spec = exported(family)
    plain, quantized_attention = qdq_graphs(family)
    assert _ops(quantized_attention)["QuantizeLinear"] > _ops(plain)["QuantizeLinear"]

    # attention matmuls quantized: Q/DQ inside every core, so nothing is fused and each core says why
    fused, report = _fused(quantized_attention)
    assert (report.candidates, report.fused, report.num_heads) == (spec.depth, 0, ())
    assert len(report.skipped) == spec.depth
    softmaxes = [n.name for n in quantized_attention.graph.node if n.op_type == "Softmax"]
    for name, reason in zip(softmaxes, report.skipped):
        assert reason.startswith(f"{name}: ") and "Q/DQ inside the core" in reason
    assert fused == quantized_attention and MS_DOMAIN not in {o.domain for o in fused.opset_import}
    assert f"0 of {spec.depth} cores" in report.one_line() and "first left as is" in report.one_line()

    # the default Q/DQ graph (float attention): every core fused, the quantized layers untouched
    fused, report = _fused(plain)
    _assert_all_fused(fused, report, spec.depth, spec.num_heads)
    before, after = _ops(plain), _ops(fused)
    for op in ("QuantizeLinear", "DequantizeLinear", "Gemm", "Conv"):
        assert after[op] == before[op], op
    assert after["MatMul"] == before["MatMul"] - 2 * spec.depth
    _assert_same_outputs(fused, plain)


# --------------------------------------------------------------------------- cores left alone


@pytest.mark.parametrize("tensor", ["probabilities", "logits"])
def test_core_read_outside_is_left_alone(tensor, exported):
    """A core whose Softmax output (or input) is also a graph output keeps it: the other cores still fuse."""
    path, spec = exported("timm_vit")
    model = onnx.load(path)
    first = next(n for n in model.graph.node if n.op_type == "Softmax")
    name = first.output[0] if tensor == "probabilities" else first.input[0]
    model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    fused, report = _fused(model)
    assert (report.candidates, report.fused) == (spec.depth, spec.depth - 1)
    [reason] = report.skipped
    assert reason.startswith(f"{first.name}: ") and "read outside" in reason
    ops = _ops(fused)
    assert ops["Softmax"] == 1 and ops["MultiHeadAttention"] == spec.depth - 1
    assert [o.name for o in fused.graph.output] == [o.name for o in model.graph.output]
    _assert_same_outputs(fused, model)  # the extra output too


def _hand_made_attention(mask: bool, b="batch", s=5, e=8, heads=2):
    """X [B, S, E] -> q, k, v projections -> MatMul -> Mul(scale) [-> Add(mask)] -> Softmax -> MatMul -> [B, S, E]."""
    rng = np.random.default_rng(0)
    d = e // heads
    inits = [numpy_helper.from_array(rng.standard_normal((e, e)).astype(np.float32) * 0.5, f"W{p}") for p in "qkv"]
    inits += [numpy_helper.from_array(np.array([0, 0, heads, d], dtype=np.int64), "heads_shape"),
              numpy_helper.from_array(np.array([0, 0, e], dtype=np.int64), "flat_shape"),
              numpy_helper.from_array(np.array(d ** -0.5, dtype=np.float32), "scale"),
              numpy_helper.from_array(rng.standard_normal((s, s)).astype(np.float32), "mask")]
    nodes = []
    for p in "qkv":
        nodes.append(helper.make_node("MatMul", ["X", f"W{p}"], [f"{p}_proj"], name=f"{p}_proj"))
        nodes.append(helper.make_node("Reshape", [f"{p}_proj", "heads_shape"], [f"{p}_heads"], name=f"{p}_reshape"))
        perm = [0, 2, 3, 1] if p == "k" else [0, 2, 1, 3]
        nodes.append(helper.make_node("Transpose", [f"{p}_heads"], [f"{p}_t"], perm=perm, name=f"{p}_transpose"))
    nodes.append(helper.make_node("MatMul", ["q_t", "k_t"], ["qk"], name="qk"))
    nodes.append(helper.make_node("Mul", ["qk", "scale"], ["scaled"], name="scale_mul"))
    logits = "scaled"
    if mask:
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask_add"))
        logits = "masked"
    nodes.append(helper.make_node("Softmax", [logits], ["probs"], axis=-1, name="attn/Softmax"))
    nodes.append(helper.make_node("MatMul", ["probs", "v_t"], ["pv"], name="pv"))
    nodes.append(helper.make_node("Transpose", ["pv"], ["pv_t"], perm=[0, 2, 1, 3], name="out_transpose"))
    nodes.append(helper.make_node("Reshape", ["pv_t", "flat_shape"], ["Y"], name="out_reshape"))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [b, s, e])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [b, s, e])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("mask", [False, True])
def test_additive_mask_is_left_alone(mask):
    model = _hand_made_attention(mask)
    onnx.checker.check_model(model)
    fused, report = _fused(model)
    assert report.candidates == 1
    if not mask:  # the control: the same graph without the mask is recognised, fused and exact
        _assert_all_fused(fused, report, 1, 2)
        _assert_same_outputs(fused, model, size=(5, 8))
        return
    assert report.fused == 0 and report.num_heads == ()
    [reason] = report.skipped
    assert reason.startswith("attn/Softmax: ") and "MatMul -> Softmax -> MatMul" in reason
    assert fused == model
    assert "no attention core" not in report.one_line() and "0 of 1 cores" in report.one_line()


class _ShapeReadAttention(torch.nn.Module):
    """Self-attention whose P.V output is rearranged with sizes read from it (``b, h, n, d = out.shape``, as
    einops' rearrange exports): the exported graph has Shape nodes reading the P.V output beside its Transpose."""

    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(dim, dim * 3, bias=False), torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, e = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, e // self.heads).permute(2, 0, 3, 1, 4)
        out = torch.softmax(q @ k.transpose(-2, -1) * (e // self.heads) ** -0.5, dim=-1) @ v
        b, h, n, d = out.shape
        return self.out(out.transpose(1, 2).reshape(b, n, h * d))


def test_attention_whose_output_shape_is_read_fuses(tmp_path):
    """The P.V output read by Shape nodes (a layout with dynamic sizes) fuses like any core, and computes the same."""
    torch.manual_seed(0)
    path = tmp_path / "shape_read.onnx"
    torch.onnx.export(_ShapeReadAttention().eval(), (torch.randn(2, 5, 16),), str(path), opset_version=17, dynamo=False,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "tokens"}})
    ref = onnx.load(str(path))
    pv_shape_readers = [n for n in ref.graph.node if n.op_type == "Shape"]
    assert pv_shape_readers  # what this layout is about
    model = onnx.load(str(path))
    report = fuse_attention(model)
    assert (report.fused, report.candidates) == (1, 1), report.skipped
    assert sum(n.op_type == "MultiHeadAttention" for n in model.graph.node) == 1
    x = np.random.default_rng(0).standard_normal((3, 5, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(model, x), _run(ref, x), atol=1e-5)
