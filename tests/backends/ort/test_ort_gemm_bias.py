"""GEMM bias fusion for the `onnx` target (vitedge.backends.onnxruntime.gemm_bias): every INT8 GEMM's projection bias
ends up inside ONNX Runtime's MatMulIntegerToFloat, so the graph ORT really runs has no bias Add left, and
computes what the unfused graph computes; GEMMs that do not qualify are left as they were, with a reason."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from conftest import CALIB_DIR
from onnx import TensorProto, helper, numpy_helper

from vitedge.backends.onnxruntime.attention import fuse_attention
from vitedge.backends.onnxruntime.gemm_bias import MS_DOMAIN, fuse_gemm_bias, unfold_gemm_bias
from vitedge.onnxkit.session import SessionSettings, ort_session


@pytest.fixture(scope="module")
def qdq_timm(timm_qdq):
    """(the Q/DQ graph of the 2-block timm ViT with its attention fused, as the onnx target builds it, its depth)."""
    model, depth = _copy(timm_qdq[0]), timm_qdq[1]
    assert fuse_attention(model).fused == depth
    return model, depth


def _copy(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _optimized_ops(model, tmp_path, name):
    """Op type -> count in the graph ONNX Runtime optimized for this CPU (what it really runs)."""
    out = tmp_path / f"{name}.optimized.onnx"
    ort_session(model.SerializeToString(), SessionSettings(optimized_model_path=out))
    g = onnx.load(str(out)).graph
    return collections.Counter(n.op_type for n in g.node), [n for n in g.node if n.op_type == "MatMulIntegerToFloat"]


def _run(model, x):
    sess = ort_session(model.SerializeToString(), threads=2)
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


@pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")
def test_every_gemm_bias_folds_and_ort_runs_no_bias_add(qdq_timm, tmp_path):
    plain, depth = qdq_timm
    fused = _copy(plain)
    report = fuse_gemm_bias(fused)
    # per block: q/k/v, attention projection, fc1, fc2; and the head, a Gemm with a float bias (ORT ran it in float)
    n = 4 * depth + 1
    assert (report.gemms, report.folded, report.skipped) == (n, n, ())
    assert f"{n} of {n} INT8 GEMMs" in report.one_line()
    onnx.checker.check_model(fused)
    assert MS_DOMAIN in {o.domain for o in fused.opset_import}

    before, before_gemms = _optimized_ops(plain, tmp_path, "plain")
    after, after_gemms = _optimized_ops(fused, tmp_path, "fused")
    # ORT makes every one a MatMulIntegerToFloat either way; only with the fusion does each carry its bias
    assert len(before_gemms) == 4 * depth and len(after_gemms) == n
    assert not [n for n in before_gemms if len(n.input) > 6 and n.input[6]]
    assert all(len(n.input) == 7 and n.input[6] for n in after_gemms)
    # ORT's own graph: the 3 bias Adds per block it left (q/k/v, projection, fc2) are gone; fc1's bias, which ORT
    # had put into BiasGelu, is in the GEMM too, and the GELU stays one fused node
    assert before["Add"] - after["Add"] == 3 * depth, (before, after)
    assert (before["BiasGelu"], after["BiasGelu"], after["Gelu"]) == (depth, 0, depth)
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal((b, 3, 32, 32)).astype(np.float32)
        ref, got = _run(plain, x), _run(fused, x)
        peak = float(np.max(np.abs(ref)))
        assert peak > 0 and got.shape == ref.shape
        assert float(np.max(np.abs(got - ref))) <= 1e-5 * peak, f"batch {b}"
        assert (got.argmax(-1) == ref.argmax(-1)).all()
    assert fuse_gemm_bias(fused).gemms == 0  # nothing left to find


@pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")
def test_unfold_gives_back_the_qdq_layers_under_their_names(qdq_timm):
    """Per-layer sensitivity finds INT8 layers as DequantizeLinear -> MatMul by node name: the unfolded graph has
    every one of them again, and computes what the folded one computes."""
    plain, depth = qdq_timm
    fused = _copy(plain)
    fuse_gemm_bias(fused)
    back = _copy(fused)
    assert unfold_gemm_bias(back) == 4 * depth + 1  # and the head's Gemm
    assert not [n for n in back.graph.node if n.op_type == "MatMulIntegerToFloat"]

    def dq_matmuls(m):
        prod = {o: n for n in m.graph.node for o in n.output}
        return sorted(n.name for n in m.graph.node if n.op_type == "MatMul" and all(
            prod.get(i) is not None and prod[i].op_type == "DequantizeLinear" for i in n.input))

    assert dq_matmuls(back) == dq_matmuls(plain) and len(dq_matmuls(plain)) == 4 * depth

    def dq_gemms(m):
        prod = {o: n for n in m.graph.node for o in n.output}
        return sorted((n.name, [a.i for a in n.attribute if a.name == "transB"][0]) for n in m.graph.node if n.op_type == "Gemm"
                      and all(prod.get(i) is not None and prod[i].op_type == "DequantizeLinear" for i in n.input[:2]))

    assert dq_gemms(back) == dq_gemms(plain) and len(dq_gemms(plain)) == 1
    x = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)
    ref, got = _run(fused, x), _run(back, x)
    assert float(np.max(np.abs(got - ref))) <= 1e-5 * float(np.max(np.abs(ref)))


@pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")
def test_bias_before_gelu_can_be_left_to_biasgelu(qdq_timm):
    plain, depth = qdq_timm
    fused = _copy(plain)
    report = fuse_gemm_bias(fused, before_gelu=False)
    assert (report.gemms, report.folded) == (4 * depth + 1, 3 * depth + 1)
    assert len(report.skipped) == depth and all("BiasGelu" in r and "/mlp/fc1/" in r for r in report.skipped)


def _hand_made(*, bias_dims=(4,), extra_reader=False, act_type=TensorProto.INT8, shared_dq=False):
    """x -> Q -> DQ, W_q -> DQ, MatMul, Add(bias, mm) -> y (and the MatMul's output as a second graph output)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.integers(-127, 128, (8, 4)).astype(np.int8), "w_q"),
        numpy_helper.from_array(np.full(4, 0.02, np.float32), "w_s"),
        numpy_helper.from_array(np.zeros(4, np.int8), "w_z"),
        numpy_helper.from_array(np.array(0.05, np.float32), "x_s"),
        numpy_helper.from_array(np.array(0, np.int8 if act_type == TensorProto.INT8 else np.int16), "x_z"),
        numpy_helper.from_array(rng.standard_normal(bias_dims).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w_dq"], axis=1),
        helper.make_node("MatMul", ["x_dq", "w_dq"], ["mm"], name="mm"),
        helper.make_node("Add", ["bias", "mm"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("mm", TensorProto.FLOAT, None))
    if shared_dq:  # the dequantized activation read by something else too: ORT keeps such a MatMul float
        nodes.append(helper.make_node("Relu", ["x_dq"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_hand_made_gemm_folds_with_bias_first():
    """The exporter writes Add(bias, x): that order folds, and the result matches the plain graph."""
    model = _hand_made()
    fused = _copy(model)
    assert fuse_gemm_bias(fused).folded == 1
    assert [n.op_type for n in fused.graph.node] == ["QuantizeLinear", "MatMulIntegerToFloat"]
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    ref, got = _run(model, x), _run(fused, x)
    assert float(np.max(np.abs(ref))) > 0 and float(np.max(np.abs(got - ref))) <= 1e-6 * float(np.max(np.abs(ref)))


@pytest.mark.parametrize("kind, reason", [
    ("extra_reader", "not read by one Add alone"),
    ("wide_bias", "constant float bias of the GEMM's width"),
    ("int16", "not per-tensor 8-bit"),
    ("shared_dq", "DequantizeLinear output has other readers"),
])
def test_gemms_that_do_not_qualify_are_left_alone(kind, reason):
    model = {"extra_reader": lambda: _hand_made(extra_reader=True), "wide_bias": lambda: _hand_made(bias_dims=(3, 4)),
             "int16": lambda: _hand_made(act_type=TensorProto.INT16), "shared_dq": lambda: _hand_made(shared_dq=True)}[kind]()
    fused = _copy(model)
    report = fuse_gemm_bias(fused)
    assert (report.gemms, report.folded) == (1, 0)
    assert report.skipped[0].startswith("mm: ") and reason in report.skipped[0]
    assert fused == model
