"""The shape arithmetic of an exported ViT as constants (issue 47 item 2: fewer shape ops in the onnx target's graphs).

A ViT exported with a dynamic batch computes the target of nearly every Reshape and Expand at run time:
``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` around each attention block, ``Shape -> Slice -> Concat`` at the
patch flatten, ``Shape -> Gather -> ... -> Equal -> Where -> Expand`` for the class token. ONNX Runtime folds none of it
(the batch is symbolic), and on the CPU each of these kernels takes 4-15 us whatever the batch: measured with ONNX
Runtime 1.32 on an AVX2 CPU at one thread, the corpus ViTs' graphs run 40-90 of them, a fifth of the whole graph's
kernel time at batch 1 on the small ones (benchmarks/results/onnx_shape_ops_avx2.md).

With every input dimension fixed but the batch, each such value is a function of the batch alone. This rewrite runs
the graph (no optimisation) at batch sizes 1, 2 and 3 and reads every integer tensor computed from ``Shape`` outputs
and constants alone; a tensor that a Reshape or an Expand reads as its shape (or a Slice, Tile, Range or
ConstantOfShape as an index or a size: the first rule only, as a position table's ``pos[:, :x.shape[1]]``) is then
replaced when its value is

* the same at the three batch sizes: a constant;
* for a Reshape, the same but for one entry, and no entry is -1: a constant with -1 there (Reshape infers it from
  the element count, which is what it was);
* for an Expand, the same but for entries that equal the batch size: ``Concat`` of constants and the batch size,
  read once by one ``Shape`` of the graph input (``start=0, end=1``).

The Reshape or Expand then computes what it computed before at every batch size the graph takes (the tests check
outputs at batch sizes 1, 5 and 8: the same bits on the corpus's graphs; where the constant shapes let ONNX Runtime
fuse more of a graph, its outputs can round differently in the last bit), and the shape arithmetic no node reads any
more is removed. A
graph with more than one input, an input whose dimensions other than the first are not fixed, or shape values that
fit none of the rules keeps those nodes. The rewrite is applied to the INT8 graph and to its FP32 reference alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.onnxkit.files import is_large
from vitedge.onnxkit.structure import NameScope, cleanup, computing_nodes, graph_inputs, opset_version

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto, ValueInfoProto

# ops through which a value computed from Shape outputs and constants stays such a value (small int tensors)
_ARITHMETIC = frozenset({"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Equal", "Where", "Mul", "Add",
                         "Sub", "Div", "Cast", "ConstantOfShape", "Constant", "Identity", "Range", "ReduceProd", "Max",
                         "Min", "Abs", "Neg", "Less", "Greater", "Not", "And", "Or", "Reshape"})
# (op, input slot) that read a shape or an index: Reshape and Expand by the rules below, the others when constant
_READERS = {("Reshape", 1), ("Expand", 1), ("Slice", 1), ("Slice", 2), ("Slice", 3), ("Slice", 4), ("Tile", 1),
            ("ConstantOfShape", 0), ("Range", 0), ("Range", 1), ("Range", 2)}
_BATCHES = (1, 2, 3)
_WITH_BATCH = "/shape_with_batch"  # the name of a shape this rewrite makes of constants and the batch size
_MAX_ELEMENTS = 16  # a shape tensor has a few entries; anything larger is not one


@dataclass
class ShapeFolding:
    """What the rewrite did."""

    replaced: int = 0  # shape (or index) inputs now constant (or constant and the batch size)
    removed: int = 0  # nodes of shape arithmetic no longer read (Constant nodes not counted)
    skipped: list[str] = field(default_factory=list)  # why not, when nothing was done

    def to_dict(self) -> dict[str, Any]:
        return {"replaced": self.replaced, "removed": self.removed, "skipped": list(self.skipped)}


def fold_shape_arithmetic(model: ModelProto) -> ShapeFolding:
    """Replace the computed shape inputs of Reshape and Expand (and index inputs of Slice, ...) by constants where
    the module docstring's rules hold, and remove the shape arithmetic nobody reads then (in place)."""
    report = ShapeFolding()
    graph = model.graph
    inputs = graph_inputs(model)
    why = "the graph is past 2 GiB (running it to read its shapes would cost gigabytes)" if is_large(model) else _unsupported(inputs)
    if why:
        report.skipped.append(why)
        return report
    computed = shape_arithmetic(model)
    uses = [(n, slot, n.input[slot]) for n in graph.node for (op, slot) in _READERS
            if n.op_type == op and n.domain in ("", "ai.onnx") and len(n.input) > slot and n.input[slot] in computed
            and not n.input[slot].endswith(_WITH_BATCH)]  # what an earlier pass wrote stays
    if not uses:
        return report
    data = sorted({n.input[0] for n, _, _ in uses if n.op_type == "Reshape"})
    values = _values(model, inputs[0], sorted({t for _, _, t in uses}), data)
    if values is None:
        report.skipped.append("the shape values could not be read by running the graph")
        return report
    added: list[NodeProto] = []
    names = NameScope(model)
    batch = _Batch(model, inputs[0].name, added, names)
    for node, slot, tensor in uses:
        seen = values.get(tensor)
        shapes = values.get(_probe(node.input[0])) if node.op_type == "Reshape" else None
        new = _replacement(model, node, seen, shapes, batch, names) if seen is not None else None
        if new is not None:
            node.input[slot] = new
            report.replaced += 1
    if added:
        nodes = list(graph.node)
        del graph.node[:]
        graph.node.extend(added + nodes)
    if report.replaced:  # the shape arithmetic nobody reads any more goes, with the constants only it read
        before = computing_nodes(graph)
        cleanup(model)
        report.removed = before - computing_nodes(graph)
    return report


