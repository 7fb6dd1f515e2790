"""ONNX Runtime-only float fusion for the `onnx` target (vitedge.backends.ort_fusions): the q/k/v bias folded into
MultiHeadAttention; the rewritten graph computes what it computed before, on ONNX Runtime, and ONNX Runtime keeps it."""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vitedge.backends.ort_fusions import MS_DOMAIN, fuse_float_ops
from vitedge.onnxutil import SessionSettings, ort_session

E = 8


def _init(name, shape, seed):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _qkv_attention():
    """x -> MatMul -> Add(bias, .) -> Split -> MultiHeadAttention (2 heads), as fuse_attention writes it."""
    inits = [_init("w", [E, 3 * E], 1), _init("bias", [3 * E], 2),
             numpy_helper.from_array(np.array([E, E, E], np.int64), "sizes")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["qkv0"]), helper.make_node("Add", ["bias", "qkv0"], ["qkv"]),
             helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=-1),
             helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain=MS_DOMAIN, num_heads=2)]
    graph = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, E])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, E])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)])


def _run(model, x):
    sess = ort_session(model.SerializeToString(), threads=1)
    return sess.run(None, {"x": x})[0]


def _fused(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m, fuse_float_ops(m)


def _assert_same(a, b, tol=1e-5):
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 5, E)).astype(np.float32)
        ref, got = _run(a, x), _run(b, x)
        assert float(np.max(np.abs(ref))) > 0
        assert float(np.max(np.abs(got - ref))) <= tol * float(np.max(np.abs(ref))), f"batch {batch}"


def test_qkv_bias_moves_into_multiheadattention():
    model = _qkv_attention()
    fused, report = _fused(model)
    assert report.qkv_biases == 1 and report.to_dict() == {"qkv_biases": 1, "skipped": []}
    assert "1 q/k/v biases" in report.one_line()
    mha = next(n for n in fused.graph.node if n.op_type == "MultiHeadAttention")
    assert list(mha.input)[3] == "bias" and not any(n.op_type == "Add" for n in fused.graph.node)
    _assert_same(model, fused)


def test_quantized_qkv_keeps_its_qdq_and_onnxruntime_keeps_the_bias_in_multiheadattention(tmp_path):
    """With Q/DQ in front of the projection (as vitedge ships it) the rewrite still applies (checked on the graph with
    its activation Q/DQ bypassed), and ONNX Runtime's own optimiser keeps MultiHeadAttention with the bias: no Add
    is left in the graph it runs."""
    model = _qkv_attention()
    g = model.graph
    g.initializer.extend([numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")])
    g.node[0].input[0] = "xd"
    g.node.insert(0, helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]))
    g.node.insert(0, helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]))
    fused, report = _fused(model)
    assert report.qkv_biases == 1 and report.skipped == ()
    out = tmp_path / "optimized.onnx"
    ort_session(fused.SerializeToString(), SessionSettings(optimized_model_path=out))
    optimized = collections.Counter(n.op_type for n in onnx.load(str(out)).graph.node)
    assert optimized["MultiHeadAttention"] == 1 and optimized["Add"] == 0, optimized


def test_a_bias_read_elsewhere_stays_where_it_is():
    """The biased q/k/v tensor is also a graph output: folding the Add would lose it."""
    model = _qkv_attention()
    model.graph.output.append(helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["N", 5, 3 * E]))
    fused, report = _fused(model)
    assert report.qkv_biases == 0 and fused.SerializeToString() == model.SerializeToString()
