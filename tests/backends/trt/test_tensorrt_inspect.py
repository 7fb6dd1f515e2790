"""What the report says about a built engine: the inspector's per-layer precision and whether
each attention block became a fused MHA kernel, and the warning the plan gives before any
build when INT8 fused attention cannot happen. The inspector records below follow the JSON
TensorRT writes with ProfilingVerbosity.DETAILED ("Name", "LayerType", "Inputs"/"Outputs"
with "Format/Datatype", "TacticName"); they are written by hand, not captured from a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.tensorrt_standin import make_fake_trt
from onnx import TensorProto, helper, numpy_helper

from vitedge.backends.tensorrt.attention import attention_blocks, fusion_warnings
from vitedge.backends.tensorrt.apply import apply_plan
from vitedge.backends.tensorrt.engine_inspect import one_line, summarize_layers
from vitedge.backends.tensorrt.plan import (
    TensorRtOptions,
    capabilities_from_module,
    plan_build,
)


def _io(dtype):
    return [{"Name": "t", "Location": "Device", "Dimensions": [1, 65, 192], "Format/Datatype": f"Row major linear {dtype}"}]


def _layer(name, ltype, din, dout, tactic=""):
    return {"Name": name, "LayerType": ltype, "Inputs": _io(din), "Outputs": _io(dout), "TacticName": tactic}


BLOCKS = [{"scope": f"/blocks/blocks.{i}/attn/", "qk_matmul": f"/blocks/blocks.{i}/attn/MatMul",
           "pv_matmul": f"/blocks/blocks.{i}/attn/MatMul_1"} for i in range(3)]
LAYERS = [
    _layer("/blocks/blocks.0/attn/qkv/MatMul", "CaskGemmMatrixMultiply", "Int8", "FP16 format", "sm87_xmma_gemm_i8i8"),
    _layer("{ForeignNode[/blocks/blocks.0/attn/MatMul.../blocks/blocks.0/attn/MatMul_1]}", "Myelin", "Int8", "Half",
           "_gemm_mha_v2_myl0_3"),
    _layer("/blocks/blocks.1/attn/MatMul", "CaskGemmMatrixMultiply", "Half", "Half"),
    _layer("/blocks/blocks.1/attn/Softmax", "CaskSoftMax", "Half", "Half"),
    _layer("/blocks/blocks.1/attn/MatMul_1", "CaskGemmMatrixMultiply", "Half", "Half"),
    _layer("{ForeignNode[/blocks/blocks.2/norm1/LayerNormalization.../head/Gemm]}", "Myelin", "FP32", "FP32"),
]


def test_per_layer_precision_and_mha_fusion_per_block():
    s = summarize_layers({"Layers": LAYERS, "Bindings": []}, BLOCKS)
    assert s["layer_precision"]["/blocks/blocks.0/attn/qkv/MatMul"] == "int8"
    assert s["layer_precision"]["/blocks/blocks.1/attn/Softmax"] == "fp16"
    assert s["precision_counts"] == {"int8": 2, "fp16": 3, "fp32": 1}
    assert [b["mha"] for b in s["attention"]["blocks"]] == ["fused", "not fused", "unknown"]
    assert (s["attention"]["fused"], s["attention"]["not_fused"], s["attention"]["unknown"]) == (1, 1, 1)
    assert one_line(s) == ("6 engine layers: 3 fp16, 2 int8, 1 fp32; attention: 1 of 3 block(s) fused into MHA kernels, "
                           "1 not fused, 1 not visible in the inspector")


def test_layer_names_only_give_a_count():
    s = summarize_layers({"Layers": ["a", "b"]}, BLOCKS[:1])
    assert s["count"] == 2 and s["precision_counts"] == {} and s["attention"]["unknown"] == 1


def test_the_build_reports_what_the_inspector_says(tiny):
    path, graph = tiny
    trt = make_fake_trt("10.3.0", inspector_layers=LAYERS)
    plan = plan_build(TensorRtOptions(opt_batch=4), (1, 4, 8), capabilities_from_module(trt), graph=graph)
    said = []
    built = apply_plan(trt, plan, path, attention=BLOCKS, log=said.append)
    layers = built.info()["engine_layers"]
    assert layers["attention"]["fused"] == 1 and layers["layer_precision"]["/blocks/blocks.1/attn/MatMul"] == "fp16"
    assert ("inspector.get_engine_information", "JSON") in trt.calls
    assert any(line.startswith("model.engine: 6 engine layers") for line in said)


def _engine(tiny, version, batch_sizes=(1, 4, 8)):
    path, graph = tiny
    trt = make_fake_trt(version)
    plan = plan_build(TensorRtOptions(opt_batch=4), batch_sizes, capabilities_from_module(trt), graph=graph)
    built = apply_plan(trt, plan, path.parent / plan.graph)
    return trt, plan, built, trt.Runtime(trt.Logger()).deserialize_cuda_engine(built.engine)


@pytest.mark.parametrize("version", ["10.3.0", "11.4.1"])
def test_a_dynamic_profile_reports_na_without_a_context_as_the_real_inspector_does(tiny, version):
    """Real inspector records of dynamic-shape engines say "N/A due to dynamic shapes" for every tensor
    (and -1 in Dimensions); the stand-in does the same, and the summary counts them as unknown, not as a
    precision."""
    import json

    trt, _plan, _built, engine = _engine(tiny, version)
    info = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    tensors = [t for layer in info["Layers"] for t in layer["Inputs"] + layer["Outputs"]]
    assert tensors and all(t["Dimensions"][0] == -1 for t in tensors)
    keys = ("Format", "Datatype") if version.startswith("11") else ("Format/Datatype",)
    assert all(t[key] == "N/A due to dynamic shapes" for t in tensors for key in keys)
    s = summarize_layers(info)
    assert s["layer_precision"] == {} and s["precision_unknown"] == s["count"] == 7
    assert "7 not reported (N/A due to dynamic shapes)" in one_line(s)


@pytest.mark.parametrize("version, schema", [("10.3.0", "8.6-10.x"), ("10.16.0", "8.6-10.x"), ("11.0.0", "11.x"), ("11.4.1", "11.x")])
def test_the_build_inspects_with_a_context_at_the_opt_shape(tiny, version, schema):
    trt, plan, built, _engine_ = _engine(tiny, version)
    assert ("context.set_input_shape", "input", (4, 3, 8, 8)) in trt.calls  # the opt shape, not min or max
    assert ("inspector.execution_context", True) in trt.calls
    assert trt.calls.index(("inspector.execution_context", True)) < trt.calls.index(("inspector.get_engine_information", "JSON"))
    layers = built.layers
    assert layers["context_bound"] is True and "precision_unknown" not in layers and layers["schema"] == schema
    assert layers["layer_precision"]["q"] == layers["layer_precision"]["dq"] == "int8" and layers["io_tensors"][0]["name"] == "input"
    if schema == "11.x":
        assert layers["io_tensors"][0] == {"name": "input", "mode": "input", "dtype": "Float"}


@pytest.mark.parametrize("key", ["Datatype", "DataType"])
def test_both_inspector_schemas_read_the_same(key):
    """The 10.x record ("Format/Datatype", "Bindings") and the 11.x one ("Datatype" or "DataType" beside "Format",
    "I/O Tensors", TensorRT 11 IEngineInspector migration guide) of the same layers give the same summary. 11.x
    spells the layers' type "Datatype"; a reader of "DataType" only lost every layer's precision there."""
    def layer(name, din, dout, eleven):
        def t(dtype):
            if eleven:
                return {"Name": "t", "Dimensions": [4, 8], "Format": "Row major linear", key: dtype}
            return {"Name": "t", "Dimensions": [4, 8], "Format/Datatype": f"Row major linear {dtype}"}
        return {"Name": name, "LayerType": "X", "Inputs": [t(din)], "Outputs": [t(dout)]}

    spec = [("a", "Float", "Int8"), ("b", "Int8", "Half"), ("c", "Half", "Half"), ("d", "Float", "Float")]
    ten = summarize_layers({"Layers": [layer(*x, False) for x in spec], "Bindings": ["input", "logits"]})
    eleven = summarize_layers({"Layers": [layer(*x, True) for x in spec], "I/O Tensors": [
        {"Name": "input", "IOMode": "Input", key: "Float"}, {"Name": "logits", "IOMode": "Output", key: "Float"}]})
    assert ten["layer_precision"] == eleven["layer_precision"] == {"a": "int8", "b": "int8", "c": "fp16", "d": "fp32"}
    assert [t["name"] for t in ten["io_tensors"]] == [t["name"] for t in eleven["io_tensors"]] == ["input", "logits"]
    assert (ten["schema"], eleven["schema"]) == ("8.6-10.x", "11.x")
    assert [t["dtype"] for t in eleven["io_tensors"]] == ["Float", "Float"]


def test_na_tensors_fall_back_to_weights_and_tactic_names():
    na = [{"Format/Datatype": "N/A due to dynamic shapes"}]
    conv = {"Name": "conv", "Inputs": na, "Outputs": na, "Weights": {"Type": "Half", "Count": 9}}
    gemm = {"Name": "gemm", "Inputs": na, "Outputs": na, "TacticName": "sm80_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize128x128x64"}
    reformat = {"Name": "reformat", "LayerType": "Reformat", "Inputs": na, "Outputs": na}
    s = summarize_layers({"Layers": [conv, gemm, reformat]})
    assert s["layer_precision"] == {"conv": "fp16", "gemm": "int8"} and s["precision_unknown"] == 1


def _attention_graph(tokens: int, heads: int, head_size: int, quantized: bool):
    """One attention core: (B, heads, T, d) @ (B, heads, d, T) -> Softmax -> @ V."""
    shape_q = ["batch", heads, tokens, head_size]
    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, shape_q)
    kt = helper.make_tensor_value_info("kt", TensorProto.FLOAT, ["batch", heads, head_size, tokens])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, shape_q)
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, shape_q)
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z")]
    nodes, names = [], {}
    for t in ("q", "kt", "v", "p"):
        src = t if t != "p" else "probs"
        if quantized:
            nodes += [helper.make_node("QuantizeLinear", [src, "s", "z"], [f"{t}_q"], name=f"/attn/{t}_q"),
                      helper.make_node("DequantizeLinear", [f"{t}_q", "s", "z"], [f"{t}_dq"], name=f"/attn/{t}_dq")]
            names[t] = f"{t}_dq"
        else:
            names[t] = src
    qk = helper.make_node("MatMul", [names["q"], names["kt"]], ["scores"], name="/blocks.0/attn/MatMul")
    sm = helper.make_node("Softmax", ["scores"], ["probs"], name="/blocks.0/attn/Softmax", axis=-1)
    pv = helper.make_node("MatMul", [names["p"], names["v"]], ["pv" if quantized else "o"], name="/blocks.0/attn/MatMul_1")
    p_nodes = [n for n in nodes if n.input[0] == "probs" or n.input[0] == "p_q"]
    other = [n for n in nodes if n not in p_nodes]
    after = ([helper.make_node("QuantizeLinear", ["pv", "s", "z"], ["pv_q"]), helper.make_node("DequantizeLinear", ["pv_q", "s", "z"], ["o"])]
             if quantized else [])  # the Q/DQ after P.V, the third place of TensorRT's rule
    graph = helper.make_graph(other + [qk, sm] + p_nodes + [pv] + after, "attn", [q, kt, v], [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("tokens, head_size, quantized, expected", [
    (197, 64, True, []),  # ViT-B/16 at 224 px: fusable
    (577, 64, True, ["577 tokens is more than 512"]),  # ViT-B/16 at 384 px
    (65, 48, True, ["head size 48 is not 16, 32 or 64"]),
    (65, 32, False, ["no Q/DQ on both inputs"]),
])
def test_the_plan_warns_before_building_when_int8_mha_cannot_fuse(tokens, head_size, quantized, expected):
    blocks = attention_blocks(_attention_graph(tokens, 3, head_size, quantized))
    assert len(blocks) == 1 and (blocks[0].tokens, blocks[0].heads, blocks[0].head_size) == (tokens, 3, head_size)
    assert blocks[0].qk_quantized == blocks[0].pv_quantized == quantized
    warnings = fusion_warnings(blocks)
    assert len(warnings) == len(expected)
    for w, e in zip(warnings, expected):
        assert e in w and w.startswith("INT8 fused attention cannot happen in 1 of 1 attention block(s)")
