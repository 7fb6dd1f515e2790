"""Merge linear layers that read the same activation into one GEMM, before quantization (issue 47).

Separate query/key/value layers (one ``nn.Linear`` each per block, or per head: a DeiT whose heads are a
``ModuleList`` of ``Linear(dim, head_dim)`` for q, k and v) export as several MatMuls reading one LayerNorm output.
Quantized as they are, they share one activation QuantizeLinear -> DequantizeLinear pair, and ONNX Runtime runs a
MatMul whose DequantizeLinear has a second reader in float, dequantizing its weight on every run (measured 0.20-0.74x
FP32's speed on such a DeiT); even with a DequantizeLinear each, 3 x heads GEMMs of ``head_dim`` columns are far
slower than one. So ``merge_sibling_linears`` rewrites the FP32 graph: ``x -> MatMul(W_i) [-> Add(b_i)]`` for every
sibling becomes ``x -> MatMul([W_1 .. W_n]) [-> Add([b_1 .. b_n])] -> Split``, whose outputs keep the original
tensor names, so everything after them is untouched. Concatenating columns is exact (each output column is the same
dot product as before); the rewrite is still checked numerically on a random input, and undone if it differs.

The columns go in the order the attention reads them: every query, then every key, then every value (each group in
graph order, which is head order for a ``ModuleList``), found by following each output to the attention matmuls. So
a per-head model's merged output is laid out as a packed ``[q | k | v]`` tensor like timm's, which the onnx target's
attention fusion turns into one MultiHeadAttention per block. Nothing here reads a tensor or node name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.onnxkit.session import SessionSettings, ort_session
from vitedge.onnxkit.structure import NameScope, cleanup, graph_inputs, node_index, splice_nodes

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

# Between a projection and the attention matmul reading it: data movement and scalar scaling only.
_PASS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Cast", "Mul", "Div", "Split", "Slice", "Gather"})
_ROLE_RANK = {"q": 0, "k": 1, "v": 2}
REL_TOL = 1e-4  # of the largest output magnitude: float32 GEMMs of a different width differ by ~1e-6 of it


@dataclass(frozen=True)
class LinearMerge:
    """What ``merge_sibling_linears`` did."""

    groups: int  # sets of sibling linear layers found
    merged: int  # of them, now one GEMM
    layers: int  # linear layers folded into those GEMMs
    skipped: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"groups": self.groups, "merged": self.merged, "layers": self.layers, "skipped": list(self.skipped)}


@dataclass
class _Linear:
    matmul: Any
    weight: np.ndarray  # [K, N]
    add: Any | None  # the bias Add, if any
    bias: np.ndarray | None
    out: str  # the tensor the rest of the graph reads (the Add's output, else the MatMul's)
    order: int
    role: str = ""


class _Index:
    def __init__(self, model: ModelProto, constant: Callable[[str], Any] | None):
        from onnx import numpy_helper

        self.model = model
        self.nodes = list(model.graph.node)
        idx = node_index(self.nodes)
        self.producer, self.readers = idx.producer, idx.readers
        self.outputs = {o.name for o in model.graph.output}
        self.inits = {t.name: t for t in model.graph.initializer}
        self._array = numpy_helper.to_array
        self.constant = constant  # name -> the value of a computed constant, else None

    def const(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor (an initializer, or computed from initializers: a Gemm's weight
        written as Transpose(Split(packed)) by the TorchScript exporter), else None."""
        if name in self.inits:
            return self._array(self.inits[name])
        if self.constant is None:
            return None
        try:
            value = self.constant(name)
        except Exception:  # noqa: BLE001 - a constant that cannot be evaluated here is no weight to merge
            return None
        return None if value is None else np.asarray(value)


def _gemm_linear(ix: _Index, gemm: NodeProto, order: int) -> _Linear | None:
    """A Gemm y = x W^T + b (or x W + b) with constant W and b, as the same MatMul + Add."""
    a = {x.name: x for x in gemm.attribute}
    if (a["transA"].i if "transA" in a else 0) or (a["alpha"].f if "alpha" in a else 1.0) != 1.0 or (
            a["beta"].f if "beta" in a else 1.0) != 1.0 or len(gemm.input) < 2:
        return None
    w = ix.const(gemm.input[1])
    if w is None or w.ndim != 2 or w.dtype != np.float32 or gemm.output[0] in ix.outputs:
        return None
    w = w.T if (a["transB"].i if "transB" in a else 0) else w
    b = ix.const(gemm.input[2]) if len(gemm.input) > 2 and gemm.input[2] else None
    if b is not None and (b.dtype != np.float32 or b.size != w.shape[1]):
        return None
    return _Linear(gemm, w, None, None if b is None else b.reshape(-1), gemm.output[0], order)


def _linear(ix: _Index, mm: NodeProto, order: int) -> _Linear | None:
    if mm.op_type == "Gemm" and mm.domain in ("", "ai.onnx"):
        return _gemm_linear(ix, mm, order)
    if mm.op_type != "MatMul" or mm.domain not in ("", "ai.onnx") or len(mm.input) != 2:
        return None
    w = ix.const(mm.input[1])
    if w is None or w.ndim != 2 or w.dtype != np.float32 or mm.output[0] in ix.outputs:
        return None
    readers = ix.readers(mm.output[0])
    if len(readers) == 1 and readers[0].op_type == "Add" and readers[0].domain in ("", "ai.onnx"):
        add = readers[0]
        other = add.input[1] if add.input[0] == mm.output[0] else add.input[0]
        b = ix.const(other) if other != mm.output[0] else None
        if b is not None and b.dtype == np.float32 and b.size == w.shape[1] and b.shape[-1:] == (w.shape[1],):
            return _Linear(mm, w, add, b.reshape(-1), add.output[0], order)
    return _Linear(mm, w, None, None, mm.output[0], order)


