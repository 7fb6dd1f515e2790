"""An ONNX graph's structure, read and edited: opsets (``opset_version``, ``opset_imports``,
``require_opset_import``), the inputs a caller feeds (``graph_inputs``), the producer and consumers
of each tensor (``node_index``), dependency order (``topological_sort``, ``splice_nodes``), dead
nodes and initializers dropped (``cleanup``) and unique names for what a rewrite adds (``NameScope``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vitedge.core.errors import ModelLoadError

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto


STANDARD_DOMAINS = ("", "ai.onnx")  # two spellings of the standard ONNX operator domain


def opset_version(model: ModelProto, domain: str = "") -> int:
    """The opset version a ModelProto imports for ``domain`` ("" or "ai.onnx": the standard
    domain); 0 when it imports none."""
    domains = STANDARD_DOMAINS if domain in STANDARD_DOMAINS else (domain,)
    return max((o.version for o in model.opset_import if o.domain in domains), default=0)


def opset_imports(model: ModelProto) -> list[Any]:
    """Every opset a ModelProto imports (OperatorSetIdProto entries), e.g. for a model built
    from part of its graph."""
    return list(model.opset_import)


def require_opset_import(model: ModelProto, domain: str, version: int) -> None:
    """Import ``domain`` at ``version`` unless the ModelProto already imports that domain (in place)."""
    if not any(o.domain == domain for o in model.opset_import):
        from onnx import helper

        model.opset_import.append(helper.make_opsetid(domain, version))


def _graph(model_or_graph: ModelProto | GraphProto) -> Any:
    graph = getattr(model_or_graph, "graph", None)  # a ModelProto has one; a GraphProto is one
    return model_or_graph if graph is None else graph


def graph_inputs(model_or_graph: ModelProto | GraphProto) -> list[Any]:
    """The inputs a caller feeds (ValueInfoProto, in graph order): the graph's inputs less its
    initializers, which graphs written for opset < 9 list among the inputs too."""
    g = _graph(model_or_graph)
    inits = {t.name for t in g.initializer}
    return [i for i in g.input if i.name not in inits]


@dataclass(frozen=True)
class NodeIndex:
    """Who writes and who reads each tensor of a list of nodes (empty names, i.e. omitted optional
    inputs and outputs, are left out)."""

    producer: dict[str, Any]  # tensor -> the node writing it
    consumers: dict[str, list[tuple[Any, int]]]  # tensor -> (node, input index) per read, in node order

    def readers(self, tensor: str) -> list[Any]:
        """The nodes reading ``tensor``, once per read (a node reading it twice is listed twice)."""
        return [node for node, _ in self.consumers.get(tensor, ())]


def node_index(nodes: Iterable[Any]) -> NodeIndex:
    """The producer and consumers of every tensor of ``nodes`` (e.g. ``model.graph.node``)."""
    producer: dict[str, Any] = {}
    consumers: dict[str, list[tuple[Any, int]]] = {}
    for node in nodes:
        for out in node.output:
            if out:
                producer[out] = node
        for i, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, i))
    return NodeIndex(producer, consumers)


def topological_sort(nodes: Iterable[Any]) -> list[Any]:
    """``nodes`` ordered so that each comes after the nodes writing its inputs, moving as little
    as possible: a node whose inputs are ready when its turn comes keeps its place; one listed
    before a producer of its inputs waits, and comes right after the node writing the last of
    them (nodes waiting on one node: by that node's output order, then in list order), followed
    at once by whatever was waiting on it in turn. So an already sorted list comes back as it
    was, and a rewrite can list its new nodes first: each lands right after the tensor it reads
    is written. A tensor no node in the list writes (graph input, initializer) is available from
    the start. A cycle is a ModelLoadError."""
    nodes = list(nodes)
    written = set(node_index(nodes).producer)
    done: set[str] = set()
    missing: dict[int, int] = {}  # id(node) -> how many of its inputs are still to be written
    waiting: dict[str, list[Any]] = {}  # tensor -> nodes waiting for it, in list order
    order: list[Any] = []

    def place(first: NodeProto) -> None:
        stack = [iter([first])]
        while stack:
            node = next(stack[-1], None)
            if node is None:
                stack.pop()
                continue
            order.append(node)
            ready = []
            for out in node.output:
                done.add(out)
                for other in waiting.pop(out, ()):
                    missing[id(other)] -= 1
                    if not missing[id(other)]:
                        ready.append(other)
            stack.append(iter(ready))

    for node in nodes:
        needs = {t for t in node.input if t and t in written and t not in done}
        if not needs:
            place(node)
            continue
        missing[id(node)] = len(needs)
        for t in sorted(needs):
            waiting.setdefault(t, []).append(node)
    if len(order) != len(nodes):
        placed = {id(n) for n in order}
        stuck = next(n for n in nodes if id(n) not in placed)
        raise ModelLoadError(f"the ONNX graph has a cycle: node '{stuck.name or stuck.op_type}' reads a tensor written "
                             f"only downstream of itself ({len(nodes) - len(order)} node(s) cannot be ordered)")
    return order


def splice_nodes(model: ModelProto, nodes: list[Any], added: list[Any], drop: set[int]) -> None:
    """Make ``model``'s nodes ``nodes`` (held by the caller, so each id() is its own) without those whose id() is
    in ``drop``, plus ``added``, in dependency order (``topological_sort``: each new node lands where its inputs
    are written). In place."""
    ordered = topological_sort(added + [n for n in nodes if id(n) not in drop])
    del model.graph.node[:]
    model.graph.node.extend(ordered)


def computing_nodes(graph: GraphProto) -> int:
    """The nodes other than Constant: what a rewrite counts as removed after ``cleanup``."""
    return sum(n.op_type != "Constant" for n in graph.node)


def cleanup(model: ModelProto) -> None:
    """Drop nodes whose outputs nobody reads and initializers no node reads (in place)."""
    g = model.graph
    outputs = {o.name for o in g.output}
    while True:
        used = {i for n in g.node for i in n.input if i} | outputs
        keep = [n for n in g.node if any(o in used for o in n.output if o)]
        if len(keep) == len(g.node):
            break
        del g.node[:]
        g.node.extend(keep)
    used = {i for n in g.node for i in n.input if i} | outputs
    # deleted one by one: clearing and re-adding the kept ones would copy every weight (upb
    # protobuf keeps the old copies in the message's arena too: +2.5 GB per call for vit_h_14)
    for k in reversed([k for k, t in enumerate(g.initializer) if t.name not in used]):
        del g.initializer[k]
    produced = {o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {i.name for i in g.input}
    vis = [v for v in g.value_info if v.name in produced]
    if len(vis) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(vis)


class NameScope:
    """Unique tensor / node names for what a rewrite adds to a graph."""

    def __init__(self, model: ModelProto):
        g = model.graph
        self.used = {t.name for t in g.initializer} | {i.name for i in g.input} | {o.name for o in g.output}
        for n in g.node:
            self.used.add(n.name)
            self.used.update(n.input)
            self.used.update(n.output)

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name
