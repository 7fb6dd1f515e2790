"""Adds of zeros out of the onnx target's graphs (issue 47 item 2).

A block whose attention heads were all pruned may return ``torch.zeros_like(x)`` (the corpus's alessio-tin-pruned:
three of its six blocks). The export keeps the work that makes those zeros: ``LayerNormalization (norm1) -> Shape ->
ConstantOfShape(0) -> Add(zeros, x)``, four kernels per such block that the FP32 reference and the INT8 graph run at
every inference for nothing (ONNX Runtime folds none of them: the batch is symbolic).

The torch.export-based exporter writes the same zeros as ``Expand(0, Shape(b))``. This rewrite replaces
``Add(a, ConstantOfShape(Shape(b)))`` and ``Add(a, Expand(c, Shape(b)))`` (either input order) by ``a`` when

* the ConstantOfShape's value is zero (the attribute absent means a float 0.0), or the Expand's ``c`` is a constant
  scalar (0-d: it broadcasts to exactly the shape it is given) zero;
* the Shape has no ``end`` and no ``start`` but 0 (the zeros have the whole of ``b``'s shape);
* ``b`` has ``a``'s shape at every input size, proved symbolically: walking back from each of ``a`` and ``b`` through
  ops whose output has their first input's shape (LayerNormalization, QuantizeLinear/DequantizeLinear, Cast, Identity,
  element-wise unary ops) reaches the same tensor. The Add then neither broadcasts nor changes its output's shape, and
  ``a + 0`` is ``a`` (a -0.0 in ``a`` becomes +0.0 in the Add: a difference no later op can tell but a division by it);
* the Add's output is not a graph output, and the graph has no subgraph (If/Loop) that could read it by name.

What nobody reads any more then goes (``onnxkit.structure.cleanup``): the ConstantOfShape (or Expand), its Shape, and the
LayerNormalization when only that Shape read it. A zero tensor made any other way (a Constant, a Mul by 0), or one whose
shape is not proved equal, is left alone. The INT8 graph holds no Q/DQ pair on these Adds' inputs (the quantizer
quantizes matrix layers' inputs; the zeros feed none), so the same nodes go from the INT8 graph and from its FP32
reference, both rewritten by the onnx target (backend ``_fuse_file``, ``_fuse_reference``).

Measured on alessio-tin-pruned with ONNX Runtime 1.32 on an AVX2 EPYC (2 shared cores, load average about 1;
benchmarks/results/zero_add_avx2.md): both graphs 135 -> 119 nodes (12 kernels, and 4 Identity nodes of weights only
the removed LayerNormalizations read), the same output bits at batch 1, 3 and 8. The removed kernels were 6 % of the
profiled kernel time at batch 1 and 4 % at batch 8; timed side by side (one thread, CPU time, three runs) each graph
after over before is 0.95-0.98 (FP32) and 0.94-0.97 (INT8) at batch 1 and 8, against a FP32-vs-FP32 control of
0.98-1.01. The INT8/FP32 ratio moves within the noise (b1 0.84-0.90 -> 0.82-0.88, b8 0.86-0.90 -> 0.87-0.89): both
graphs lose the same kernels. The corpus build (benchmarks/corpus.py) gives the same top-1 and agreement before and
after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vitedge.onnxkit.structure import cleanup, computing_nodes, node_index

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto

# ops whose first output has the shape of their first input, whatever the input (ai.onnx domain)
_SAME_SHAPE = frozenset({"LayerNormalization", "QuantizeLinear", "DequantizeLinear", "Cast", "Identity", "Dropout",
                         "Relu", "LeakyRelu", "Elu", "Selu", "Gelu", "Erf", "Sigmoid", "HardSigmoid", "Tanh", "Softplus",
                         "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Not",
                         "Softmax", "LogSoftmax", "Clip"})
_ONNX = ("", "ai.onnx")


@dataclass
class ZeroAdds:
    """What the rewrite did."""

    dropped: int = 0  # Adds of zeros whose readers now read the other input
    removed: int = 0  # nodes gone with them (the Adds included; Constant nodes not counted)


def drop_zero_adds(model: ModelProto) -> ZeroAdds:
    """Replace each ``Add(a, zeros of a's shape)`` by ``a`` where the module docstring's rules hold, and remove what
    nobody reads then (in place)."""
    report = ZeroAdds()
    graph = model.graph
    if any(a.type in (5, 10) for n in graph.node for a in n.attribute):  # AttributeProto GRAPH, GRAPHS: a subgraph
        return report
    index = node_index(graph.node)
    outputs = {o.name for o in graph.output}
    constants = _Constants(graph)
    for n in list(graph.node):
        if n.op_type != "Add" or n.domain not in _ONNX or len(n.input) != 2 or n.output[0] in outputs:
            continue
        for k in (0, 1):
            zeros, kept = n.input[k], n.input[1 - k]
            if kept and _zeros_like(index.producer.get(zeros), kept, index.producer, constants):
                for reader, slot in index.consumers.get(n.output[0], ()):
                    reader.input[slot] = kept
                report.dropped += 1
                break
    if report.dropped:
        before = computing_nodes(graph)
        cleanup(model)
        report.removed = before - computing_nodes(graph)
    return report


def _zeros_like(node: NodeProto | None, other: str, producer: dict[str, NodeProto], constants: _Constants) -> bool:
    """Whether ``node`` writes zeros of ``other``'s shape: ConstantOfShape(0), or Expand of a 0-d constant 0, of the
    whole Shape of a tensor whose shape is ``other``'s by ``_root``."""
    if node is None or node.domain not in _ONNX:
        return False
    if node.op_type == "ConstantOfShape":
        if not _is_zero(node):
            return False
        shape_input = node.input[0]
    elif node.op_type == "Expand" and len(node.input) == 2:
        value = constants.get(node.input[0])
        if value is None or value.ndim != 0 or value != 0:
            return False
        shape_input = node.input[1]
    else:
        return False
    shape = producer.get(shape_input)
    if shape is None or shape.op_type != "Shape" or shape.domain not in _ONNX:
        return False
    if any(a.name != "start" or a.i != 0 for a in shape.attribute):  # the whole shape: no end, start 0 or none
        return False
    return _root(shape.input[0], producer) == _root(other, producer)


def _is_zero(node: NodeProto) -> bool:
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            value = numpy_helper.to_array(a.t)
            return value.size == 1 and bool(np.all(value == 0))
    return True  # no value: a float 0.0


class _Constants:
    """The value of an initializer or a Constant node's tensor output, read when asked (small ones only)."""

    def __init__(self, graph: GraphProto):
        self.tensors = {t.name: t for t in graph.initializer}
        for n in graph.node:
            if n.op_type == "Constant" and n.domain in _ONNX:
                for a in n.attribute:
                    if a.name == "value":
                        self.tensors[n.output[0]] = a.t

    def get(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        t = self.tensors.get(name)
        if t is None or len(t.dims) > 1 or t.data_location == 1:  # EXTERNAL: not a scalar anyway
            return None
        return numpy_helper.to_array(t)


def _root(tensor: str, producer: dict[str, NodeProto]) -> str:
    """The tensor whose shape ``tensor`` has for sure: back through ``_SAME_SHAPE`` ops' first input."""
    seen = set()
    while tensor not in seen:
        seen.add(tensor)
        node = producer.get(tensor)
        if node is None or node.op_type not in _SAME_SHAPE or node.domain not in _ONNX or not node.input or node.output[0] != tensor:
            return tensor
        tensor = node.input[0]
    return tensor