def _from_softmax(ix: _Index, tensor: str) -> bool:
    for _ in range(6):
        node = ix.producer.get(tensor)
        if node is None:
            return False
        if node.op_type == "Softmax":
            return True
        if node.op_type not in ("Cast", "Identity", "Reshape"):
            return False
        tensor = node.input[0]
    return False


def _role(ix: _Index, tensor: str) -> str:
    """"q", "k" or "v" when ``tensor`` reaches an attention matmul in that place, else ""."""
    todo, seen = [tensor], set()
    while todo and len(seen) < 64:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        for node in ix.readers(t):
            if node.op_type == "MatMul" and ix.const(node.input[1]) is None and ix.const(node.input[0]) is None:
                if node.input[0] == t:
                    return "" if _from_softmax(ix, t) else "q"
                return "v" if _from_softmax(ix, node.input[0]) else "k"
            if node.op_type in _PASS:
                todo.extend(o for o in node.output if o)
    return ""


def _groups(ix: _Index) -> list[list[_Linear]]:
    by_input: dict[str, list[_Linear]] = {}
    for k, node in enumerate(ix.nodes):
        lin = _linear(ix, node, k)
        if lin is not None:
            by_input.setdefault(node.input[0], []).append(lin)
    return [g for g in by_input.values() if len(g) > 1]


def _rewrite(ix: _Index, group: list[_Linear], names: NameScope) -> list[Any]:
    from onnx import helper, numpy_helper

    first = group[0].matmul
    base = names(f"{first.name or 'MatMul'}/merged")
    w = np.concatenate([l.weight for l in group], axis=1)
    w_name, mm_out = names(f"{base}.weight"), names(f"{base}_output")
    ix.model.graph.initializer.append(numpy_helper.from_array(w, w_name))
    nodes = [helper.make_node("MatMul", [first.input[0], w_name], [mm_out], name=base)]
    if group[0].bias is not None:
        b_name, out = names(f"{base}.bias"), names(f"{base}_biased")
        ix.model.graph.initializer.append(numpy_helper.from_array(np.concatenate([l.bias for l in group]), b_name))
        nodes.append(helper.make_node("Add", [mm_out, b_name], [out], name=names(f"{base}/bias_Add")))
        mm_out = out
    sizes = names(f"{base}.split")
    ix.model.graph.initializer.append(numpy_helper.from_array(np.array([l.weight.shape[1] for l in group], dtype=np.int64), sizes))
    nodes.append(helper.make_node("Split", [mm_out, sizes], [l.out for l in group], axis=-1, name=names(f"{base}/Split")))
    return nodes


def _run(model: ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort_session(model.SerializeToString(), SessionSettings(optimization="disabled"))
    return [np.asarray(v) for v in sess.run(None, feed)]


def _probe_feed(model: ModelProto) -> dict[str, np.ndarray]:
    from onnx import helper

    feed = {}
    rng = np.random.default_rng(0)
    for inp in graph_inputs(model):
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 2 for d in inp.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        feed[inp.name] = (rng.integers(0, 256, size=dims) if np.issubdtype(dtype, np.integer) else rng.standard_normal(dims)).astype(dtype)
    return feed


def _same(before: list[np.ndarray], after: list[np.ndarray]) -> str | None:
    for a, b in zip(before, after):
        peak = max(float(np.max(np.abs(a))) if a.size else 0.0, 1e-6)
        if a.shape != b.shape or not np.all(np.isfinite(b) == np.isfinite(a)):
            return "the merged graph's outputs differ in shape or finiteness"
        diff = float(np.max(np.abs(np.nan_to_num(a) - np.nan_to_num(b)))) if a.size else 0.0
        if diff > REL_TOL * peak:
            return f"the merged graph's outputs differ by {diff:.3g} (max |output| {peak:.3g})"
    return None


def merge_sibling_linears(model: ModelProto, *, check: bool = True, constant: Callable[[str], Any] | None = None) -> LinearMerge:
    """Merge every set of MatMuls (and Gemms) with constant 2-D weights reading one activation into one MatMul (in
    place); their bias Adds too when every one has one. ``check``: run the graph before and after on one random
    input and keep the rewrite only when the outputs agree. ``constant``: the value of a tensor computed from
    constants (a weight behind Transpose / Split), or None; initializers are read without it."""
    import onnx

    ix = _Index(model, constant)
    groups = _groups(ix)
    if not groups:
        return LinearMerge(0, 0, 0)
    before = onnx.ModelProto()
    if check:
        before.CopyFrom(model)
    names = NameScope(model)
    added, drop, skipped, layers = [], set(), [], 0
    for group in groups:
        if len({l.weight.shape[0] for l in group}) != 1 or len({l.bias is None for l in group}) != 1:
            skipped.append(f"{group[0].matmul.name}: siblings differ in input width or in having a bias")
            continue
        for l in group:
            l.role = _role(ix, l.out)
        group.sort(key=lambda l: (_ROLE_RANK.get(l.role, 3), l.order))
        added.extend(_rewrite(ix, group, names))
        drop.update(id(n) for l in group for n in (l.matmul, l.add) if n is not None)
        layers += len(group)
    if not added:
        return LinearMerge(len(groups), 0, 0, tuple(skipped))
    splice_nodes(model, ix.nodes, added, drop)
    cleanup(model)
    if check:
        feed = _probe_feed(before)
        why = _same(_run(before, feed), _run(model, feed))
        if why is not None:
            model.CopyFrom(before)
            return LinearMerge(len(groups), 0, 0, tuple(skipped) + (why,))
    return LinearMerge(len(groups), len(groups) - len(skipped), layers, tuple(skipped))
