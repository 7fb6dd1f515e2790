"""Keep float the INT8 layers that ONNX Runtime would run in float anyway (issue 47).

ONNX Runtime turns a quantized layer into an integer kernel only where one of its QDQ rules matches: a MatMul or
Gemm reading two DequantizeLinears becomes MatMulIntegerToFloat / QGemm, but a Conv without a QuantizeLinear after it
(a CCT's conv tokenizer feeding ReLU and max-pool, a hybrid's stem), a Gemm with a float bias, or a MatMul whose
DequantizeLinear has a second reader stays a float kernel, and then dequantizes its input and its weight on every
run: the INT8 layer costs time and precision and saves nothing. So before the onnx artifact is written, ONNX Runtime
optimizes the graph on the build machine (``SessionOptions.optimized_model_filepath``, the graph it would run), and
every layer whose weight still reaches a float matrix kernel through a DequantizeLinear goes back to float here:
its weight becomes the float tensor it dequantized to (the values the INT8 graph used, so what the accuracy budget
measured for that weight stands) and its input the float tensor before its QuantizeLinear.

The decision is made by this CPU's ONNX Runtime and recorded with the CPU kind (``vitedge.cpu``). ONNX Runtime picks
these QDQ rules by op pattern, not by ISA level (read from its qdq_transformer selectors): a layer ORT runs in
float on one x86 CPU it runs in float on any. The runtime's other per-ISA choice, uint8 vs int8 activations, is
made in ``ort_gemm_bias``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.onnxutil import SessionSettings, cleanup, node_index, ort_session
from vitedge.swap import work_prefix

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

_FLOAT_MATRIX = frozenset({"MatMul", "Gemm", "Conv", "FusedConv", "FusedMatMul", "FusedGemm", "NhwcFusedConv", "ConvTranspose"})
_LAYERS = ("MatMul", "Gemm", "Conv")


@dataclass(frozen=True)
class Int8Payoff:
    """Which INT8 layers went back to float because ONNX Runtime ran them in float, and on which CPU kind."""

    cpu: str  # vitedge.cpu's ISA label of the machine whose ONNX Runtime decided
    layers: tuple[dict[str, str], ...] = field(default=())  # {"name", "op_type", "why"}
    source: str = "onnxruntime optimized graph"

    def one_line(self) -> str:
        if not self.layers:
            return f"INT8 payoff: every INT8 layer runs as an integer kernel in ONNX Runtime ({self.cpu})"
        names = ", ".join(l["name"] for l in self.layers[:3]) + (", ..." if len(self.layers) > 3 else "")
        return (f"INT8 payoff: {len(self.layers)} layer(s) kept float, ONNX Runtime runs them as float kernels on "
                f"{self.cpu} (INT8 would only add dequantization): {names}")

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": self.cpu, "source": self.source, "kept_float": [dict(l) for l in self.layers]}


def _float_weights(model: ModelProto) -> dict[str, str]:
    """int8 weight initializer -> the float op ONNX Runtime (this machine, this version) feeds it to dequantized."""
    import onnx

    with tempfile.TemporaryDirectory(prefix=work_prefix("ort-opt")) as tmp:
        out = Path(tmp) / "optimized.onnx"
        ort_session(model.SerializeToString(), SessionSettings(optimization="all", optimized_model_path=out))
        opt = onnx.load(str(out), load_external_data=False)
    inits = {t.name for t in opt.graph.initializer}
    producer = node_index(opt.graph.node).producer
    found = {}
    for n in opt.graph.node:
        if n.op_type not in _FLOAT_MATRIX:
            continue
        for i in n.input[1:2]:
            dq = producer.get(i)
            if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits:
                found[dq.input[0]] = n.op_type
    return found


def _dequantized(model: ModelProto, dq: NodeProto) -> np.ndarray:
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


def keep_unpaid_float(model: ModelProto, cpu: str) -> Int8Payoff:
    """Return to float, in place, every INT8 layer this machine's ONNX Runtime would run as a float kernel."""
    from onnx import numpy_helper

    try:
        unpaid = _float_weights(model)
    except Exception as err:  # noqa: BLE001 - a graph ORT cannot optimize here is shipped as it is
        return Int8Payoff(cpu, (), f"unavailable: {str(err).splitlines()[0][:120] if str(err) else type(err).__name__}")
    if not unpaid:
        return Int8Payoff(cpu)
    gr = node_index(model.graph.node)
    kept = []
    for node in [n for n in model.graph.node if n.op_type in _LAYERS and len(n.input) >= 2]:
        dq = gr.producer.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in unpaid:
            continue
        weight = f"{node.name}/float_weight"
        model.graph.initializer.append(numpy_helper.from_array(_dequantized(model, dq), weight))
        node.input[1] = weight
        x_dq = gr.producer.get(node.input[0])
        q = gr.producer.get(x_dq.input[0]) if x_dq is not None and x_dq.op_type == "DequantizeLinear" else None
        if q is not None and q.op_type == "QuantizeLinear":
            node.input[0] = q.input[0]
        kept.append({"name": node.name, "op_type": node.op_type,
                     "why": f"ONNX Runtime runs it as a float {unpaid[dq.input[0]]} reading dequantized inputs"})
    cleanup(model)
    return Int8Payoff(cpu, tuple(kept))
