"""The structure of an FP32 ViT graph, read from op types, constant-ness and topology.

Nothing here looks at tensor or node *names* to decide anything, so the same rules
cover timm, torchvision (packed ``in_proj``), ``nn.TransformerEncoder`` (pre- or
post-norm), Hugging Face and hand-written ViTs:

* a **linear** layer is a MatMul whose second input is a constant 2-D matrix, or a Gemm
  (transA=0) with a constant B; a Conv with a constant weight is a layer too;
* an **attention matmul** is a MatMul whose two inputs are both activations
  (Q.K^T and P.V);
* a linear layer whose input comes from a graph input through data movement only
  (Reshape, Transpose, ...) is the **patch embedding**, as is a Conv whose kernel
  equals its stride (patchify); other Convs (a hybrid's ResNet stem) are **conv**;
* a linear layer with a path to a graph output that meets no other layer and no
  LayerNormalization is a **head** (DeiT-distilled has two);
* a MatMul whose activation is a constant repeated over the batch (the MAP attention
  pool's learned query) is no layer: it stays float.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.core.errors import QuantizationError
from vitedge.quantize.merge import merge_sibling_linears
from vitedge.onnxkit.files import is_large, weightless_copy
from vitedge.onnxkit.structure import graph_inputs, node_index, opset_imports, opset_version

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

# Ops that only move or select data: a patch embedding's input reaches it through these.
DATA_MOVEMENT = frozenset({
    "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice", "Gather",
    "Concat", "Split", "Expand", "Pad", "SpaceToDepth", "DepthToSpace", "Tile",
})
# Ops whose later inputs are shapes / indices / axes, not data.
_DATA_INPUT0_ONLY = frozenset({
    "Reshape", "Expand", "Tile", "Slice", "Pad", "Unsqueeze", "Squeeze", "ConstantOfShape",
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "Resize", "TopK", "Split",
})
_SHAPE_OPS = frozenset({"Shape", "Size"})
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"})


@dataclass(frozen=True)
class QuantLayer:
    """A node vitedge can run in INT8, named by its ONNX node name (stable across runs)."""

    name: str  # the ONNX node name
    kind: str  # linear | patch_embed | head | conv | attention_matmul
    op_type: str  # MatMul | Gemm | Conv
    inputs: tuple[str, ...]  # the activation tensors that get a Q/DQ pair (1, or 2 for attention)
    weight: str | None = None  # constant weight tensor (None for attention matmuls)
    weight_axis: int | None = None  # the weight's output-channel axis
    channels: int | None = None  # output channels (length of the per-channel scale)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "op_type": self.op_type, "inputs": list(self.inputs),
                "weight": self.weight, "weight_axis": self.weight_axis, "channels": self.channels}


def attr(node: NodeProto, name: str, default: object = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


class GraphIndex:
    """Producers, consumers, constant-ness and ranks of one ModelProto (read-only view)."""

    def __init__(self, model: ModelProto):
        self.model = model
        g = model.graph
        self.inits = {t.name: t for t in g.initializer}
        index = node_index(g.node)
        self.producer: dict[str, Any] = index.producer
        self.consumers: dict[str, list[tuple[Any, int]]] = index.consumers
        self.graph_inputs = [i.name for i in graph_inputs(g)]
        self.graph_outputs = {o.name for o in g.output}
        self.nodes_by_name = {n.name: n for n in g.node}
        self.const: set[str] = set(self.inits)
        for node in g.node:  # graph order is topological
            ins = [i for i in node.input if i]
            if node.op_type in _NONDETERMINISTIC:
                continue
            if node.op_type == "Constant" or (ins and all(i in self.const for i in ins)):
                self.const.update(o for o in node.output if o)
        self.ranks: dict[str, int] = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            t = vi.type.tensor_type
            if t.HasField("shape"):
                self.ranks[vi.name] = len(t.shape.dim)
        for name, t in self.inits.items():
            self.ranks[name] = len(t.dims)
        self._values: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ constants
    def is_const(self, name: str) -> bool:
        return name in self.const

    def value(self, name: str) -> np.ndarray:
        """The value of a constant tensor (initializer, Constant node, or computed from them)."""
        from onnx import numpy_helper

        if name in self._values:
            return self._values[name]
        if name not in self.const:
            raise QuantizationError(f"tensor '{name}' is not a constant")
        if name in self.inits:
            v = numpy_helper.to_array(self.inits[name])
        else:
            node = self.producer[name]
            if node.op_type == "Constant":
                v = _constant_node_value(node)
            elif node.op_type == "Identity":
                v = self.value(node.input[0])
            else:
                v = self._evaluate(name)
        self._values[name] = v
        return v

    def _evaluate(self, name: str) -> np.ndarray:
        from onnx import helper, numpy_helper
        from onnx.reference import ReferenceEvaluator

        needed: list[Any] = []
        seen: set[str] = set()
        feeds: dict[str, np.ndarray] = {}

        def visit(t: str) -> None:
            if t in seen or not t:
                return
            seen.add(t)
            if t in self.inits:
                feeds[t] = numpy_helper.to_array(self.inits[t])
                return
            node = self.producer[t]
            for i in node.input:
                visit(i)
            if node not in needed:
                needed.append(node)

        visit(name)
        order = {id(n): k for k, n in enumerate(self.model.graph.node)}
        needed.sort(key=lambda n: order[id(n)])
        inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
        out = helper.make_tensor_value_info(name, 0, None)
        graph = helper.make_graph(needed, "fold", inputs, [out])
        sub = helper.make_model(graph, opset_imports=opset_imports(self.model))
        return np.asarray(ReferenceEvaluator(sub).run(None, feeds)[0])

    # ------------------------------------------------------------------ topology
    def data_consumers(self, name: str) -> Iterator[tuple[Any, int]]:
        """Consumers that read the tensor's values (not only its shape)."""
        for node, idx in self.consumers.get(name, ()):
            if node.op_type in _SHAPE_OPS:
                continue
            if idx > 0 and node.op_type in _DATA_INPUT0_ONLY:
                continue
            yield node, idx

    def rank(self, name: str) -> int | None:
        return self.ranks.get(name)


