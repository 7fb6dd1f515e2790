"""Fold each INT8 GEMM's projection bias into ONNX Runtime's MatMulIntegerToFloat (issue 28 item 1).

ONNX Runtime turns ``DequantizeLinear(x) , DequantizeLinear(W) -> MatMul`` (no QuantizeLinear after it) into
``com.microsoft.MatMulIntegerToFloat``, but leaves the projection bias ``Add`` that follows as a separate float
kernel: 36 of them on a ViT (q/k/v, attention projection, fc2; fc1's becomes part of ``BiasGelu``). Why, from its
source (onnxruntime/core/optimizer/qdq_transformer/selectors_actions/): the QDQ ``MatMul`` rule selects two DQs, the
MatMul and an optional Q, and its action (``MatMulIntToFloatReplacer`` in qdq_actions.cc) moves only the DQs' inputs
and the MatMul's output, never a following Add. The fusion that *does* take a bias
(``MatMulIntegerToFloatFusion``, core/optimizer/matmul_integer_to_float.cc: ``Add`` input 1 a constant 1-D tensor)
matches only the dynamic-quantization pattern ``MatMulInteger -> Cast -> Mul(Mul(a_scale, b_scale))``, which a static
Q/DQ graph never contains (read from the source, not tried: writing that dynamic pattern with constant scales would
most likely lose its scale product to constant folding first). So neither operand order nor Q/DQ placement is the
cause, and no reordering of the Q/DQ graph makes ORT pick the bias up.

This module therefore writes the node ORT would write, with the bias: ``MatMulIntegerToFloat(x_q, W_q, x_scale,
W_scale, x_zero_point, W_zero_point, bias)`` replaces ``DQ(x), DQ(W) -> MatMul -> Add(bias)``. The CPU kernel passes
the bias to MLAS, which adds it in the GEMM's output processor (``acc * scale + bias``) instead of a second pass
over the output: the same float operations as the separate Add (outputs measured identical, max |difference| 0, on
this AVX2 CPU: docs/cpu-targets.md). Int8 activations get a uint8 twin QuantizeLinear (``_as_uint8``: what ORT
itself does on x86). ``unfold_gemm_bias`` turns the result back into the Q/DQ form.

A GEMM is folded only where ORT makes a MatMulIntegerToFloat itself: per-tensor 8-bit activations, a constant
int8/uint8 2-D weight with a per-tensor or per-column scale, and both DequantizeLinears read by this MatMul alone
(ORT 1.32 ran a MatMul whose activation DQ had a second reader in float: two such layers in one corpus model, where
folding them anyway moved its logits by up to 0.12). The Add must read the MatMul alone, with a constant float bias
of the GEMM's width. Anything else stays as it was, with the reason recorded.

Like MultiHeadAttention, the result needs ONNX Runtime (contrib operators ship in every build): it runs under the
``onnx`` profile's ``fuse_attention`` switch, which is what keeps the graph plain-ONNX when false.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.onnxkit.structure import NameScope, NodeIndex, cleanup, node_index, require_opset_import, splice_nodes

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

MS_DOMAIN = "com.microsoft"
_UINT8, _INT8, _FLOAT = 2, 3, 1  # TensorProto element types
FUSED_SUFFIX = "/with_bias"  # a folded GEMM's node name: the MatMul's name and this
FUSED_GEMM_SUFFIX = "/gemm_with_bias"  # a folded Gemm's: its name and this (and "_t" when it had transB=1)


@dataclass(frozen=True)
class GemmBiasFusion:
    """What ``fuse_gemm_bias`` did."""

    gemms: int  # MatMuls with both inputs dequantized (ORT's MatMulIntegerToFloat candidates)
    folded: int  # of them, with their bias Add folded into MatMulIntegerToFloat
    skipped: tuple[str, ...] = field(default=())  # one reason per candidate left as it was

    def one_line(self) -> str:
        line = f"GEMM bias fusion: {self.folded} of {self.gemms} INT8 GEMMs -> MatMulIntegerToFloat with bias"
        return line + (f" (first left as is: {self.skipped[0]})" if self.skipped else "")


class _Constants:
    """Constant tensors of a graph: initializers, Constant nodes, and Identity of either."""

    def __init__(self, model: ModelProto):
        from onnx import numpy_helper

        self.init = {t.name: t for t in model.graph.initializer}
        self.producer = node_index(model.graph.node).producer
        self._array = numpy_helper.to_array

    def proto(self, name: str) -> Any | None:
        """The TensorProto behind ``name`` (through Identity nodes), else None."""
        for _ in range(8):
            if name in self.init:
                return self.init[name]
            node = self.producer.get(name)
            if node is None:
                return None
            if node.op_type == "Constant":
                attr = [a for a in node.attribute if a.name == "value"]
                return attr[0].t if attr else None
            if node.op_type != "Identity":
                return None
            name = node.input[0]
        return None

    def dims(self, name: str) -> tuple[int, ...] | None:
        p = self.proto(name)
        return tuple(int(d) for d in p.dims) if p is not None else None

    def dtype(self, name: str) -> int | None:
        p = self.proto(name)
        return int(p.data_type) if p is not None else None


def _dq_inputs(dq: NodeProto) -> tuple[str, str, str] | None:
    """(quantized, scale, zero point) of a DequantizeLinear with all three inputs, else None."""
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") or len(dq.input) < 3 or not dq.input[2]:
        return None
    if any(a.name == "block_size" and a.i for a in dq.attribute):
        return None
    return dq.input[0], dq.input[1], dq.input[2]


def quantized_inputs(node: NodeProto, gr: NodeIndex, consts: _Constants, subject: str) -> str | tuple[tuple[str, str, str], tuple[str, str, str]]:
    """((quantized, scale, zero point) of ``node``'s first input, the same of its second) when both are
    DequantizeLinears read by ``node`` alone and the first is a per-tensor 8-bit ``subject`` (an int8 one written
    by a QuantizeLinear of the same scale and zero point, which the uint8 twin copies); else why not. ONNX Runtime
    keeps a MatMul whose DequantizeLinear has a second reader in float."""
    x, w = _dq_inputs(gr.producer.get(node.input[0])), _dq_inputs(gr.producer.get(node.input[1]))
    if x is None or w is None:
        return "an input is not a DequantizeLinear with scale and zero point"
    if consts.dtype(x[2]) not in (_INT8, _UINT8) or consts.dims(x[1]) not in ((), (1,)) or consts.dims(x[2]) not in ((), (1,)):
        return f"the {subject} is not per-tensor 8-bit"
    if any(len(gr.readers(t)) != 1 for t in node.input[:2]):
        return "a DequantizeLinear output has other readers"
    q = gr.producer.get(x[0])
    if consts.dtype(x[2]) == _INT8 and (q is None or q.op_type != "QuantizeLinear" or len(q.input) < 3 or tuple(q.input[1:3]) != x[1:3]):
        return f"int8 {subject} not written by a QuantizeLinear with the same scale and zero point"
    return x, w


@dataclass
class _Fold:
    """One GEMM to fold: MatMulIntegerToFloat's inputs and the nodes it replaces."""

    inputs: list[str]
    replaced: list[Any]  # the MatMul / Gemm, then any Reshape and the bias Add
    output: str  # the tensor the folded GEMM (or the Reshape after it) writes
    reshape: Any = None  # MatMul -> Reshape (last axis kept) -> Add(bias): the Reshape, moved after the fold
    transpose_weight: bool = False  # a Gemm with transB=1: the int8 weight is stored transposed [K, N]


def _bias(add: NodeProto, read: str, consts: _Constants, n: int) -> str | None:
    bias = add.input[1] if add.input[0] == read else add.input[0]
    bdims = consts.dims(bias)
    if bias == read or consts.dtype(bias) != _FLOAT or not bdims or bdims[-1] != n or any(d != 1 for d in bdims[:-1]):
        return None
    return bias


def _keeps_last_axis(reshape: NodeProto, consts: _Constants, n: int) -> bool:
    from onnx import numpy_helper

    p = consts.proto(reshape.input[1]) if len(reshape.input) > 1 else None
    return p is not None and p.dims and int(numpy_helper.to_array(p).reshape(-1)[-1]) == n


def _gemm_attrs_plain(node: NodeProto) -> bool:
    a = {x.name: x for x in node.attribute}
    return (a["transA"].i == 0 if "transA" in a else True) and (a["alpha"].f == 1.0 if "alpha" in a else True) and (
        a["beta"].f == 1.0 if "beta" in a else True)


def _why_not(mm: NodeProto, gr: NodeIndex, consts: _Constants, outputs: set[str], before_gelu: bool) -> str | _Fold:
    """The MatMulIntegerToFloat inputs and the nodes it replaces, or why this GEMM stays as it is."""
    pair = quantized_inputs(mm, gr, consts, "activation")
    if isinstance(pair, str):
        return pair
    x, w = pair
    wdims = consts.dims(w[0])
    if wdims is None or len(wdims) != 2 or consts.dtype(w[0]) not in (_INT8, _UINT8):
        return "weight is not a constant 2-D int8/uint8 tensor"
    gemm = mm.op_type == "Gemm"
    trans_b = gemm and any(a.name == "transB" and a.i for a in mm.attribute)
    n = wdims[0] if trans_b else wdims[1]
    if consts.dims(w[1]) not in ((), (1,), (n,)) or consts.dims(w[2]) != consts.dims(w[1]):
        return "weight scale is neither per-tensor nor per-column"
    if gemm:
        if not _gemm_attrs_plain(mm) or len(mm.input) < 3 or not mm.input[2]:
            return "Gemm with transA, alpha or beta, or without a bias"
        add_like = type("C", (), {"input": [mm.output[0], mm.input[2]]})
        bias = _bias(add_like, mm.output[0], consts, n)
        if bias is None:
            return "the Gemm's bias is not a constant float vector of its width"
        return _Fold([x[0], w[0], x[1], w[1], x[2], w[2], bias], [mm], mm.output[0], transpose_weight=trans_b)
    readers = gr.readers(mm.output[0])
    reshape = None
    if len(readers) == 1 and readers[0].op_type == "Reshape" and _keeps_last_axis(readers[0], consts, n) and readers[0].output[0] not in outputs:
        reshape, readers = readers[0], gr.readers(readers[0].output[0])
    read = (reshape or mm).output[0]
    if mm.output[0] in outputs or len(readers) != 1 or readers[0].op_type != "Add" or readers[0].domain not in ("", "ai.onnx"):
        return "the MatMul's output is not read by one Add alone"
    add = readers[0]
    bias = _bias(add, read, consts, n)
    if bias is None:
        return "the Add's other input is not a constant float bias of the GEMM's width"
    if not before_gelu and any(r.op_type in ("Div", "Mul", "Gelu") for r in gr.readers(add.output[0])):
        return "bias left for ORT's BiasGelu"
    return _Fold([x[0], w[0], x[1], w[1], x[2], w[2], bias], [mm] + ([reshape] if reshape else []) + [add], add.output[0], reshape)


def _as_uint8(x_q: str, scale: str, zp: str, gr: NodeIndex, consts: _Constants, names: NameScope,
              unsigned: dict[str, tuple[str, str]], added: list[Any], model: ModelProto) -> tuple[str, str]:
    """A uint8 twin of an int8 activation: ``QuantizeLinear(x, scale, zp + 128)``, the same integers shifted by 128.

    ONNX Runtime on x86 runs int8 activations this way: its ``QDQS8ToU8Transformer`` rewrites every int8 Q -> DQ
    pair to uint8 (MLAS's x86 kernels are u8 x s8; ``session.qdq_is_int8_allowed`` defaults to false there). It
    only matches Q -> DQ pairs, so it cannot reach a Q that feeds MatMulIntegerToFloat directly, and left int8
    that GEMM ran 4-5x slower on this AVX2 CPU (the s8 x s8 fallback). One twin per activation, shared."""
    from onnx import helper, numpy_helper

    if x_q not in unsigned:
        q = gr.producer[x_q]
        zp_u8 = names(f"{zp}_uint8")
        value = numpy_helper.to_array(consts.proto(zp)).astype(np.int16) + 128
        model.graph.initializer.append(numpy_helper.from_array(value.astype(np.uint8), zp_u8))
        twin = names(f"{x_q}_uint8")
        added.append(helper.make_node("QuantizeLinear", [q.input[0], scale, zp_u8], [twin], name=names(f"{q.name or 'QuantizeLinear'}/uint8"),
                                      **{a.name: helper.get_attribute_value(a) for a in q.attribute if a.name != "output_dtype"}))
        unsigned[x_q] = (twin, zp_u8)
    return unsigned[x_q]


def _attrs(node: NodeProto) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _transposed(weight: str, consts: _Constants, names: NameScope, model: ModelProto) -> str:
    """A [K, N] copy of a Gemm's transB=1 int8 weight [N, K] (its per-row scale becomes per-column)."""
    from onnx import numpy_helper

    name = names(f"{weight}_t")
    model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(consts.proto(weight)).T), name))
    return name