def _unsupported(inputs: list[ValueInfoProto]) -> str:
    if len(inputs) != 1:
        return f"the graph has {len(inputs)} inputs (one is handled)"
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) < 2 or any(not d.HasField("dim_value") for d in dims[1:]):
        return "the input's dimensions other than the batch are not fixed"
    return ""


def shape_arithmetic(model: ModelProto) -> set[str]:
    """Tensors computed from Shape outputs and constants alone, through ``_ARITHMETIC`` ops (in node order)."""
    constants = {t.name for t in model.graph.initializer}
    out: set[str] = set()
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx") or n.op_type not in _ARITHMETIC:
            continue
        if n.op_type == "Constant":
            constants.update(n.output)
            continue
        ins = [i for i in n.input if i]
        if n.op_type == "Shape" or (ins and all(i in out or i in constants for i in ins) and any(i in out for i in ins)):
            out.update(o for o in n.output if o)
    return out


def _probe(tensor: str) -> str:
    return f"{tensor}/probed_shape"


def _values(model: ModelProto, inp: ValueInfoProto, tensors: list[str], data: list[str]) -> dict[str, list[np.ndarray]] | None:
    """Each tensor's value, and each ``data`` tensor's shape (under ``_probe(name)``), at the batch sizes ``_BATCHES``
    (the graph run without optimisation on zeros); only small integer tensors are kept. None when the graph does not
    run."""
    import onnx

    from vitedge.onnxkit.session import SessionSettings, ort_session

    graph = model.graph
    outputs = list(graph.output)
    nodes = len(graph.node)
    del graph.output[:]
    graph.node.extend(onnx.helper.make_node("Shape", [d], [_probe(d)]) for d in data)
    tensors = tensors + [_probe(d) for d in data]
    graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in tensors)
    try:
        session = ort_session(model, SessionSettings(threads=1, optimization="disabled"))
    except Exception:  # noqa: BLE001 - a graph ONNX Runtime cannot open keeps its shape ops
        return None
    finally:  # the graph as it was: the probe's outputs and Shape nodes go
        del graph.output[:]
        graph.output.extend(outputs)
        del graph.node[nodes:]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
    dims = [d.dim_value for d in inp.type.tensor_type.shape.dim[1:]]
    seen: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    for b in _BATCHES:
        try:
            got = session.run(tensors, {inp.name: np.zeros([b, *dims], dtype=dtype)})
        except Exception:  # noqa: BLE001 - as above
            return None
        for t, v in zip(tensors, got):
            seen[t].append(np.asarray(v))
    return {t: vs for t, vs in seen.items()
            if all(v.dtype.kind in "iu" and v.ndim == 1 and v.size <= _MAX_ELEMENTS and v.shape == vs[0].shape for v in vs)}