def _constant_node_value(node: NodeProto) -> np.ndarray:
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name in ("value_float", "value_int"):
            return np.asarray(a.f if a.name == "value_float" else a.i)
        if a.name in ("value_floats", "value_ints"):
            return np.asarray(list(a.floats) if a.name == "value_floats" else list(a.ints))
    raise QuantizationError(f"Constant node '{node.name}' has a value vitedge cannot read")


# --------------------------------------------------------------------------- preparation


def prepare(model: ModelProto) -> Any:
    """A copy of the FP32 graph ready for analysis: every node has a unique name and shapes
    are inferred (ranks let SmoothQuant follow channels through Transposes)."""
    import onnx

    opset = opset_version(model)
    if opset < 13:
        raise QuantizationError(f"the FP32 graph uses opset {opset}; per-channel Q/DQ needs opset 13 or newer: re-export it (vitedge export uses 17)")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    used: set[str] = set()
    for k, node in enumerate(m.graph.node):
        name = node.name or f"{node.op_type}_{k}"
        while name in used:
            name = f"{name}_{k}"
        node.name = name
        used.add(name)
    gi = GraphIndex(m)  # q/k/v layers reading one activation: one GEMM (quantize/merge.py)
    merge_sibling_linears(m, check=not is_large(m), constant=lambda name: gi.value(name) if gi.is_const(name) else None)
    try:
        if is_large(m):  # past 2 GB infer_shapes cannot serialize the graph: infer on it without its weights
            inferred = onnx.shape_inference.infer_shapes(weightless_copy(m), strict_mode=False)
            del m.graph.value_info[:]
            m.graph.value_info.extend(inferred.graph.value_info)
        else:
            m = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # shapes are a help, not a requirement
        pass
    return m


# --------------------------------------------------------------------------- layers