def fuse_gemm_bias(model: ModelProto, *, before_gelu: bool = True) -> GemmBiasFusion:
    """Replace each ``DQ(x), DQ(W) -> MatMul -> Add(bias)`` that qualifies with MatMulIntegerToFloat (in place).

    ``before_gelu=False`` leaves a bias whose sum feeds an erf-GELU (ORT fuses that one into BiasGelu)."""
    from onnx import helper

    nodes = list(model.graph.node)  # held, so each node's id() stays its own
    gr = node_index(nodes)
    consts = _Constants(model)
    outputs = {o.name for o in model.graph.output}
    names = NameScope(model)
    gemms, folded, added, drop, skipped = 0, 0, [], set(), []
    unsigned: dict[str, tuple[str, str]] = {}  # int8 activation tensor -> its uint8 twin and zero point
    for mm in [n for n in nodes if n.op_type in ("MatMul", "Gemm") and n.domain in ("", "ai.onnx") and len(n.input) >= 2]:
        if _dq_inputs(gr.producer.get(mm.input[0])) is None or _dq_inputs(gr.producer.get(mm.input[1])) is None:
            continue
        gemms += 1
        verdict = _why_not(mm, gr, consts, outputs, before_gelu)
        if isinstance(verdict, str):
            skipped.append(f"{mm.name}: {verdict}")
            continue
        inputs = verdict.inputs
        if consts.dtype(inputs[4]) == _INT8:  # int8 activations: ORT's own S8 -> U8 conversion, done here
            inputs[0], inputs[4] = _as_uint8(inputs[0], inputs[2], inputs[4], gr, consts, names, unsigned, added, model)
        if verdict.transpose_weight:
            inputs[1] = _transposed(inputs[1], consts, names, model)
        suffix = FUSED_GEMM_SUFFIX + ("_t" if verdict.transpose_weight else "") if mm.op_type == "Gemm" else FUSED_SUFFIX
        out = names(f"{mm.name}/folded") if verdict.reshape is not None else verdict.output
        added.append(helper.make_node("MatMulIntegerToFloat", inputs, [out], domain=MS_DOMAIN, name=names(f"{mm.name or 'MatMul'}{suffix}")))
        if verdict.reshape is not None:  # the bias added before the Reshape: it keeps the last axis, so the same sums
            r = verdict.reshape
            added.append(helper.make_node("Reshape", [out, *r.input[1:]], [verdict.output], name=r.name, **_attrs(r)))
        drop.update(id(n) for n in verdict.replaced)
        folded += 1
    if added:
        splice_nodes(model, nodes, added, drop)
        require_opset_import(model, MS_DOMAIN, 1)
        cleanup(model)  # the DequantizeLinears only these MatMuls read
    return GemmBiasFusion(gemms, folded, tuple(skipped))


