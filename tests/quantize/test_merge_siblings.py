"""vitedge.quantize.merge on hand-made graphs: sibling linear layers become one GEMM whose columns are in the order
the attention reads them (q, k, v), computing what the separate layers computed; siblings that differ in having a
bias are left as they were, with the reason."""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vitedge.onnxkit.session import ort_session
from vitedge.quantize.merge import merge_sibling_linears

E = 8


def _attention(order=("v", "q", "k"), bias=(True, True, True)):
    """X [B, 5, E] -> v, q, k projections (in ``order``) -> softmax(q k^T) v -> Y."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for role, has_bias in zip(order, bias):
        inits.append(numpy_helper.from_array(rng.standard_normal((E, E)).astype(np.float32), f"W{role}"))
        out = role if not has_bias else f"{role}_mm"
        nodes.append(helper.make_node("MatMul", ["X", f"W{role}"], [out], name=f"{role}_proj"))
        if has_bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(E).astype(np.float32), f"b{role}"))
            nodes.append(helper.make_node("Add", [out, f"b{role}"], [role], name=f"{role}_bias"))
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["logits"]),
              helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["Y"])]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", 5, E])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["B", 5, E])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, x):
    return ort_session(model.SerializeToString()).run(None, {"X": x})[0]


def test_siblings_become_one_gemm_in_q_k_v_order_and_compute_the_same():
    model = _attention()
    merged = onnx.ModelProto()
    merged.CopyFrom(model)
    report = merge_sibling_linears(merged)
    assert (report.groups, report.merged, report.layers, report.skipped) == (1, 1, 3, ())
    ops = collections.Counter(n.op_type for n in merged.graph.node)
    assert ops["MatMul"] == 3 and ops["Add"] == 1 and ops["Split"] == 1  # one projection, Q.K^T, P.V
    split = next(n for n in merged.graph.node if n.op_type == "Split")
    assert list(split.output) == ["q", "k", "v"]  # the order the attention reads them, not the graph's (v, q, k)
    w = next(t for t in merged.graph.initializer if t.name.endswith("merged.weight"))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert np.array_equal(numpy_helper.to_array(w), np.concatenate([weights["Wq"], weights["Wk"], weights["Wv"]], axis=1))
    onnx.checker.check_model(merged)
    x = np.random.default_rng(1).standard_normal((3, 5, E)).astype(np.float32)
    ref, got = _run(model, x), _run(merged, x)
    assert float(np.max(np.abs(ref - got))) <= 1e-5 * float(np.max(np.abs(ref)))


def test_siblings_that_differ_in_a_bias_are_left_alone():
    model = _attention(bias=(True, False, True))
    before = model.SerializeToString()
    report = merge_sibling_linears(model)
    assert (report.groups, report.merged, report.layers) == (1, 0, 0)
    [reason] = report.skipped
    assert "differ" in reason and "bias" in reason
    assert model.SerializeToString() == before