def find_layers(gi: GraphIndex) -> list[QuantLayer]:
    """Every quantizable node, in graph order, with its kind."""
    raw: list[tuple[Any, str, tuple[str, ...], str | None, int | None, int | None]] = []
    for node in gi.model.graph.node:
        op = node.op_type
        if op == "MatMul" and len(node.input) == 2:
            a, b = node.input
            if gi.is_const(a) or _broadcast_constant(gi, a):
                continue
            if gi.is_const(b):
                w = gi.value(b)
                if w.ndim != 2 or not np.issubdtype(w.dtype, np.floating):
                    continue
                raw.append((node, "linear", (a,), b, 1, int(w.shape[1])))
            else:
                raw.append((node, "attention_matmul", (a, b), None, None, None))
        elif op == "Gemm" and len(node.input) >= 2:
            a, b = node.input[0], node.input[1]
            if gi.is_const(a) or not gi.is_const(b) or attr(node, "transA", 0):
                continue
            w = gi.value(b)
            if w.ndim != 2 or not np.issubdtype(w.dtype, np.floating):
                continue
            axis = 0 if attr(node, "transB", 0) else 1
            raw.append((node, "linear", (a,), b, axis, int(w.shape[axis])))
        elif op == "Conv" and len(node.input) >= 2:
            x, wname = node.input[0], node.input[1]
            if gi.is_const(x) or not gi.is_const(wname):
                continue
            w = gi.value(wname)
            if not np.issubdtype(w.dtype, np.floating):
                continue
            kernel = list(attr(node, "kernel_shape", None) or w.shape[2:])
            strides = list(attr(node, "strides", None) or [1] * len(kernel))
            patchify = kernel == strides and int(attr(node, "group", 1)) == 1 and max(kernel, default=1) > 1
            raw.append((node, "patch_embed" if patchify else "conv", (x,), wname, 0, int(w.shape[0])))

    layer_nodes = {id(r[0]) for r in raw}
    pool_kv = _attention_pool_kv(gi, raw, layer_nodes)
    layers: list[QuantLayer] = []
    for node, kind, inputs, weight, axis, channels in raw:
        if kind == "linear":
            if _from_graph_input(gi, inputs[0]):
                kind = "patch_embed"
            elif _reaches_output(gi, node, layer_nodes):
                kind = "head"
            elif node.name in pool_kv:
                kind = "pool_kv"
        layers.append(QuantLayer(node.name, kind, node.op_type, inputs, weight, axis, channels))
    return layers


def _attention_pool_kv(gi: GraphIndex, raw: list, layer_nodes: set[int]) -> set[str]:
    """The key/value projections of attention pooling: attention whose query is a learned
    constant (a MatMul on a batch-broadcast constant, e.g. the MAP head's latent). With one
    query, INT8 noise in the keys moves the pooling weights over every token (measured in
    benchmarks/results/families.md), so these projections are their own kind, float by default."""
    queries = {o for n in gi.model.graph.node if n.op_type == "MatMul" and len(n.input) == 2 and not gi.is_const(n.input[0])
               and _broadcast_constant(gi, n.input[0]) for o in n.output}
    if not queries:
        return set()
    found: set[str] = set()
    for node, kind, inputs, *_ in raw:
        if kind != "attention_matmul":
            continue
        reached = [_layers_behind(gi, t, layer_nodes, queries) for t in inputs]
        if any(q for q, _ in reached):
            for _, names in reached:
                found |= names
    return found


def _layers_behind(gi: GraphIndex, tensor: str, layer_nodes: set[int], marks: set[str]) -> tuple[bool, set[str]]:
    """(whether a tensor in ``marks`` is behind ``tensor``, the layers met first on the way back)."""
    todo, seen, names, hit = [tensor], set(), set(), False
    while todo and len(seen) < 200:
        t = todo.pop()
        if t in seen or gi.is_const(t):
            continue
        seen.add(t)
        if t in marks:
            hit = True
            continue
        node = gi.producer.get(t)
        if node is None:
            continue
        if id(node) in layer_nodes:
            names.add(node.name)
            continue
        todo.extend(i for i in (node.input[:1] if node.op_type in _DATA_INPUT0_ONLY else node.input) if i)
    return hit, names


# Ops that copy a constant over the batch without computing on it.
_BROADCAST = frozenset({"Expand", "Tile", "Reshape", "Transpose", "Identity", "Unsqueeze", "Squeeze"})


def _broadcast_constant(gi: GraphIndex, tensor: str) -> bool:
    """True when ``tensor`` is a constant repeated over the batch (Expand / Tile of a constant):
    a learned query such as the MAP attention pool's latent. Its projection stays float;
    an INT8 pair would only round a constant."""
    seen = 0
    while tensor and seen < 16:
        if gi.is_const(tensor):
            return seen > 0
        node = gi.producer.get(tensor)
        if node is None or node.op_type not in _BROADCAST or not node.input:
            return False
        tensor, seen = node.input[0], seen + 1
    return False


def _from_graph_input(gi: GraphIndex, tensor: str) -> bool:
    """True when ``tensor`` is a graph input moved/selected by data-movement ops only."""
    todo, seen = [tensor], set()
    found = False
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in gi.graph_inputs:
            found = True
            continue
        if gi.is_const(t):
            continue
        node = gi.producer.get(t)
        if node is None or node.op_type not in DATA_MOVEMENT:
            return False
        todo.extend(i for i in node.input if i)
    return found


