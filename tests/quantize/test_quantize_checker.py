"""The TensorRT explicit-quantization rules checker on good graphs and deliberately broken ones."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers.quantize_models import fp32_model, graph_io, source_for


@functools.lru_cache(maxsize=None)
def _good(tmp: str = "") -> bytes:
    import tempfile

    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    path, spec = fp32_model("timm")
    with tempfile.TemporaryDirectory() as cache:
        cal = calibrate(path, source_for(spec, limit=8), QuantConfig(method="minmax", quantize_attention=True), cache_dir=cache)
    return build_qdq(cal).model.SerializeToString()


def good():
    import onnx

    return onnx.load_from_string(_good())


def rules(model) -> set[str]:
    from vitedge.quantize import check_qdq_graph

    return {v.rule for v in check_qdq_graph(model)}


def init(model, name):
    return next(t for t in model.graph.initializer if t.name == name)


def set_init(model, name, value: np.ndarray):
    from onnx import numpy_helper

    t = init(model, name)
    t.CopyFrom(numpy_helper.from_array(value, name))


def first(model, op_type, pred=lambda n: True):
    return next(n for n in model.graph.node if n.op_type == op_type and pred(n))


def activation_q(model):
    inits = {t.name for t in model.graph.initializer}
    return first(model, "QuantizeLinear", lambda n: n.input[0] not in inits)


def weight_dq(model, consumer_op="MatMul"):
    inits = {t.name for t in model.graph.initializer}
    _, consumers = graph_io(model)
    return first(model, "DequantizeLinear",
                 lambda n: n.input[0] in inits and any(c.op_type == consumer_op for c in consumers[n.output[0]]))


def insert_qdq(model, tensor: str, consumer, scale=0.05):
    """Put a Q/DQ pair on ``consumer``'s input ``tensor``."""
    from onnx import helper, numpy_helper

    g = model.graph
    g.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), "bad_scale"),
                          numpy_helper.from_array(np.array(0, np.int8), "bad_zp")])
    q = helper.make_node("QuantizeLinear", [tensor, "bad_scale", "bad_zp"], ["bad_q"], name="bad_Q")
    dq = helper.make_node("DequantizeLinear", ["bad_q", "bad_scale", "bad_zp"], ["bad_dq"], name="bad_DQ")
    consumer.input[list(consumer.input).index(tensor)] = "bad_dq"
    nodes = list(g.node)
    at = nodes.index(consumer)
    del g.node[:]
    g.node.extend(nodes[:at] + [q, dq] + nodes[at:])


def test_vitedge_graph_passes():
    from vitedge.quantize import assert_qdq_graph, check_qdq_graph

    m = good()
    assert check_qdq_graph(m) == []
    assert_qdq_graph(m)


def test_non_zero_zero_point():
    m = good()
    q = activation_q(m)
    set_init(m, q.input[2], np.array(3, np.int8))
    assert "zero_point" in rules(m)


def test_uint8_activation():
    m = good()
    q = activation_q(m)
    set_init(m, q.input[2], np.array(128, np.uint8))
    assert {"int8", "zero_point"} <= rules(m)


def test_q_without_zero_point_is_uint8():
    m = good()
    q = activation_q(m)
    del q.input[2]
    assert "int8" in rules(m)


def test_uint8_weights():
    m = good()
    dq = weight_dq(m)
    w = init(m, dq.input[0])
    from onnx import numpy_helper

    set_init(m, dq.input[0], (numpy_helper.to_array(w).astype(np.int16) + 128).astype(np.uint8))
    zp = numpy_helper.to_array(init(m, dq.input[2]))
    set_init(m, dq.input[2], np.full(zp.shape, 128, np.uint8))
    assert {"int8", "zero_point"} <= rules(m)


def test_wrong_per_channel_axis():
    m = good()
    dq = weight_dq(m, "MatMul")
    next(a for a in dq.attribute if a.name == "axis").i = 0
    found = rules(m)
    assert "axis" in found


def test_wrong_axis_on_gemm_with_transB():
    m = good()
    dq = weight_dq(m, "Gemm")
    next(a for a in dq.attribute if a.name == "axis").i = 1
    assert "axis" in rules(m)


def test_per_channel_scale_of_wrong_length():
    m = good()
    dq = weight_dq(m)
    from onnx import numpy_helper

    s = numpy_helper.to_array(init(m, dq.input[1]))
    set_init(m, dq.input[1], s[:-1].copy())
    set_init(m, dq.input[2], np.zeros(s.size - 1, np.int8))
    assert "axis" in rules(m)


@pytest.mark.parametrize("bad", [0.0, -0.1, np.inf, np.nan])
def test_bad_scale(bad):
    m = good()
    q = activation_q(m)
    set_init(m, q.input[1], np.array(bad, np.float32))
    assert "scale" in rules(m)


def test_per_channel_activation_scale():
    m = good()
    q = activation_q(m)
    set_init(m, q.input[1], np.full(4, 0.1, np.float32))
    set_init(m, q.input[2], np.zeros(4, np.int8))
    assert "activation_per_tensor" in rules(m)


def test_qdq_on_residual_add():
    m = good()
    _, consumers = graph_io(m)
    # the residual Add in front of a block's second LayerNorm
    add = first(m, "Add", lambda n: any(c.op_type == "LayerNormalization" for c in consumers[n.output[0]]) and "blocks.0" in n.name)
    insert_qdq(m, add.input[0], add)
    assert "residual_add" in rules(m)


def test_qdq_on_layernorm_input():
    m = good()
    ln = first(m, "LayerNormalization")
    insert_qdq(m, ln.input[0], ln)
    assert "layernorm" in rules(m)


def test_dequantize_not_fed_by_quantize():
    from onnx import TensorProto, helper

    m = good()
    q = activation_q(m)
    cast = helper.make_node("Cast", list(q.input[:1]), list(q.output), to=TensorProto.INT8, name="sneaky_cast")
    nodes = [cast if n is q else n for n in m.graph.node]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    assert "dq_without_q" in rules(m)


def test_old_opset():
    m = good()
    next(o for o in m.opset_import if o.domain in ("", "ai.onnx")).version = 12
    assert "opset" in rules(m)


def test_assert_raises_one_line_quantization_error():
    from vitedge.core.errors import QuantizationError
    from vitedge.quantize import assert_qdq_graph

    m = good()
    ln = first(m, "LayerNormalization")
    insert_qdq(m, ln.input[0], ln)
    with pytest.raises(QuantizationError, match="TensorRT explicit-quantization") as err:
        assert_qdq_graph(m)
    assert "\n" not in str(err.value)


def test_onnxruntime_default_qdq_breaks_the_rules(tmp_path):
    """ONNX Runtime's quantize_static defaults (uint8 asymmetric activations, Q/DQ around
    Adds and LayerNorm inputs) are what the checker exists to catch."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    path, spec = fp32_model("timm")
    batches = [{"input": b.images} for b in source_for(spec, limit=8).batches(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            return next(self.it, None)

    out = tmp_path / "ort.onnx"
    quantize_static(str(path), str(out), Reader())
    found = rules(onnx.load(str(out)))
    assert {"int8", "zero_point"} <= found
    assert found & {"residual_add", "layernorm"}
