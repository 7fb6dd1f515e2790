"""Return chosen INT8 layers of a Q/DQ graph to float, in place (issue 47).

A layer here is a MatMul, Gemm or Conv whose weight comes through a DequantizeLinear of an int8 initializer. Its
weight becomes the float tensor it dequantized to (the values the INT8 graph used, so what the accuracy budget
measured for that weight stands) and its input the float tensor before its QuantizeLinear. Used by each target
that decides, on its own runtime, that INT8 of a layer does not pay there (``ort_payoff``, ``ov_payoff``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from vitedge.onnxkit.structure import cleanup, node_index

LAYER_OPS = ("MatMul", "Gemm", "Conv")


def dequantized(model: Any, dq: Any) -> np.ndarray:
    """The float values a DequantizeLinear of an initializer produces (per-tensor or per-axis)."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    q, s = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float32), numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
    z = numpy_helper.to_array(inits[dq.input[2]]).astype(np.float32) if len(dq.input) > 2 and dq.input[2] else np.zeros_like(s)
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    if s.ndim == 1 and s.size > 1:
        shape = [1] * q.ndim
        shape[axis] = s.size
        s, z = s.reshape(shape), z.reshape(shape)
    return ((q - z) * s).astype(np.float32)


def int8_layers(model: Any) -> dict[str, Any]:
    """Layer node name -> its weight's DequantizeLinear, for every INT8 layer of the graph."""
    gr = node_index(model.graph.node)
    inits = {t.name for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type not in LAYER_OPS or len(node.input) < 2:
            continue
        dq = gr.producer.get(node.input[1])
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits:
            found[node.name] = dq
    return found


def return_to_float(model: Any, chosen: Callable[[Any, Any], str | None]) -> list[dict[str, str]]:
    """Every INT8 layer for which ``chosen(node, weight_dq)`` gives a reason goes back to float; returns
    ``{"name", "op_type", "why"}`` per layer, in graph order."""
    from onnx import numpy_helper

    gr = node_index(model.graph.node)
    layers = int8_layers(model)
    kept = []
    for node in [n for n in model.graph.node if n.name in layers]:
        dq = layers[node.name]
        why = chosen(node, dq)
        if not why:
            continue
        weight = f"{node.name}/float_weight"
        model.graph.initializer.append(numpy_helper.from_array(dequantized(model, dq), weight))
        node.input[1] = weight
        x_dq = gr.producer.get(node.input[0])
        q = gr.producer.get(x_dq.input[0]) if x_dq is not None and x_dq.op_type == "DequantizeLinear" else None
        if q is not None and q.op_type == "QuantizeLinear":
            node.input[0] = q.input[0]
        kept.append({"name": node.name, "op_type": node.op_type, "why": why})
    if kept:
        cleanup(model)
    return kept
