"""The onnx target's per-layer INT8 payoff (vitedge/backends/onnxruntime/layer_payoff.py, issue 47 item 2): which
groups of INT8 layers go float, decided from per-node figures at every promised batch size, and when the whole graph
with them float replaces the artifact. Figures are given, not timed: the decisions are deterministic."""

from __future__ import annotations

import pytest
from onnx import helper

from vitedge.backends.onnxruntime.layer_payoff import (LayerGroup, base_name, candidate_pays, choose_float, layer_groups,
                                                        sole_readers)


def _graph(nodes):
    return helper.make_model(helper.make_graph(nodes, "g", [], []))


def _mitf(name, x):
    return helper.make_node("MatMulIntegerToFloat", [x, f"{name}_w"], [f"{name}_y"], name=name, domain="com.microsoft")


def test_layers_reading_one_quantized_activation_form_one_group():
    """q, k and v read one QuantizeLinear: they go float together (only then does the quantization go away); fc2
    reads its own; a layer of the Q/DQ form (DequantizeLinear of an int8 weight into MatMul) counts too."""
    g = _graph([
        helper.make_node("QuantizeLinear", ["ln", "s", "z"], ["ln_q"], name="ln_quant"),
        _mitf("/b0/q/MatMul/with_bias", "ln_q"), _mitf("/b0/k/MatMul/with_bias", "ln_q"), _mitf("/b0/v/MatMul/with_bias", "ln_q"),
        helper.make_node("QuantizeLinear", ["h", "s", "z"], ["h_q"], name="h_quant"),
        helper.make_node("DequantizeLinear", ["h_q", "s", "z"], ["h_dq"], name="h_dequant"),
        helper.make_node("DequantizeLinear", ["w_q", "ws", "wz"], ["w_dq"], name="w_dequant"),
        helper.make_node("MatMul", ["h_dq", "w_dq"], ["y"], name="/b0/fc2/MatMul"),
        helper.make_node("MatMul", ["y", "attn"], ["y2"], name="/b0/attn/MatMul"),  # float: no DequantizeLinear weight
    ])
    groups = layer_groups(g)
    assert [gr.names for gr in groups] == [("/b0/q/MatMul", "/b0/k/MatMul", "/b0/v/MatMul"), ("/b0/fc2/MatMul",)]
    assert [gr.quantize for gr in groups] == ["ln_quant", "h_quant"]
    assert sole_readers(g)["h_quant"] == {"/b0/fc2/MatMul"}


@pytest.mark.parametrize("name, base", [("/a/MatMul/with_bias", "/a/MatMul"), ("/h/Gemm/gemm_with_bias_t", "/h/Gemm"),
                                        ("/p/Conv/as_gemm", "/p/Conv"), ("/a/MatMul", "/a/MatMul")])
def test_base_names_are_the_qdq_graphs(name, base):
    assert base_name(name) == base


def _figures(int8_b1, int8_b8, q_b1=0.0, q_b8=0.0):
    """One group (one layer reading quantize node q) in a graph whose FP32 total is 1000 us at b1, 8000 at b8, with
    the layer's FP32 time 100 / 800 us."""
    group = LayerGroup(("/fc/MatMul/with_bias",), "q")
    int8 = {1: {"/fc/MatMul/with_bias": int8_b1, "q": q_b1}, 8: {"/fc/MatMul/with_bias": int8_b8, "q": q_b8}}
    fp32 = {1: {"/fc/MatMul": 100.0, "rest": 900.0}, 8: {"/fc/MatMul": 800.0, "rest": 7200.0}}
    return [group], int8, fp32, {"q": {"/fc/MatMul/with_bias"}}


@pytest.mark.parametrize("figures, to_float", [
    (_figures(150, 1000), True),   # loses at both batch sizes
    (_figures(60, 400), False),    # wins at both
    (_figures(200, 700), True),    # loses 10 points of the b1 ratio, wins 1.25 at b8: the sum drops
    (_figures(110, 500), False),   # loses 1 point at b1, wins 3.75 at b8: kept INT8
    (_figures(90, 750, q_b1=20, q_b8=100), True),  # the kernel wins, its input's quantization makes it lose
])
def test_a_group_goes_float_when_that_lowers_the_promised_ratios_summed(figures, to_float):
    [v] = choose_float(*figures)
    assert v.to_float is to_float
    assert (v.gain > 0) is to_float


def test_a_shared_quantization_is_not_counted_for_one_of_its_readers():
    groups, int8, fp32, _ = _figures(90, 750, q_b1=20, q_b8=100)
    [v] = choose_float(groups, int8, fp32, {"q": {"/fc/MatMul/with_bias", "/other/Add"}})
    assert v.int8_us == {1: 90, 8: 750} and v.to_float is False


def test_a_group_without_figures_on_both_sides_is_not_decided():
    groups, int8, fp32, readers = _figures(500, 5000)
    del fp32[8]["/fc/MatMul"]
    assert choose_float(groups, int8, fp32, readers) == []


