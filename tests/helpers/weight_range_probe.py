"""A Q/DQ layer whose INT8 weights saturate any pre-VNNI CPU kernel (see test_weight_range.py),
and the relative error of a runtime's result against the exact one."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitedge.quantize.weight_range import quantize_weight


def probe_graph(path: Path, rule: str, op: str) -> np.ndarray:
    """One Q/DQ MatMul (or Conv) with saturating inputs; returns the exact (float64) result."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if op == "MatMul":
        k, n = 128, 32
        w = rng.uniform(0.6, 1.0, size=(k, n)).astype(np.float32)
        axis, x_shape = 1, [4, k]
    else:
        w = rng.uniform(0.6, 1.0, size=(16, 4, 4, 4)).astype(np.float32)
        axis, x_shape = 0, [1, 4, 8, 8]
    q, scale = quantize_weight(w, axis, op, rule)
    sx = np.float32(0.05)
    x = np.full(x_shape, 127 * sx, dtype=np.float32)  # s8 127 -> u8 255 in the kernels
    inits = [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(scale, "ws"),
             numpy_helper.from_array(np.zeros(scale.shape, np.int8), "wz"),
             numpy_helper.from_array(np.array(sx, np.float32), "xs"), numpy_helper.from_array(np.array(0, np.int8), "xz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=axis)]
    nodes.append(helper.make_node("MatMul", ["xd", "wd"], ["y"]) if op == "MatMul"
                 else helper.make_node("Conv", ["xd", "wd"], ["y"], kernel_shape=[4, 4], strides=[4, 4]))
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    wd = q.astype(np.float64) * scale.astype(np.float64).reshape([-1 if i == axis else 1 for i in range(q.ndim)])
    if op == "MatMul":
        exact = x.astype(np.float64) @ wd
    else:
        exact = np.einsum("cij,ocij->o", x[0, :, :4, :4].astype(np.float64), wd)[None, :, None, None] * np.ones((1, 1, 2, 2))
    return x, exact


def rel_error(out: np.ndarray, exact: np.ndarray) -> float:
    return float(np.abs(out - exact).max() / np.abs(exact).max())
