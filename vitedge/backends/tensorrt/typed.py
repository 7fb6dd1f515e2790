"""The strongly typed cast graph TensorRT 10.12 and later build from.

TensorRT 10.12 deprecated BuilderFlag.FP16/INT8 ("Superseded by strong typing") and 11 removed
them: every network vitedge builds there is strongly typed, so a tensor's
type is whatever the graph says. To run the float regions of the Q/DQ graph in FP16 the
graph itself must say FP16. ``make_strongly_typed`` rewrites the one Q/DQ graph:

* the FP32 graph input is cast to FP16 where it is first used;
* float weights and constants become FP16 (values beyond FP16's range are clipped and
  counted); Q/DQ scales become FP16 so the DequantizeLinear outputs are FP16 (opset 19
  allows that; the graph is converted to opset 19 when older). A scale is rounded *up* to
  the next FP16 value (never below FP16's smallest normal number) and the INT8 weights
  behind it are requantized for the new scale, so no weight grows past +-127;
* each LayerNormalization stays FP32 between Casts when ``layernorm_fp32`` (FP16
  LayerNorm overflows on ViTs, see docs/tensorrt.md);
* the graph output is cast back to FP32 under its original name.

The INT8 content (which tensors are quantized, with which zero points) is unchanged.
ONNX Runtime's CPU provider runs every op of this graph, which is how the tests check it
numerically against FP32.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.core.errors import QuantizationError, UsageError
from vitedge.onnxkit.structure import opset_version

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto, ValueInfoProto

TYPED_OPSET = 19  # QuantizeLinear / DequantizeLinear with float16 scales
FP16_MAX = float(np.finfo(np.float16).max)
FP16_MIN_NORMAL = float(np.finfo(np.float16).tiny)

# Ops that accept a tensor of any type and whose output type does not follow it.
_TYPE_AGNOSTIC = {"Shape", "Size"}
# (op, input index) that must stay FP32 whatever the region's precision.
_KEEP_FP32_INPUTS = {("Resize", 2)}


@dataclass
class TypedGraphReport:
    float_precision: str
    layernorm_fp32: bool
    opset_from: int = 0
    opset_to: int = 0
    casts_inserted: int = 0
    constants_converted: int = 0
    fp32_layernorms: list[str] = field(default_factory=list)
    scales_raised: int = 0  # Q/DQ scale entries below FP16's smallest normal number, raised to it
    weights_requantized: int = 0  # INT8 weight tensors whose values changed for a raised scale
    values_clipped: int = 0  # constant values beyond +-65504

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def one_line(self) -> str:
        return (f"strongly typed graph ({self.float_precision} float regions, LayerNorm "
                f"{'FP32' if self.layernorm_fp32 else self.float_precision.upper()}): {self.casts_inserted} casts, "
                f"{self.constants_converted} constants converted, {self.scales_raised} scales raised to FP16's range")


def _fp16_scale(scale: np.ndarray) -> np.ndarray:
    """The smallest FP16 value >= each scale, at least FP16's smallest normal number."""
    s = np.atleast_1d(np.maximum(np.asarray(scale, dtype=np.float64), FP16_MIN_NORMAL))
    h = s.astype(np.float16)
    low = h.astype(np.float64) < s
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h.reshape(np.shape(scale))


def make_strongly_typed(model: ModelProto, *, float_precision: str = "fp16", layernorm_fp32: bool = True) -> tuple[Any, TypedGraphReport]:
    """A copy of ``model`` whose float regions are typed ``float_precision`` by explicit casts.

    The steps: bring the graph to opset 19 (FP16 Q/DQ scales), read every tensor's type, retype
    each node's float inputs (casts for activations, FP16 copies of constants), requantize the
    INT8 weights behind raised scales, cast the outputs back to FP32, then check the result."""
    if float_precision not in ("fp16", "fp32"):
        raise UsageError(f"float_precision must be fp16 or fp32, got '{float_precision}'")
    opset = opset_version(model)
    report = TypedGraphReport(float_precision, layernorm_fp32, opset_from=opset, opset_to=opset)
    if float_precision == "fp32":
        return copy.deepcopy(model), report  # the Q/DQ graph is already typed FP32 outside the INT8 pairs
    m = _at_typed_opset(model, opset, report)
    g = m.graph
    retyper = _Retyper(_GraphTypes.read(m), report, layernorm_fp32)
    new_nodes = retyper.rewrite(g.node)
    # Weights behind an adjusted scale: requantize so q * new_scale still approximates w.
    report.weights_requantized = _requantize_weights(new_nodes, retyper.types.inits, retyper.new_inits)
    _cast_outputs_to_fp32(g.output, new_nodes, retyper)
    _replace_and_check(m, new_nodes, retyper.new_inits)
    return m, report