def _replacement(model: ModelProto, node: NodeProto, seen: list[np.ndarray], shapes: list[np.ndarray] | None,
                 batch: _Batch, names: NameScope) -> str | None:
    """The name of the tensor that replaces a computed shape input of ``node`` (module docstring), or None."""
    first = seen[0]
    varying = [k for k in range(first.size) if any(v[k] != first[k] for v in seen)]
    if not varying:
        return _constant(model, names(f"{node.name}/shape"), first)
    if node.op_type == "Reshape":
        value = first.copy()
        if shapes is not None and not any(a.name == "allowzero" and a.i for a in node.attribute):
            # 0 copies the input's dimension there: where that dimension is the value at every batch size
            copied = [k for k in varying if all(k < s.size and s[k] == v[k] for s, v in zip(shapes, seen))]
            value[copied] = 0
            varying = [k for k in varying if k not in copied]
        if not varying:
            return _constant(model, names(f"{node.name}/shape"), value)
        if len(varying) == 1 and -1 not in value.tolist():
            value[varying[0]] = -1
            return _constant(model, names(f"{node.name}/shape"), value)
        return None
    if node.op_type == "Expand" and all(int(v[k]) == b for k in varying for v, b in zip(seen, _BATCHES)):
        return batch.concat(first, varying, node.name)
    return None


def _constant(model: ModelProto, name: str, value: np.ndarray) -> str:
    """An int64 initializer ``name`` (a name ``NameScope`` gave) holding ``value``."""
    from onnx import numpy_helper

    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))
    return name


class _Batch:
    """The batch size as a 1-element int64 tensor (one Shape of the graph input), and shapes made of it."""

    def __init__(self, model: ModelProto, input_name: str, added: list[NodeProto], names: NameScope):
        self.model, self.input_name, self.added, self.names = model, input_name, added, names
        self.name: str | None = None

    def tensor(self) -> str:
        from onnx import helper

        if self.name is None:
            self.name = f"{self.input_name}/batch_size"
            if opset_version(self.model) >= 15:
                self.added.append(helper.make_node("Shape", [self.input_name], [self.name], name=self.name, start=0, end=1))
            else:
                whole = f"{self.name}/shape"
                self.added.append(helper.make_node("Shape", [self.input_name], [whole], name=whole))
                self.added.append(helper.make_node("Slice", [whole, _constant(self.model, self.names(f"{self.name}/0"), np.array([0])),
                                                            _constant(self.model, self.names(f"{self.name}/1"), np.array([1]))],
                                                   [self.name], name=self.name))
        return self.name

    def concat(self, value: np.ndarray, at: list[int], node_name: str) -> str:
        from onnx import helper

        parts: list[str] = []
        run: list[int] = []
        for k, v in enumerate(value.tolist()):
            if k in at:
                if run:
                    parts.append(_constant(self.model, self.names(f"{node_name}/shape_part"), np.array(run)))
                    run = []
                parts.append(self.tensor())
            else:
                run.append(v)
        if run:
            parts.append(_constant(self.model, self.names(f"{node_name}/shape_part"), np.array(run)))
        out = f"{node_name}{_WITH_BATCH}"
        self.added.append(helper.make_node("Concat", parts, [out], name=out, axis=0))
        return out
