"""benchmarks/modelopt_placement.py without ModelOpt: its reading of roles and placement, and its switching of
vitedge's graph to another graph's choice, on small real ONNX graphs run in ONNX Runtime. The other graph is
written here the way ModelOpt 0.47.0 wrote the residual Adds of the corpus models (Q/DQ on the GEMM input of the
Add and on its output, which the LayerNorm reads) and the head (float)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def mp():
    spec = importlib.util.spec_from_file_location("modelopt_placement", ROOT / "benchmarks" / "modelopt_placement.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["modelopt_placement"] = mod
    spec.loader.exec_module(mod)
    return mod


RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 16)).astype(np.float32) * 0.3
HEAD = RNG.standard_normal((10, 16)).astype(np.float32) * 0.3
SMOOTH = np.linspace(0.5, 2.0, 16).astype(np.float32)  # a SmoothQuant factor per input channel of the head


def _graph(kind: str) -> onnx.ModelProto:
    """x -> fc (MatMul + bias via Identity) -> residual Add(x, fc) -> LayerNorm -> head Gemm. ``kind``: fp32; vitedge
    (fc and head INT8, the head's activation divided by SMOOTH and its weight multiplied by it, residual float);
    modelopt (fc INT8, Q/DQ on the Add's fc input and on its output, head float)."""
    nodes, inits = [], [numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.zeros(16, np.float32), "b0"),
                        numpy_helper.from_array(np.ones(16, np.float32), "gamma"), numpy_helper.from_array(HEAD, "head.weight"),
                        numpy_helper.from_array(np.zeros(10, np.float32), "head.bias")]

    def qdq(x, scale, tag):
        inits.extend([numpy_helper.from_array(np.float32(scale), f"{tag}_s"), numpy_helper.from_array(np.int8(0), f"{tag}_z")])
        nodes.extend([helper.make_node("QuantizeLinear", [x, f"{tag}_s", f"{tag}_z"], [f"{tag}_q"]),
                      helper.make_node("DequantizeLinear", [f"{tag}_q", f"{tag}_s", f"{tag}_z"], [f"{tag}_dq"])])
        return f"{tag}_dq"

    def int8_weight(w, tag, axis):
        scale = np.abs(w).max(axis=1 - axis) / 127
        q = np.round(w / scale.reshape((-1, 1) if axis == 0 else (1, -1))).astype(np.int8)
        inits.extend([numpy_helper.from_array(q, f"{tag}_w8"), numpy_helper.from_array(scale.astype(np.float32), f"{tag}_ws"),
                      numpy_helper.from_array(np.zeros(len(scale), np.int8), f"{tag}_wz")])
        nodes.append(helper.make_node("DequantizeLinear", [f"{tag}_w8", f"{tag}_ws", f"{tag}_wz"], [f"{tag}_wdq"], axis=axis))
        return f"{tag}_wdq"

    nodes.append(helper.make_node("Identity", ["b0"], ["b"], name="/shared_bias"))
    a, w = (qdq("x", 0.03, "x"), int8_weight(W, "fc", 1)) if kind != "fp32" else ("x", "w")
    nodes.append(helper.make_node("MatMul", [a, w], ["mm"], name="/fc/MatMul"))
    nodes.append(helper.make_node("Add", ["b", "mm"], ["fc"], name="/fc/Add"))
    branch = qdq("fc", 0.05, "fc_out") if kind == "modelopt" else "fc"
    nodes.append(helper.make_node("Add", ["x", branch], ["res"], name="/Add"))
    ln_in = qdq("res", 0.06, "res_out") if kind == "modelopt" else "res"
    nodes.append(helper.make_node("LayerNormalization", [ln_in, "gamma"], ["ln"], name="/norm/LayerNormalization", axis=-1))
    if kind == "vitedge":
        inits.append(numpy_helper.from_array(SMOOTH, "smooth"))
        nodes.append(helper.make_node("Div", ["ln", "smooth"], ["ln_s"], name="/norm/smooth"))
        a, w = qdq("ln_s", 0.02, "head_in"), int8_weight(HEAD * SMOOTH, "head", 0)
    else:
        a, w = "ln", "head.weight"
    nodes.append(helper.make_node("Gemm", [a, w, "head.bias"], ["logits"], name="/head/Gemm", transB=1))
    io = lambda n, d: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, d])  # noqa: E731
    return helper.make_model(helper.make_graph(nodes, kind, [io("x", 16)], [io("logits", 10)], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def _run(model, x):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_roles_and_placement_as_the_report_reads_them(mp):
    fp32, ours, theirs = _graph("fp32"), _graph("vitedge"), _graph("modelopt")
    roles = mp.roles(fp32.graph)
    # the bias Add reads an Identity of an initializer: a constant, not a residual Add
    assert roles == {"/fc/MatMul": "linear", "/Add": "residual_add", "/head/Gemm": "linear"}
    rows = {r["node"]: r for r in mp.compare(fp32, ours, theirs)}
    assert (rows["/Add"]["vitedge_in"], rows["/Add"]["modelopt_in"], rows["/Add"]["modelopt_out"]) == ("--", "-Q", "direct")
    assert (rows["/head/Gemm"]["vitedge_in"], rows["/head/Gemm"]["modelopt_in"]) == ("QQ", "--")
    assert rows["/fc/MatMul"]["same"] == "yes"


def test_switching_gives_theirs_placement_and_the_float_weight_back(mp):
    fp32, ours, theirs = _graph("fp32"), _graph("vitedge"), _graph("modelopt")
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    res, done = mp.switch_to_theirs(fp32, ours, theirs, {"/Add"})
    assert done == {"/Add", "/norm/LayerNormalization"}  # the Add's quantized output is read by the LayerNorm
    assert all(r["same"] == "yes" for r in mp.compare(fp32, res, theirs) if r["node"] == "/Add")
    head, _ = mp.switch_to_theirs(fp32, ours, theirs, {"/head/Gemm"})
    assert [r["same"] for r in mp.compare(fp32, head, theirs) if r["node"] == "/head/Gemm"] == ["yes"]
    both, _ = mp.switch_to_theirs(fp32, ours, theirs, {"/Add", "/head/Gemm"})
    # the float head is FP32's weight times the smoothing factor, which is estimated from vitedge's INT8 weight (to a
    # fraction of an INT8 step): with everything switched the graph computes nearly what ModelOpt's does
    gap = lambda g: float(np.abs(_run(g, x) - _run(theirs, x)).max())  # noqa: E731
    assert gap(both) < 0.01 and gap(both) < gap(ours) / 5 and gap(res) < gap(ours)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") and not any(
        o in {i for m in both.graph.node for i in m.input} for o in n.output) for n in both.graph.node)  # no dead Q/DQ