def _at_typed_opset(model: ModelProto, opset: int, report: TypedGraphReport) -> Any:
    """A copy of ``model`` at opset 19 or later (float16 Q/DQ scales), its metadata kept."""
    if opset >= TYPED_OPSET:
        return copy.deepcopy(model)
    from onnx import version_converter

    try:
        m = version_converter.convert_version(model, TYPED_OPSET)
    except Exception as err:
        raise QuantizationError(f"could not convert the Q/DQ graph from opset {opset} to {TYPED_OPSET} for FP16 Q/DQ scales: "
                                f"{str(err).splitlines()[0][:160] if str(err) else type(err).__name__}") from err
    del m.metadata_props[:]
    m.metadata_props.extend(model.metadata_props)
    report.opset_to = TYPED_OPSET
    return m


@dataclass
class _GraphTypes:
    """Every tensor's element type in the graph as it was, and where its constants are."""

    dtype: dict[str, int]  # tensor -> ONNX element type
    inits: dict[str, Any]  # initializer name -> TensorProto
    const_nodes: dict[str, Any]  # output of a Constant node -> its value (TensorProto)

    @classmethod
    def read(cls, m: ModelProto) -> "_GraphTypes":
        import onnx

        inferred = onnx.shape_inference.infer_shapes(m)
        dtype: dict[str, int] = {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
            if vi.type.HasField("tensor_type"):
                dtype[vi.name] = vi.type.tensor_type.elem_type
        g = m.graph
        inits = {t.name: t for t in g.initializer}
        for t in g.initializer:
            dtype[t.name] = t.data_type
        const_nodes: dict[str, Any] = {}
        for node in g.node:
            if node.op_type == "Constant":
                for a in node.attribute:
                    if a.name == "value":
                        const_nodes[node.output[0]] = a.t
                        dtype[node.output[0]] = a.t.data_type
        untyped = [o for n in g.node for o in n.output if o and o not in dtype]
        if untyped:
            raise QuantizationError(f"cannot type the graph for a strongly typed TensorRT network: no type known for '{untyped[0]}'")
        return cls(dtype, inits, const_nodes)


class _Retyper:
    """Rewrites the nodes one by one so every float input has the type its region runs in."""

    def __init__(self, types: _GraphTypes, report: TypedGraphReport, layernorm_fp32: bool):
        from onnx import TensorProto

        self.FLOAT, self.HALF = TensorProto.FLOAT, TensorProto.FLOAT16
        self.types, self.report, self.layernorm_fp32 = types, report, layernorm_fp32
        self.current = dict(types.dtype)  # tensor -> its type in the rewritten graph
        self.cache: dict[tuple[str, int], str] = {}
        self.new_inits: list[Any] = []
        self.pending: list[Any] = []  # casts to insert before the node being processed

    def rewrite(self, nodes: Iterable[NodeProto]) -> list[Any]:
        new_nodes: list[Any] = []
        for node in nodes:
            if node.op_type == "Constant" and node.output[0] in self.types.const_nodes:
                new_nodes.append(node)  # converted copies become initializers where consumers need them
                continue
            self._retype(node)
            new_nodes.extend(self.pending)
            self.pending.clear()
            new_nodes.append(node)
        return new_nodes

    def _retype(self, node: NodeProto) -> None:
        """Type one node: its float inputs, a Cast's or ConstantOfShape's float, its float outputs."""
        from onnx import numpy_helper

        FLOAT, HALF, dtype = self.FLOAT, self.HALF, self.types.dtype
        fp32_norm = node.op_type == "LayerNormalization" and self.layernorm_fp32
        target = FLOAT if fp32_norm else HALF
        if fp32_norm:
            self.report.fp32_layernorms.append(node.name or node.output[0])
        if node.op_type not in _TYPE_AGNOSTIC:
            for i, name in enumerate(node.input):
                if not name or dtype.get(name) != FLOAT:
                    continue
                want = FLOAT if (node.op_type, i) in _KEEP_FP32_INPUTS else target
                node.input[i] = self._typed(name, want, node, i)
        if node.op_type == "Cast":
            for a in node.attribute:
                if a.name == "to" and a.i == FLOAT:
                    a.i = target
        if node.op_type == "ConstantOfShape":
            for a in node.attribute:
                if a.name == "value" and a.t.data_type == FLOAT:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16 if target == HALF else np.float32), a.t.name))
        for out in node.output:
            if out and dtype.get(out) == FLOAT:
                self.current[out] = target

    def _typed(self, name: str, want: int, node: NodeProto, index: int) -> str:
        """``name`` as type ``want``: itself, a converted constant, or the output of a Cast queued before ``node``."""
        from onnx import helper

        if self.current.get(name) == want:
            return name
        key = (name, want)
        if key in self.cache:
            return self.cache[key]
        if name in self.types.inits or name in self.types.const_nodes:
            out = self._converted_constant(name, want, node, index)
        else:
            out = f"{name}__to_{'fp16' if want == self.HALF else 'fp32'}"
            self.pending.append(helper.make_node("Cast", [name], [out], to=want, name=f"{out}/Cast"))
            self.report.casts_inserted += 1
        self.current[out] = want
        self.cache[key] = out
        return out

    def _converted_constant(self, name: str, want: int, node: NodeProto, index: int) -> str:
        """A new initializer: the constant in type ``want`` (a Q/DQ scale rounded up into FP16's range, other
        values clipped to +-65504)."""
        from onnx import numpy_helper

        HALF = self.HALF
        value = numpy_helper.to_array(self.types.inits.get(name) or self.types.const_nodes[name]).astype(np.float64)
        if want == HALF and node.op_type in ("QuantizeLinear", "DequantizeLinear") and index == 1:
            new = _fp16_scale(value)
            self.report.scales_raised += int(np.sum(value < FP16_MIN_NORMAL))
        else:
            over = np.abs(value) > FP16_MAX if want == HALF else np.zeros(value.shape, bool)
            self.report.values_clipped += int(over.sum())
            new = np.clip(value, -FP16_MAX, FP16_MAX).astype(np.float16) if want == HALF else value.astype(np.float32)
        out = f"{name}__{'fp16' if want == HALF else 'fp32'}"
        self.new_inits.append(numpy_helper.from_array(np.asarray(new), out))
        self.report.constants_converted += 1
        return out


