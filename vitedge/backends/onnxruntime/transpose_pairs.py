"""Transposes that undo each other around row-wise layers go (issue 47 item 2: fewer shape ops in the onnx target).

A sequence-first attention export (``nn.MultiheadAttention``, ``nn.TransformerEncoder``) and the fused attention the
onnx target writes in its place meet in Transposes: ``LayerNorm -> Transpose(1,0,2) -> q/k/v GEMM -> Transpose(1,0,2)
-> Split -> MultiHeadAttention -> Transpose(1,0,2) -> Reshape(2-D) -> output GEMM -> Reshape(3-D) ->
Transpose(1,0,2) -> residual Add``. Between the two Transposes of each pair every op works on each vector along the
last axis alone (a GEMM on a constant weight, its bias, per-tensor quantization, a flatten of the leading axes to 2-D
and back), so the pair computes nothing: ONNX Runtime still runs both, each a copy of the whole activation (measured
with ONNX Runtime 1.32 on an AVX2 CPU at one thread: benchmarks/results/onnx_shape_ops_avx2.md).

``cancel_transpose_pairs`` removes such a pair: ``Transpose(p) -> ops -> Transpose(q)`` where ``q`` undoes ``p``,
``p`` keeps the last axis, and every op between them is one of ``_ROW_WISE`` on constant weights of the shapes below,
each intermediate tensor read by the next op alone. The ops then run in the first Transpose's input layout; a
Reshape back from 2-D gets its shape permuted alike. Each output element is computed from the same numbers by the
same kernels (row order in a GEMM changes nothing of a row's arithmetic), so outputs are unchanged up to the
GEMM kernel's choice of blocking. Applied to the INT8 graph and its FP32 reference alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vitedge.onnxkit.structure import NodeIndex, node_index

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto, TensorProto

_UNARY = frozenset({"Relu", "Gelu", "Erf", "Sigmoid", "Tanh", "FastGelu", "QuickGelu"})
_BROADCAST = frozenset({"Add", "Mul", "Sub", "Div"})
_MAX_CHAIN = 12


def cancel_transpose_pairs(model: ModelProto) -> int:
    """Remove each pair of Transposes that undo each other around row-wise ops (module docstring), in place; returns
    how many pairs."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    done = 0
    starts = [n.output[0] for n in graph.node if n.op_type == "Transpose"]  # nodes are known by their output's name
    index = node_index(graph.node)
    for start in starts:
        first = index.producer.get(start)
        if first is None or first.op_type != "Transpose":  # removed with an earlier pair
            continue
        found = _pair(first, index, inits, outputs)
        if found is None:
            continue
        second, chain, reshape_back = found
        _rewrite(model, first, second, chain, reshape_back, index)
        index = node_index(graph.node)  # the rewrite rewired readers and dropped two nodes
        done += 1
    return done


def _perm(node: NodeProto) -> list[int]:
    return [int(v) for a in node.attribute if a.name == "perm" for v in a.ints]


def _pair(first: NodeProto, index: NodeIndex, inits: dict[str, TensorProto], outputs: set[str]):
    """(the second Transpose, the ops between, the Reshape back from 2-D or None), or None when ``first`` starts no
    removable pair."""
    p = _perm(first)
    if not p or p[-1] != len(p) - 1 or p == list(range(len(p))):
        return None
    tensor, chain, flat, back = first.output[0], [], False, None
    for _ in range(_MAX_CHAIN):
        readers = index.consumers.get(tensor, ())
        if tensor in outputs or len(readers) != 1:
            return None
        node, slot = readers[0]
        if node.op_type == "Transpose":
            q = _perm(node)
            ok = len(q) == len(p) and all(p[q[i]] == i for i in range(len(p))) and not flat and bool(chain)
            return (node, chain, back) if ok else None
        kind = _row_wise(node, slot, inits, index, flat, len(p))
        if kind is None:
            return None
        if kind == "flatten":
            flat = True
        elif kind == "unflatten":
            flat, back = False, node
        chain.append(node)
        tensor = node.output[0]
    return None


def _const(name: str, inits: dict[str, TensorProto], index: NodeIndex) -> TensorProto | None:
    """The initializer ``name`` is, or that a DequantizeLinear of initializers writes (its shape is the weight's)."""
    if name in inits:
        return inits[name]
    src = index.producer.get(name)
    if src is not None and src.op_type == "DequantizeLinear" and all(i in inits for i in src.input if i):
        return inits[src.input[0]]
    return None


