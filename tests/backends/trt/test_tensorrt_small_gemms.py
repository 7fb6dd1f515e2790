"""The NVIDIA targets keep float the GEMMs NVIDIA's own ONNX PTQ (ModelOpt) keeps float for TensorRT: the
classifier head (a GEMV at batch 1) and GEMMs with K or N below 16 (attention heads narrower than 16).
The CPU targets' graph does not change; the manifest says which layers and why; the attention check
does not count a float attention core as INT8 MHA and says TensorRT runs it in the float precision."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitedge.app.overrides import QuantOverrides
from vitedge.backends.tensorrt.attention import attention_blocks, fusion_table, fusion_warnings
from vitedge.bundle.manifest import read_manifest
from vitedge.targets.profiles import load_profile

NVIDIA = ["jetson-orin", "jetson-orin-nx", "jetson-orin-nano", "desktop-gpu", "jetson", "nvidia-gpu"]


@pytest.mark.parametrize("name", NVIDIA)
def test_nvidia_profiles_keep_small_gemms_float_and_cpu_profiles_do_not(name):
    profile = load_profile(name)
    assert profile.quantization.get("float_small_gemms") is True
    assert QuantOverrides().config_for(profile).float_small_gemms is True
    # the user's override: --quantize-small-gemms quantizes them anyway
    assert QuantOverrides(float_small_gemms=False).config_for(profile).float_small_gemms is False
    for cpu in ("onnx", "intel-cpu", "intel-cpu-vnni"):
        assert QuantOverrides().config_for(load_profile(cpu)).float_small_gemms is False


def test_nvidia_bundle_keeps_the_classifier_head_float_and_says_why(example_bundles):
    root = example_bundles[0]
    jetson, cpu = read_manifest(root / "jetson"), read_manifest(root / "intel-cpu")
    assert jetson.quantization.config["float_small_gemms"] is True
    assert jetson.quantization.small_gemms["float"] == {"/head/Gemm": "GEMV (output [1, 10] at batch 1: one row per image)"}
    assert "find_nodes_from_matmul_to_exclude" in jetson.quantization.small_gemms["rule"]
    assert "/head/Gemm" in jetson.quantization.kept_float
    assert jetson.quantization.layer_kinds["head"] == {"int8": 0, "total": 1}
    assert "small GEMM(s) float as NVIDIA ModelOpt keeps them" in jetson.quantization.summary_line
    graph = onnx.load(str(root / "jetson" / "model.int8.onnx"))
    head = next(n for n in graph.graph.node if n.name == "/head/Gemm")
    producers = {o: n.op_type for n in graph.graph.node for o in n.output}
    assert all(producers.get(i) != "DequantizeLinear" for i in head.input)
    # the CPU targets' graph is unchanged: its head stays INT8
    assert cpu.quantization.config["float_small_gemms"] is False
    assert "/head/Gemm" not in cpu.quantization.kept_float and cpu.quantization.layer_kinds["head"]["int8"] == 1
    assert "small_gemms" not in json.loads((root / "intel-cpu" / "manifest.json").read_text())["quantization"]


def _narrow_vit(head_size: int = 8, heads: int = 4, tokens: int = 17, classes: int = 10) -> onnx.ModelProto:
    """An FP32 graph of one pre-norm-free attention block and a mean-pooled classifier head."""
    dim = head_size * heads
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n) for n, s in
             (("wq", (dim, dim)), ("wk", (dim, dim)), ("wv", (dim, dim)), ("wo", (dim, dim)), ("wh", (classes, dim)))]
    inits += [numpy_helper.from_array(np.array([0, tokens, heads, head_size], np.int64), "split"),
              numpy_helper.from_array(np.array([0, tokens, dim], np.int64), "merge"),
              numpy_helper.from_array(np.zeros(classes, np.float32), "bh")]
    n = helper.make_node
    nodes = []
    for name in "qkv":
        nodes += [n("MatMul", ["x", f"w{name}"], [f"{name}0"], name=f"/attn/{name}/MatMul"),
                  n("Reshape", [f"{name}0", "split"], [f"{name}1"]),
                  n("Transpose", [f"{name}1"], [name], perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
    nodes += [n("MatMul", ["q", "k"], ["scores"], name="/attn/MatMul"), n("Softmax", ["scores"], ["p"], name="/attn/Softmax", axis=-1),
              n("MatMul", ["p", "v"], ["ctx"], name="/attn/MatMul_1"), n("Transpose", ["ctx"], ["ctx1"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ctx1", "merge"], ["ctx2"]), n("MatMul", ["ctx2", "wo"], ["o"], name="/attn/proj/MatMul"),
              n("Add", ["x", "o"], ["r"], name="/Add"), n("ReduceMean", ["r"], ["pooled"], axes=[1], keepdims=0),
              n("Gemm", ["pooled", "wh", "bh"], ["logits"], name="/head/Gemm", transB=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", tokens, dim])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])
    return helper.make_model(helper.make_graph(nodes, "narrow", [x], [y], inits), opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("shape_inference_works", [True, False])
def test_modelopt_rule_picks_the_head_and_narrow_attention(monkeypatch, shape_inference_works):
    """ModelOpt's rule at batch 1: the head is a GEMV and its N is 10; Q.K^T has K 8, P.V has N 8; the 32-wide linears
    stay INT8. Where shape inference gives nothing, one ONNX Runtime run of a zero input gives the shapes."""
    from vitedge.quantize import small_gemm
    from vitedge.quantize.graph import GraphIndex, find_layers

    model = _narrow_vit()
    if not shape_inference_works:
        def fail(*a, **k):
            raise RuntimeError("no shapes")
        monkeypatch.setattr(onnx.shape_inference, "infer_shapes", fail)
    layers = find_layers(GraphIndex(model))
    found = small_gemm.small_gemms(model, layers)
    assert set(found) == {"/head/Gemm", "/attn/MatMul", "/attn/MatMul_1"}, found
    assert found["/head/Gemm"].startswith("GEMV (output [1, 10]")
    assert found["/attn/MatMul"] == "small GEMM (K 8 below 16)"
    assert found["/attn/MatMul_1"] == "small GEMM (N 8 below 16)"
    wide = small_gemm.small_gemms(_narrow_vit(head_size=16), find_layers(GraphIndex(_narrow_vit(head_size=16))))
    assert set(wide) == {"/head/Gemm"}  # heads of 16 are INT8 MHA material: quantized


def _float_core_graph(on_purpose: bool) -> onnx.ModelProto:
    """``_narrow_vit`` with its attention core float (no Q/DQ) and, when ``on_purpose``, the quantizer's record of why."""
    model = _narrow_vit()
    if on_purpose:
        record = {"small_gemms": {"float": {"/attn/MatMul": "small GEMM (K 8 below 16)",
                                             "/attn/MatMul_1": "small GEMM (N 8 below 16)"}}}
        helper.set_model_props(model, {"vitedge.quantization": json.dumps(record)})
    return model


def test_a_float_attention_core_is_not_int8_mha_and_the_plan_says_fp16():
    [block] = attention_blocks(_float_core_graph(True))
    assert block.float_on_purpose == "small GEMM (K 8 below 16)"
    assert not (block.qk_quantized or block.pv_quantized)
    why = " ".join(block.int8_mha_blockers())
    assert "stay float on purpose" in why and "FP16" in why and "not as INT8 fused MHA" in why
    assert "head size 8 is not 16, 32 or 64" in why
    [row] = fusion_table([block])[2:]
    assert "| no | no |" in row and "[small GEMM (K 8 below 16)]" in row
    assert "stay float on purpose" in " ".join(fusion_warnings([block]))
    # a core float for another reason (the CPU graph, the accuracy budget) keeps the plain reason
    [other] = attention_blocks(_float_core_graph(False))
    assert other.float_on_purpose is None
    assert "no Q/DQ on both inputs (they run in float)" in " ".join(other.int8_mha_blockers())
