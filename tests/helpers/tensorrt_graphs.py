"""Small Q/DQ ONNX graphs for the TensorRT plan and stand-in tests (tests/conftest.py: tiny)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitedge.backends.tensorrt.plan import GraphFacts

LN_NAMES = ("/blocks.0/norm1/LayerNormalization", "/norm/LayerNormalization")


def write_tiny_qdq_graph(folder: Path) -> tuple[Path, GraphFacts]:
    """A small Q/DQ graph in ``folder`` (LayerNorm -> Q/DQ -> MatMul (INT8 weight) -> LayerNorm -> Softmax),
    with the typed and reference copies a bundle holds; (path, GraphFacts)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 8, 8])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3, 8, 8])
    inits = [numpy_helper.from_array(np.ones(8, np.float32), "g"), numpy_helper.from_array(np.zeros(8, np.float32), "b"),
             numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z"),
             numpy_helper.from_array(np.eye(8, dtype=np.int8) * 100, "w"), numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(8, np.int8), "wz")]
    nodes = [
        helper.make_node("LayerNormalization", ["input", "g", "b"], ["n1"], name=LN_NAMES[0], axis=-1),
        helper.make_node("QuantizeLinear", ["n1", "s", "z"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], name="wdq", axis=1),
        helper.make_node("MatMul", ["dq", "wd"], ["mm"], name="/blocks.0/mlp/fc1/MatMul"),
        helper.make_node("LayerNormalization", ["mm", "g", "b"], ["n2"], name=LN_NAMES[1], axis=-1),
        helper.make_node("Softmax", ["n2"], ["logits"], name="/softmax", axis=-1),
    ]
    model = helper.make_model(helper.make_graph(nodes, "tiny", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = folder / "model.int8.onnx"
    onnx.save(model, str(path))
    (path.parent / "model.int8.typed.onnx").write_bytes(path.read_bytes())  # the stand-in only reads node names
    (path.parent / "reference.fp32.onnx").write_bytes(path.read_bytes())
    return path, GraphFacts.from_model(model)
