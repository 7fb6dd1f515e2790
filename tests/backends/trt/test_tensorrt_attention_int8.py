"""INT8 attention for the NVIDIA targets: their Q/DQ graph quantizes both inputs of Q.K^T and P.V
(the accuracy budget returns any that costs accuracy to float, matmul by matmul), the CPU targets'
graph keeps them float, and the bundle says per block whether TensorRT's fused-MHA rules allow
INT8 fusion and why not."""

from __future__ import annotations

import onnx
import pytest

from vitedge.backends.tensorrt.attention import AttentionBlock, attention_blocks, fusion_table
from vitedge.bundle.manifest import read_manifest
from vitedge.targets.profiles import load_profile


@pytest.mark.parametrize("name", ["jetson-orin", "jetson-orin-nx", "jetson-orin-nano", "desktop-gpu", "jetson", "nvidia-gpu"])
def test_nvidia_profiles_quantize_attention_and_cpu_profiles_do_not(name):
    assert load_profile(name).quantization.get("quantize_attention") is True
    for cpu in ("onnx", "intel-cpu", "intel-cpu-vnni"):
        assert not load_profile(cpu).quantization.get("quantize_attention", False)


def test_nvidia_graph_has_int8_attention_where_the_budget_allows_and_the_cpu_graph_keeps_it_float(example_bundles):
    root = example_bundles[0]
    jetson, cpu = read_manifest(root / "jetson"), read_manifest(root / "intel-cpu")
    assert jetson.quantization.config["quantize_attention"] is True
    assert cpu.quantization.config["quantize_attention"] is False
    assert jetson.quantization.qdq_sha256 != cpu.quantization.qdq_sha256  # a separate NVIDIA graph, validated by its own budget
    blocks = attention_blocks(onnx.load(str(root / "jetson" / "model.int8.onnx")))
    kept = set(jetson.quantization.kept_float)
    assert len(blocks) == 6
    for b in blocks:  # Q/DQ on both inputs of each matmul the budget did not return to float
        assert b.qk_quantized == (b.qk_matmul not in kept) and b.pv_quantized == (b.pv_matmul not in kept), b
    assert any(b.qk_quantized and b.pv_quantized for b in blocks)
    cpu_blocks = attention_blocks(onnx.load(str(root / "intel-cpu" / "model.int8.onnx")))
    assert len(cpu_blocks) == 6 and not any(b.qk_quantized or b.pv_quantized for b in cpu_blocks)

    recorded = jetson.backend_info["attention"]["blocks"]  # the family bundle records them too
    assert [AttentionBlock(**b) for b in recorded] == blocks
    report = (root / "jetson" / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| `/blocks/blocks.")]
    assert len(rows) == len(blocks)
    for b, row in zip(blocks, rows):
        assert row.startswith(f"| `{b.scope}` | {b.heads} | {b.tokens} | {b.head_size} |")
        assert ("no: " not in row) == (not b.int8_mha_blockers())


def test_fusion_table_says_per_block_whether_and_why_not():
    def block(i, *, heads=12, tokens=197, head_size=64, qk=True, pv=True, out="direct"):
        return AttentionBlock(scope=f"/blocks.{i}/attn/", softmax="s", qk_matmul="qk", pv_matmul="pv", heads=heads,
                              tokens=tokens, head_size=head_size, qk_quantized=qk, pv_quantized=pv, pv_output_qdq=out)

    rows = fusion_table([block(0), block(1, pv=False), block(2, tokens=577), block(3, head_size=48), block(4, tokens=None),
                         block(5, out="none"), block(6, out="after_shape_ops")])[2:]
    assert rows[0].endswith("| yes | yes | on its output | allowed by the rules (the engine inspector confirms it on the device) |")
    assert "| yes | no | on its output | no: its attention matmuls have no Q/DQ on both inputs (they run in float) |" in rows[1]
    assert "| no | no: no Q/DQ after its P.V matmul" in rows[5]
    assert "| after Transpose+Reshape | only if TensorRT moves the Q/DQ after P.V back" in rows[6]
    assert "no: 577 tokens is more than 512" in rows[2]
    assert "no: head size 48 is not 16, 32 or 64" in rows[3]
    assert "| ? |" in rows[4] and "allowed as far as the graph shows (token count not inferred" in rows[4]
    assert fusion_table([]) == []


def _attention_graph(after_pv: str, scale_op: str | None = None) -> onnx.ModelProto:
    """One attention core, every matmul input behind Q/DQ; after P.V: a Q/DQ on its output ("direct"), one behind
    Transpose+Reshape on the output projection's input ("after_shape_ops", vitedge's graph), or none."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z"),
                        numpy_helper.from_array(np.array([1, 8, 64], np.int64), "shape"),
                        numpy_helper.from_array(np.zeros((64, 64), np.float32), "w")]

    def qdq(x):
        nodes.extend([helper.make_node("QuantizeLinear", [x, "s", "z"], [x + "_q"]), helper.make_node("DequantizeLinear", [x + "_q", "s", "z"], [x + "_dq"])])
        return x + "_dq"

    nodes.append(helper.make_node("MatMul", [qdq("q"), qdq("k")], ["scores"], name="/attn/qk"))
    if scale_op is not None:  # the scores scaled after Q.K^T, by a constant
        inits.append(numpy_helper.from_array(np.float32(32 ** -0.5 if scale_op == "Mul" else 32 ** 0.5), "scale"))
        nodes.append(helper.make_node(scale_op, ["scores", "scale"], ["scaled"], name="/attn/scale"))
    nodes.append(helper.make_node("Softmax", ["scaled" if scale_op else "scores"], ["p"], name="/attn/softmax", axis=-1))
    nodes.append(helper.make_node("MatMul", [qdq("p"), qdq("v")], ["pv"], name="/attn/pv"))
    x = qdq("pv") if after_pv == "direct" else "pv"
    nodes.append(helper.make_node("Transpose", [x], ["t"], perm=[0, 2, 1, 3]))
    nodes.append(helper.make_node("Reshape", ["t", "shape"], ["r"]))
    nodes.append(helper.make_node("MatMul", [qdq("r") if after_pv == "after_shape_ops" else "r", "w"], ["out"], name="/attn/proj"))
    io = lambda n, shape: helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
    graph = helper.make_graph(nodes, "attn", [io("q", [1, 2, 8, 32]), io("k", [1, 2, 32, 8]), io("v", [1, 2, 8, 32])],
                              [io("out", [1, 8, 64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("after_pv, blocked, relies", [("direct", False, False), ("after_shape_ops", False, True), ("none", True, False)])
def test_mha_check_covers_the_qdq_after_the_second_matmul(after_pv, blocked, relies):
    """TensorRT's INT8 MHA fusion wants Q/DQ before Q.K^T, after the softmax and after P.V. Before this check, a graph with
    no Q/DQ after P.V passed as fusable; one whose Q/DQ sits after Transpose+Reshape (vitedge's) now says it relies on
    TensorRT moving it back, which no GPU has shown here."""
    from vitedge.backends.tensorrt.attention import fusion_warnings

    [block] = attention_blocks(_attention_graph(after_pv))
    assert block.qk_quantized and block.pv_quantized and block.pv_output_qdq == after_pv
    assert bool(block.int8_mha_blockers()) == blocked
    warnings = " ".join(fusion_warnings([block]))
    assert ("no Q/DQ after its P.V matmul" in warnings) == blocked
    assert ("relies on TensorRT moving the Q/DQ after P.V back across Transpose+Reshape" in warnings) == relies


@pytest.mark.parametrize("scale_op", ["Mul", "Div"])
def test_an_attention_core_scaled_after_q_kt_is_checked_too(scale_op):
    """Models that scale the scores (MatMul -> Mul/Div by a constant -> Softmax; three corpus models do) had no block at
    all in the check: the plan, the warnings and the device run's promise check saw no attention to fuse."""
    [block] = attention_blocks(_attention_graph("direct", scale_op))
    assert block.qk_matmul == "/attn/qk" and block.pv_matmul == "/attn/pv" and block.qk_quantized and block.pv_quantized
    assert block.head_size == 32 and block.tokens == 8 and not block.int8_mha_blockers()