def _cast_outputs_to_fp32(outputs: Iterable[ValueInfoProto], new_nodes: list[Any], retyper: _Retyper) -> None:
    """Each float graph output keeps its name and FP32 type: the node making it writes NAME__fp16, cast back."""
    from onnx import helper

    FLOAT = retyper.FLOAT
    for out in outputs:
        if retyper.types.dtype.get(out.name) != FLOAT or retyper.current.get(out.name) == FLOAT:
            continue
        inner = f"{out.name}__fp16"
        for node in new_nodes:
            for i, name in enumerate(node.output):
                if name == out.name:
                    node.output[i] = inner
            for i, name in enumerate(node.input):
                if name == out.name:
                    node.input[i] = inner
        new_nodes.append(helper.make_node("Cast", [inner], [out.name], to=FLOAT, name=f"{out.name}/Cast_to_fp32"))
        retyper.report.casts_inserted += 1


def _replace_and_check(m: ModelProto, new_nodes: list[Any], new_inits: list[Any]) -> None:
    """Put the rewritten nodes and new initializers in the graph, drop the unused, and type-check it strictly."""
    import onnx

    g = m.graph
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    _drop_unused_initializers(g)
    del g.value_info[:]
    try:
        onnx.checker.check_model(m)
        onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    except Exception as err:
        raise QuantizationError(f"internal error: the strongly typed graph does not type-check: {str(err).splitlines()[0][:200]}") from err


def _requantize_weights(nodes: list[Any], inits: dict[str, Any], new_inits: list[Any]) -> int:
    from onnx import numpy_helper

    added = {t.name: t for t in new_inits}
    count = 0
    for node in nodes:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits or not node.input[1].endswith("__fp16"):
            continue
        original_scale = numpy_helper.to_array(inits[node.input[1][: -len("__fp16")]]).astype(np.float64)
        new_scale = numpy_helper.to_array(added[node.input[1]]).astype(np.float64)
        if np.array_equal(original_scale, new_scale):
            continue
        q = numpy_helper.to_array(inits[node.input[0]]).astype(np.float64)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        ratio = original_scale / new_scale
        if ratio.ndim == 1 and ratio.size > 1:
            shape = [1] * q.ndim
            shape[axis if axis >= 0 else axis + q.ndim] = ratio.size
            ratio = ratio.reshape(shape)
        requantized = np.clip(np.rint(q * ratio), -127, 127).astype(np.int8)
        if np.array_equal(requantized, q.astype(np.int8)):
            continue  # rounding a scale up by less than 2**-11 moves no INT8 value
        name = f"{node.input[0]}__fp16scale"
        new_inits.append(numpy_helper.from_array(requantized, name))
        node.input[0] = name
        count += 1
    return count


def _drop_unused_initializers(g: GraphProto) -> None:
    used = {name for node in g.node for name in node.input} | {o.name for o in g.output}
    live = [n for n in g.node if n.op_type != "Constant" or any(o in used for o in n.output)]
    if len(live) != len(g.node):
        del g.node[:]
        g.node.extend(live)
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
