"""ONNX Runtime-only float fusions for the `onnx` target (vitedge.backends.ort_fusions): residual Add (+ projection
bias) + LayerNormalization -> SkipLayerNormalization with the sum kept for its other readers, and the q/k/v bias
folded into MultiHeadAttention; the rewritten graph computes what it computed before, on ONNX Runtime."""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vitedge.backends.ort_fusions import MS_DOMAIN, fuse_float_ops
from vitedge.onnxutil import ort_session

E = 8


def _init(name, shape, seed):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _prenorm_block(quantized: bool):
    """x -> LN1 -> [Q/DQ] -> MatMul -> Add(bias, .) -> Add(x, .) = r1 -> LN2 -> MatMul -> Add(., bias) -> Add(r1, .) = r2 -> LN3.

    r1 feeds LN2 and the next residual Add (the pattern ONNX Runtime's own SkipLayerNormFusion refuses); the two
    projection biases sit on either side of their Add."""
    nodes, inits = [], [_init(n, s, i) for i, (n, s) in enumerate(
        [("g1", [E]), ("b1", [E]), ("w1", [E, E]), ("bias1", [E]), ("g2", [E]), ("b2", [E]), ("w2", [E, E]), ("bias2", [E]),
         ("g3", [E]), ("b3", [E])])]
    nodes.append(helper.make_node("LayerNormalization", ["x", "g1", "b1"], ["h"], axis=-1, epsilon=1e-6))
    src = "h"
    if quantized:
        inits += [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")]
        nodes += [helper.make_node("QuantizeLinear", ["h", "s", "z"], ["hq"]), helper.make_node("DequantizeLinear", ["hq", "s", "z"], ["hd"])]
        src = "hd"
    nodes += [helper.make_node("MatMul", [src, "w1"], ["p"]), helper.make_node("Add", ["bias1", "p"], ["pb"]),
              helper.make_node("Add", ["x", "pb"], ["r1"]),
              helper.make_node("LayerNormalization", ["r1", "g2", "b2"], ["n2"], axis=-1, epsilon=1e-6),
              helper.make_node("MatMul", ["n2", "w2"], ["m"]), helper.make_node("Add", ["m", "bias2"], ["mb"]),
              helper.make_node("Add", ["r1", "mb"], ["r2"]),
              helper.make_node("LayerNormalization", ["r2", "g3", "b3"], ["y"], axis=-1, epsilon=1e-6)]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, E])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, E])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


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


def test_residual_adds_and_biases_become_skip_layernorm_and_compute_the_same():
    model = _prenorm_block(quantized=False)
    fused, report = _fused(model)
    ops = collections.Counter(n.op_type for n in fused.graph.node)
    # LN1 reads the graph input, not an Add: it stays; LN2 and LN3 take their residual Add and its bias
    assert (report.skip_layernorm, report.layernorms, report.biases_folded) == (2, 3, 2), report
    assert ops["SkipLayerNormalization"] == 2 and ops["LayerNormalization"] == 1 and ops["Add"] == 0
    skip = [n for n in fused.graph.node if n.op_type == "SkipLayerNormalization"]
    assert all(n.domain == MS_DOMAIN for n in skip) and MS_DOMAIN in {o.domain for o in fused.opset_import}
    # r1 is still read by the second residual sum: the first SkipLayerNormalization hands it on as its 4th output
    assert sorted(list(n.output)[3] for n in skip) == ["", "r1"]
    _assert_same(model, fused)
    assert "2 of 3 LayerNorms" in report.one_line() and report.to_dict()["biases_folded"] == 2


def test_quantized_graph_keeps_its_qdq_and_onnxruntime_keeps_the_fused_nodes(tmp_path):
    model = _prenorm_block(quantized=True)
    fused, report = _fused(model)
    assert report.skip_layernorm == 2 and report.skipped == ()
    ops = collections.Counter(n.op_type for n in fused.graph.node)
    assert ops["QuantizeLinear"] == ops["DequantizeLinear"] == 1
    out = tmp_path / "optimized.onnx"
    from vitedge.onnxutil import SessionSettings

    ort_session(fused.SerializeToString(), SessionSettings(optimized_model_path=out))
    optimized = collections.Counter(n.op_type for n in onnx.load(str(out)).graph.node)
    assert optimized["SkipLayerNormalization"] == 2 and optimized["Add"] == 0, optimized


def test_qkv_bias_moves_into_multiheadattention():
    model = _qkv_attention()
    fused, report = _fused(model)
    assert report.qkv_biases == 1 and report.skip_layernorm == 0
    mha = next(n for n in fused.graph.node if n.op_type == "MultiHeadAttention")
    assert list(mha.input)[3] == "bias" and not any(n.op_type == "Add" for n in fused.graph.node)
    _assert_same(model, fused)


def test_a_layernorm_over_another_axis_is_left_alone():
    model = _prenorm_block(quantized=False)
    for n in model.graph.node:
        if n.op_type == "LayerNormalization" and n.input[0] == "r1":
            next(a for a in n.attribute if a.name == "axis").i = 1  # over tokens and channels: not SkipLayerNormalization's
    fused, report = _fused(model)
    assert report.skip_layernorm == 1  # only the final norm (axis -1)
    assert collections.Counter(n.op_type for n in fused.graph.node)["LayerNormalization"] == 2
    _assert_same(model, fused)