def unfold_gemm_bias(model: ModelProto) -> int:
    """The inverse, for readers that want the Q/DQ form (per-layer sensitivity finds INT8 layers by their
    ``DequantizeLinear -> MatMul`` inputs and their node names): each MatMulIntegerToFloat this module wrote
    becomes ``DQ(x), DQ(W) -> MatMul -> Add(bias)`` again, the MatMul under its original name (in place).
    The activation stays uint8 (the same real values as its int8 original). Returns how many were unfolded."""
    from onnx import helper

    names = NameScope(model)
    nodes = list(model.graph.node)  # held, so each node's id() stays its own
    added, drop = [], set()
    consts = _Constants(model)
    for n in nodes:
        if n.op_type != "MatMulIntegerToFloat" or n.domain != MS_DOMAIN or len(n.input) != 7:
            continue
        suffix = next((x for x in (FUSED_SUFFIX, FUSED_GEMM_SUFFIX, FUSED_GEMM_SUFFIX + "_t") if n.name.endswith(x)), None)
        if suffix is None:
            continue
        base = n.name[: -len(suffix)]
        x_q, w_q, x_s, w_s, x_z, w_z, bias = n.input
        x, w, mm = names(f"{base}/x_dq"), names(f"{base}/w_dq"), names(f"{base}/mm")
        trans_b = suffix.endswith("_t")
        if trans_b:
            w_q = _transposed(w_q, consts, names, model)  # back to the Gemm's [N, K]
        added += [helper.make_node("DequantizeLinear", [x_q, x_s, x_z], [x], name=names(f"{base}/x_DequantizeLinear")),
                  helper.make_node("DequantizeLinear", [w_q, w_s, w_z], [w], name=names(f"{base}/w_DequantizeLinear"), axis=0 if trans_b else 1)]
        if suffix == FUSED_SUFFIX:
            added += [helper.make_node("MatMul", [x, w], [mm], name=base),
                      helper.make_node("Add", [bias, mm], [n.output[0]], name=names(f"{base}/bias_Add"))]
        else:
            added.append(helper.make_node("Gemm", [x, w, bias], [n.output[0]], name=base, transB=int(trans_b)))
        drop.add(id(n))
    if added:
        splice_nodes(model, nodes, added, drop)
        cleanup(model)  # a transposed weight's folded copy
    return len(drop)