def _reaches_output(gi: GraphIndex, start: NodeProto, layer_nodes: set[int]) -> bool:
    """A data path from ``start``'s output to a graph output meeting no layer and no LayerNorm."""
    todo = [o for o in start.output if o]
    seen: set[str] = set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in gi.graph_outputs:
            return True
        for node, _ in gi.data_consumers(t):
            if id(node) in layer_nodes or node.op_type == "LayerNormalization":
                continue
            todo.extend(o for o in node.output if o)
    return False


def softmax_outputs(gi: GraphIndex, tensors: Iterable[str]) -> set[str]:
    """The tensors that are a Softmax's output, possibly moved by data-movement ops."""
    found = set()
    for t in tensors:
        cur = t
        while True:
            node = gi.producer.get(cur)
            if node is None:
                break
            if node.op_type == "Softmax":
                found.add(t)
                break
            if node.op_type not in DATA_MOVEMENT or not node.input:
                break
            cur = node.input[0]
    return found


# --------------------------------------------------------------------------- SmoothQuant sites


@dataclass(frozen=True)
class SmoothSite:
    """A LayerNormalization whose output (through channel-preserving ops) feeds linear layers.

    ``inputs`` are the linear layers' activation tensors (the LN output or a Transpose /
    Gather of it); ``shared`` says the LN output also feeds something else (a post-norm
    residual Add), so the scale cannot be folded into gamma/beta without changing it.
    """

    norm: str  # LayerNormalization node name
    output: str  # its output tensor
    channels: int
    layers: tuple[str, ...]  # the linear layers it feeds (node names)
    inputs: tuple[str, ...]  # their activation tensors
    shared: bool


def find_smooth_sites(gi: GraphIndex, layers: Iterable[QuantLayer]) -> list[SmoothSite]:
    linear = {l.name: l for l in layers if l.weight is not None and l.op_type in ("MatMul", "Gemm")}
    sites: list[SmoothSite] = []
    for node in gi.model.graph.node:
        if node.op_type != "LayerNormalization" or len(node.input) < 2 or not gi.is_const(node.input[1]):
            continue
        if len(node.input) > 2 and node.input[2] and not gi.is_const(node.input[2]):
            continue
        out = node.output[0]
        rank = gi.rank(out)
        axis = int(attr(node, "axis", -1))
        if rank is None or axis not in (-1, rank - 1):
            continue
        channels = int(np.asarray(gi.value(node.input[1])).size)
        found: list[QuantLayer] = []
        inputs: list[str] = []
        shared = False
        todo, seen = [(out, rank)], set()
        while todo:
            t, r = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            for consumer, idx in gi.consumers.get(t, ()):
                if consumer.op_type in _SHAPE_OPS:
                    continue
                layer = linear.get(consumer.name)
                if layer is not None and idx == 0 and _input_channels(gi, layer) == channels:
                    found.append(layer)
                    if t not in inputs:
                        inputs.append(t)
                    continue
                nxt = _channel_preserving(gi, consumer, idx, r)
                if nxt is None:
                    shared = True
                    continue
                todo.append(nxt)
        if found:
            names = tuple(dict.fromkeys(l.name for l in found))
            sites.append(SmoothSite(node.name, out, channels, names, tuple(inputs), shared))
    return sites


def _input_channels(gi: GraphIndex, layer: QuantLayer) -> int:
    w = gi.value(layer.weight)  # type: ignore[arg-type]
    return int(w.shape[1 - layer.weight_axis])  # type: ignore[operator]


def _channel_preserving(gi: GraphIndex, node: NodeProto, idx: int, rank: int) -> tuple[str, int] | None:
    """The output of ``node`` when it keeps the last (channel) axis last, else None."""
    if idx != 0 or not node.output:
        return None
    out = node.output[0]
    if node.op_type == "Identity":
        return out, rank
    if node.op_type == "Transpose":
        perm = list(attr(node, "perm", None) or reversed(range(rank)))
        return (out, rank) if perm and perm[-1] == rank - 1 else None
    if node.op_type == "Gather":
        axis = int(attr(node, "axis", 0))
        axis = axis + rank if axis < 0 else axis
        if axis == rank - 1:
            return None
        out_rank = gi.rank(out)
        return (out, out_rank) if out_rank is not None else None
    return None