def _size(name: str, inits: dict[str, TensorProto]) -> int | None:
    t = inits.get(name)
    return int(np.prod(t.dims)) if t is not None else None


def _row_wise(node: NodeProto, slot: int, inits: dict[str, TensorProto], index: NodeIndex, flat: bool, rank: int) -> str | None:
    """How ``node`` (reading the chain at input ``slot``) works on rows: "row" (each vector along the last axis on its
    own), "flatten" / "unflatten" (a Reshape to 2-D and back to ``rank``), or None (anything else)."""
    op, ins = node.op_type, list(node.input)
    if op in ("QuantizeLinear", "DequantizeLinear"):
        scalar = all(_size(i, inits) == 1 for i in ins[1:] if i)
        return "row" if slot == 0 and scalar else None
    if op == "MatMul":
        w = _const(ins[1], inits, index) if slot == 0 else None
        return "row" if w is not None and len(w.dims) == 2 else None
    if op == "MatMulIntegerToFloat":
        w = inits.get(ins[1]) if slot == 0 else None
        per_tensor_a = _size(ins[2], inits) == 1 and (len(ins) < 5 or not ins[4] or _size(ins[4], inits) == 1)
        bias = len(ins) < 7 or not ins[6] or (ins[6] in inits and len(inits[ins[6]].dims) <= 1)
        return "row" if w is not None and len(w.dims) == 2 and per_tensor_a and bias else None
    if op == "Gemm":
        attrs = {a.name: a.i for a in node.attribute}
        w = _const(ins[1], inits, index) if slot == 0 else None
        b = _const(ins[2], inits, index) if len(ins) > 2 and ins[2] else None
        bias = len(ins) < 3 or not ins[2] or (b is not None and len(b.dims) <= 1)
        return "row" if flat and w is not None and not attrs.get("transA", 0) and bias else None
    if op in _BROADCAST:
        other = _const(ins[1 - slot], inits, index) if len(ins) == 2 else None
        return "row" if other is not None and len(other.dims) <= 1 else None
    if op in _UNARY and node.domain in ("", "ai.onnx", "com.microsoft") and len([i for i in ins if i]) == 1:
        return "row"
    if op == "Reshape" and slot == 0 and ins[1] in inits:
        from onnx import numpy_helper

        shape = numpy_helper.to_array(inits[ins[1]]).tolist()
        if 0 in shape or shape[-1] <= 0:  # no 0: the same shape whatever allowzero says
            return None
        if not flat and len(shape) == 2:
            return "flatten"
        if flat and len(shape) == rank:
            return "unflatten"
    return None


def _rewrite(model: ModelProto, first: NodeProto, second: NodeProto, chain: list[NodeProto], back: NodeProto | None,
             index: NodeIndex) -> None:
    from onnx import numpy_helper

    graph = model.graph
    drop = {first.output[0], second.output[0]}
    reader, slot = index.consumers[first.output[0]][0]
    reader.input[slot] = first.input[0]
    if second.output[0] in {o.name for o in graph.output}:  # the last op writes the graph output in its place
        chain[-1].output[0] = second.output[0]
    else:
        for n, k in index.consumers.get(second.output[0], ()):
            n.input[k] = second.input[0]
    if back is not None:
        p = _perm(first)
        old = numpy_helper.to_array(next(t for t in graph.initializer if t.name == back.input[1])).tolist()
        new = [0] * len(old)
        for i, v in enumerate(old):
            new[p[i]] = v
        name = f"{back.name}/shape_untransposed"
        graph.initializer.append(numpy_helper.from_array(np.array(new, dtype=np.int64), name))
        old_name, back.input[1] = back.input[1], name
        if not any(old_name in n.input for n in graph.node):
            k = next(k for k, t in enumerate(graph.initializer) if t.name == old_name)
            del graph.initializer[k]
    stale = {o for n in chain for o in n.output}
    keep = [n for n in graph.node if not (n.op_type == "Transpose" and n.output[0] in drop)]
    del graph.node[:]
    graph.node.extend(keep)
    infos = [v for v in graph.value_info if v.name not in stale]
    if len(infos) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(infos)