@pytest.mark.parametrize("current, candidate, control, taken", [
    ({1: 1.0, 8: 0.9}, {1: 0.8, 8: 0.85}, {1: 1.02, 8: 0.99}, True),
    ({1: 1.0, 8: 0.9}, {1: 0.98, 8: 0.89}, {1: 1.02, 8: 0.99}, False),  # better by less than the control moved
    ({1: 1.0, 8: 0.7}, {1: 0.6, 8: 0.8}, {1: 1.01, 8: 1.01}, False),    # better on the mean, slower at b8
])
def test_the_candidate_replaces_the_artifact_only_when_the_whole_graph_is_faster(current, candidate, control, taken):
    assert candidate_pays({"current": current, "candidate": candidate, "control": control})[0] is taken


def _bias_graph():
    """fc: MatMul then Add of a constant bias (what ONNX Runtime leaves of a float Linear on tokens); res: a residual Add
    of two activations; shared: a MatMul whose output two nodes read (its Add is no bias of it alone)."""
    from onnx import TensorProto, numpy_helper
    import numpy as np

    inits = [numpy_helper.from_array(np.zeros((4, 4), np.float32), n) for n in ("w", "w2")]
    inits += [numpy_helper.from_array(np.zeros(4, np.float32), n) for n in ("b", "b2")]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["fc_mm"], name="/fc/MatMul"),
        helper.make_node("Add", ["b", "fc_mm"], ["fc_y"], name="/fc/Add"),
        helper.make_node("Add", ["fc_y", "x"], ["res_y"], name="/res/Add"),
        helper.make_node("MatMul", ["res_y", "w2"], ["sh_mm"], name="/shared/MatMul"),
        helper.make_node("Add", ["sh_mm", "b2"], ["sh_y"], name="/shared/Add"),
        helper.make_node("Relu", ["sh_mm"], ["sh_r"], name="/shared/Relu"),
        helper.make_node("Add", ["sh_y", "sh_r"], ["y"], name="/out/Add"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 4])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])


def test_a_float_gemms_bias_add_counts_as_the_gemms_time():
    """ONNX Runtime adds a float MatMul's bias on tokens in its own Add, while the INT8 layer holds its bias: the FP32
    layer's time is both; a residual Add and the Add after a MatMul something else also reads are not biases."""
    from vitedge.backends.onnxruntime.layer_payoff import bias_adds, with_bias_adds

    adds = bias_adds(_bias_graph())
    assert adds == {"/fc/Add": "/fc/MatMul"}
    times = {"/fc/MatMul": 100.0, "/fc/Add": 30.0, "/res/Add": 20.0, "/shared/MatMul": 50.0, "/shared/Add": 10.0}
    folded = with_bias_adds(times, adds)
    assert folded == {"/fc/MatMul": 130.0, "/res/Add": 20.0, "/shared/MatMul": 50.0, "/shared/Add": 10.0}
    assert sum(folded.values()) == sum(times.values())


def test_a_layer_whose_int8_beats_its_matmul_and_bias_stays_int8():
    """INT8 with its bias 110 us against FP32 MatMul 100 us + bias Add 30 us at both batch sizes: compared with the
    MatMul alone it would go float; with its bias it wins and stays INT8."""
    from vitedge.backends.onnxruntime.layer_payoff import with_bias_adds

    group = LayerGroup(("/fc/MatMul/with_bias",), "q")
    int8 = {b: {"/fc/MatMul/with_bias": 110.0, "q": 0.0} for b in (1, 8)}
    fp32 = {b: {"/fc/MatMul": 100.0, "/fc/Add": 30.0, "rest": 870.0} for b in (1, 8)}
    readers = {"q": {"/fc/MatMul/with_bias"}}
    [alone] = choose_float([group], int8, fp32, readers)
    assert alone.to_float is True
    folded = {b: with_bias_adds(fp32[b], {"/fc/Add": "/fc/MatMul"}) for b in fp32}
    [v] = choose_float([group], int8, folded, readers)
    assert v.to_float is False and v.fp32_us == {1: 130.0, 8: 130.0}


def test_two_graphs_are_profiled_side_by_side_node_by_node(tmp_path):
    """Both graphs' nodes get a figure from one alternating profile (names of the graph ONNX Runtime runs)."""
    import onnx

    from vitedge.backends.onnxruntime.layer_payoff import node_times_side_by_side, optimized_graph

    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(_bias_graph(), str(a))
    g = _bias_graph()
    g.graph.node[2].op_type = "Sub"
    onnx.save(g, str(b))
    ta, tb = node_times_side_by_side((a, b), batch=2, runs=5, seconds=2.0)
    assert set(ta) == {n.name for n in optimized_graph(a).graph.node}
    assert set(tb) == {n.name for n in optimized_graph(b).graph.node}
    assert all(v >= 0 for v in (*ta.values(), *tb.values()))
