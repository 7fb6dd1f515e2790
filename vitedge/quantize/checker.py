"""TensorRT explicit-quantization rules, checked on a Q/DQ ONNX graph.

TensorRT 10+ builds INT8 from the Q/DQ nodes a graph carries ("explicit
quantization"); it wants symmetric INT8, per-channel weight scales on the output-channel
axis and per-tensor activation scales, and vitedge keeps the residual stream
(residual Adds, LayerNorm inputs) in float because quantizing it is what wrecks ViTs.
``check_qdq_graph`` lists every rule a graph breaks; ``assert_qdq_graph`` raises.
The ONNX Runtime and OpenVINO targets consume the same graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vitedge.core.errors import QuantizationError
from vitedge.onnxkit.structure import opset_version
from vitedge.quantize.graph import GraphIndex, attr

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

MIN_OPSET = 13  # per-axis QuantizeLinear / DequantizeLinear

RULES = {
    "opset": "opset must be 13 or newer (per-channel Q/DQ)",
    "int8": "quantized tensors must be INT8 (not UINT8 or other types)",
    "zero_point": "zero points must all be 0 (symmetric)",
    "scale": "scales must be positive and finite",
    "axis": "a per-channel weight scale must lie on the consuming op's output-channel axis and have one entry per channel",
    "activation_per_tensor": "activation scales must be per-tensor",
    "residual_add": "no Q/DQ may feed a residual Add (an Add of two activations): it stays float",
    "layernorm": "no Q/DQ may feed a LayerNormalization: its input stays float",
    "dq_without_q": "a DequantizeLinear on an activation must be fed by a QuantizeLinear",
}


@dataclass(frozen=True)
class Violation:
    rule: str  # a key of RULES
    node: str  # the offending node's name (or "" for graph-wide rules)
    message: str

    def __str__(self) -> str:
        return f"{self.node or 'graph'}: {self.message}"


def check_qdq_graph(model: ModelProto) -> list[Violation]:
    """Every TensorRT explicit-quantization rule ``model`` (an onnx.ModelProto) breaks."""
    from onnx import TensorProto


    out: list[Violation] = []
    opset = opset_version(model)
    if opset < MIN_OPSET:
        out.append(Violation("opset", "", f"opset {opset} < {MIN_OPSET}: per-channel Q/DQ needs opset {MIN_OPSET}"))
    gi = GraphIndex(model)

    def const(name: str) -> np.ndarray | None:
        if not name or not gi.is_const(name):
            return None
        try:
            return np.asarray(gi.value(name))
        except Exception:
            return None

    def elem_type(name: str) -> int | None:
        if name in gi.inits:
            return gi.inits[name].data_type
        v = const(name)
        if v is not None:
            from onnx import helper

            return helper.np_dtype_to_tensor_dtype(v.dtype)
        return None

    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        name = node.name or node.op_type
        scale = const(node.input[1]) if len(node.input) > 1 else None
        zp_name = node.input[2] if len(node.input) > 2 else ""
        zp = const(zp_name)
        # type: a Q without zero point (and no output_dtype) outputs UINT8
        qtype = None
        if zp_name:
            qtype = elem_type(zp_name)
        elif node.op_type == "QuantizeLinear":
            qtype = attr(node, "output_dtype", 0) or TensorProto.UINT8
        elif node.op_type == "DequantizeLinear":
            qtype = elem_type(node.input[0])
        if qtype is not None and qtype != TensorProto.INT8:
            out.append(Violation("int8", name, f"{node.op_type} uses {TensorProto.DataType.Name(qtype)}, not INT8"))
        if zp is not None and np.any(zp != 0):
            out.append(Violation("zero_point", name, f"zero point is not 0 (max |zp| = {int(np.max(np.abs(zp.astype(np.int64))))})"))
        if scale is None:
            out.append(Violation("scale", name, "scale is not a constant"))
            continue
        scale = scale.astype(np.float64)
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            out.append(Violation("scale", name, "scale has a non-positive or non-finite entry"))
        if node.op_type == "DequantizeLinear":
            x = node.input[0]
            weight = gi.is_const(x)
            if not weight:
                prod = gi.producer.get(x)
                if prod is None or prod.op_type != "QuantizeLinear":
                    out.append(Violation("dq_without_q", name, f"activation DequantizeLinear is fed by {prod.op_type if prod else 'a graph input'}, not a QuantizeLinear"))
                if scale.size != 1:
                    out.append(Violation("activation_per_tensor", name, f"activation scale has {scale.size} entries"))
            elif scale.size != 1:
                out.extend(_check_axis(gi, node, name, const(x), scale))
            for consumer, idx in gi.consumers.get(node.output[0], ()):
                cname = consumer.name or consumer.op_type
                if consumer.op_type == "LayerNormalization" and idx == 0:
                    out.append(Violation("layernorm", cname, f"LayerNormalization input comes from DequantizeLinear '{name}'"))
                if consumer.op_type == "Add" and len(consumer.input) == 2 and not any(gi.is_const(i) for i in consumer.input):
                    out.append(Violation("residual_add", cname, f"residual Add input comes from DequantizeLinear '{name}'"))
        elif scale.size != 1:
            x = node.input[0]
            if not gi.is_const(x):
                out.append(Violation("activation_per_tensor", name, f"activation scale has {scale.size} entries"))
    return out


def _check_axis(gi: GraphIndex, dq: NodeProto, name: str, weight: np.ndarray | None, scale: np.ndarray) -> list[Violation]:

    if weight is None:
        return []
    rank = weight.ndim
    axis = int(attr(dq, "axis", 1))
    axis = axis + rank if axis < 0 else axis
    found: list[Violation] = []
    for consumer, idx in gi.consumers.get(dq.output[0], ()):
        want = _output_channel_axis(consumer, idx, rank)
        if want is None:
            continue
        if axis != want:
            found.append(Violation("axis", name, f"per-channel axis {axis} but {consumer.op_type} '{consumer.name}' has its output channels on axis {want}"))
        elif scale.size != weight.shape[axis]:
            found.append(Violation("axis", name, f"{scale.size} scales for {weight.shape[axis]} channels"))
    return found


def _output_channel_axis(node: NodeProto, idx: int, rank: int) -> int | None:

    if node.op_type == "MatMul" and idx == 1:
        return rank - 1
    if node.op_type == "Gemm" and idx == 1:
        return 0 if attr(node, "transB", 0) else 1
    if node.op_type in ("Conv", "ConvTranspose") and idx == 1:
        return 0 if node.op_type == "Conv" else 1
    return None


def assert_qdq_graph(model: ModelProto) -> None:
    """Raise QuantizationError naming the broken rules, if any."""
    found = check_qdq_graph(model)
    if found:
        head = "; ".join(str(v) for v in found[:3])
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise QuantizationError(f"the Q/DQ graph breaks {len(found)} TensorRT explicit-quantization rule(s): {head}{more}")
