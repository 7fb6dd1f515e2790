"""Run the patch-embedding convolution as an INT8 GEMM in ONNX Runtime (issue 28 item 1).

The Q/DQ graph quantizes the patch embedding like every other layer: ``DequantizeLinear(image)``,
``DequantizeLinear(W) -> Conv``. ONNX Runtime's QDQ ``Conv`` rule wants a ``QuantizeLinear`` after the Conv
before it makes a ``QLinearConv``, and the patch embedding feeds the float position-embedding ``Add``, so ORT
dequantizes both inputs on every run and convolves in float (ViT-B/16: ~2 ms and two DequantizeLinears of 150 K
and 590 K values, 0.008-0.009 of the FP32 graph's time on an AVX2 CPU, docs/cpu-targets.md).

A ViT's patch embedding is a GEMM in disguise: kernel = stride, no padding, no dilation, one group. So the
rewrite cuts the quantized image into its patches (``Reshape -> Transpose -> Reshape``, on the 8-bit values, as
cheap as a copy of the image), multiplies them by the weight laid out as ``(C * kh * kw, O)`` in the node ORT
uses for every other INT8 GEMM, ``com.microsoft.MatMulIntegerToFloat`` with the bias, and lays the result out as
the Conv's ``(N, O, H / kh, W / kw)`` again (``Transpose -> Reshape``), under the Conv's output name, so every
reader of it (the exporter's flatten, a ``Shape``) is untouched. The weight's pairs along ``(in, kh, kw)`` are
the ones ``vitedge.quantize.weight_range`` bounds for im2col kernels, so the pre-VNNI saturation limit holds.

Arithmetic: the products and their sum are exact integers (int32), scaled once, where the float Conv summed
products of dequantized values in float32: the Conv's output moves by float rounding (7e-7 of 2.2 on a random
ViT-B/16), which a later QuantizeLinear can turn into a one-step change of a rounded value. The accuracy effect
on the real-model corpus is in docs/cpu-targets.md. Int8 images get a uint8 twin as in
``vitedge.backends.onnxruntime.gemm_bias`` (x86 MLAS kernels are u8 x s8). ``unfold_patch_embedding`` gives back the
Q/DQ Conv, for readers that look for layers by node name (per-layer sensitivity).

Needs ONNX Runtime's contrib operators, like the other rewrites of the ``onnx`` target: it runs under the profile's
``fuse_attention`` switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.backends.onnxruntime.gemm_bias import _FLOAT, _INT8, _UINT8, MS_DOMAIN, _as_uint8, _Constants, _dq_inputs, quantized_inputs
from vitedge.onnxkit.structure import NameScope, NodeIndex, cleanup, node_index, require_opset_import, splice_nodes

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

AS_GEMM_SUFFIX = "/as_gemm"  # the GEMM's node name: the Conv's name and this; its helper nodes: that and "/..."


@dataclass(frozen=True)
class PatchEmbedFusion:
    """What ``fuse_patch_embedding`` did."""

    convs: int  # Convs with both inputs dequantized
    folded: int  # of them, now patches -> MatMulIntegerToFloat
    skipped: tuple[str, ...] = field(default=())  # one reason per Conv left as it was

    def one_line(self) -> str:
        line = f"patch embedding: {self.folded} of {self.convs} INT8 Convs -> MatMulIntegerToFloat"
        return line + (f" (first left as is: {self.skipped[0]})" if self.skipped else "")


def _attr(node: NodeProto, name: str, default: object) -> Any:
    # vitedge.quantize.graph.attr's twin: importing that would pull the whole quantize package into every
    # `vitedge.runtime` load of the onnx backend (0.3 s here)
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _declared_shape(model: ModelProto, name: str) -> tuple[int, ...] | None:
    """The shape the graph declares for ``name`` (graph input or value_info), every dimension but the batch fixed
    (the batch: 0), else None."""
    for vi in list(model.graph.input) + list(model.graph.value_info):
        if vi.name == name and vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            if len(dims) and all(d.HasField("dim_value") for d in dims[1:]):
                return tuple(int(d.dim_value) if d.HasField("dim_value") else 0 for d in dims)
    return None


_SAME_SHAPE = ("Cast", "Identity", "QuantizeLinear", "DequantizeLinear", "Relu", "Clip")
_BROADCAST = ("Add", "Sub", "Mul", "Div")


def _static_shape(model: ModelProto, name: str, gr: NodeIndex, consts: _Constants, depth: int = 8) -> tuple[int, ...] | None:
    """The shape of ``name`` with the batch as 0, from its declaration or worked out back to one through the few
    ops a baked preprocessing puts before the image's QuantizeLinear (Cast, Transpose, Mul/Add by constants), else
    None."""
    shape = _declared_shape(model, name)
    node = gr.producer.get(name)
    if shape is not None or node is None or depth == 0:
        return shape
    if node.op_type in _SAME_SHAPE:
        return _static_shape(model, node.input[0], gr, consts, depth - 1)
    if node.op_type == "Transpose":
        inner = _static_shape(model, node.input[0], gr, consts, depth - 1)
        perm = _attr(node, "perm", None)
        return None if inner is None or perm is None or len(perm) != len(inner) else tuple(inner[i] for i in perm)
    if node.op_type in _BROADCAST and len(node.input) == 2:
        const = [i for i in node.input if consts.dims(i) is not None]
        if len(const) != 1:
            return None
        other = node.input[1] if const[0] == node.input[0] else node.input[0]
        inner, cdims = _static_shape(model, other, gr, consts, depth - 1), consts.dims(const[0])
        if inner is None or len(cdims) > len(inner):
            return None
        cdims = (1,) * (len(inner) - len(cdims)) + tuple(cdims)
        if cdims[0] != 1 or any(c not in (1, d) for c, d in zip(cdims[1:], inner[1:])):
            return None  # a constant that would change the shape
        return inner
    return None


def _why_not(conv: NodeProto, gr: NodeIndex, consts: _Constants, model: ModelProto) -> str | dict[str, Any]:
    """The pieces of the rewrite, or why this Conv stays as it is."""
    pair = quantized_inputs(conv, gr, consts, "image")
    if isinstance(pair, str):
        return pair
    x, w = pair
    q = gr.producer.get(x[0])
    wdims = consts.dims(w[0])
    if wdims is None or len(wdims) != 4 or consts.dtype(w[0]) not in (_INT8, _UINT8):
        return "weight is not a constant 4-D int8/uint8 tensor"
    o, c, kh, kw = wdims
    per_channel = consts.dims(w[1]) == (o,)
    if consts.dims(w[1]) not in ((), (1,), (o,)) or consts.dims(w[2]) != consts.dims(w[1]):
        return "weight scale is neither per-tensor nor per output channel"
    if per_channel and _attr(gr.producer[conv.input[1]], "axis", 1) != 0:
        return "the weight's DequantizeLinear is not per output channel (axis 0)"
    kernel = list(_attr(conv, "kernel_shape", [kh, kw]))
    if (kernel != [kh, kw] or list(_attr(conv, "strides", [1, 1])) != kernel or _attr(conv, "group", 1) != 1
            or any(_attr(conv, "pads", [0, 0, 0, 0])) or any(d != 1 for d in _attr(conv, "dilations", [1, 1]))
            or _attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")):
        return "not a patch embedding (kernel = stride, no padding, no dilation, one group)"
    bias = conv.input[2] if len(conv.input) > 2 and conv.input[2] else ""
    if bias and (consts.dtype(bias) != _FLOAT or consts.dims(bias) != (o,)):
        return "the bias is not a constant float vector of the output channels"
    shape = _static_shape(model, q.input[0] if q is not None else x[0], gr, consts)
    if shape is None or len(shape) != 4 or shape[1] != c:
        return "the image's channels and size are not fixed in the graph"
    h, wd = shape[2], shape[3]
    if h % kh or wd % kw:
        return "the image size is not a multiple of the patch size"
    return {"x": x, "w": w, "bias": bias, "o": o, "c": c, "kh": kh, "kw": kw, "h": h, "wd": wd}


def fuse_patch_embedding(model: ModelProto) -> PatchEmbedFusion:
    """Replace each INT8 patch-embedding Conv that qualifies by patches -> MatMulIntegerToFloat (in place)."""
    from onnx import helper, numpy_helper

    nodes = list(model.graph.node)  # held, so each node's id() stays its own
    gr = node_index(nodes)
    consts = _Constants(model)
    names = NameScope(model)
    convs, folded, added, drop, skipped = 0, 0, [], set(), []
    unsigned: dict[str, tuple[str, str]] = {}
    for conv in [n for n in nodes if n.op_type == "Conv" and n.domain in ("", "ai.onnx")]:
        if _dq_inputs(gr.producer.get(conv.input[0])) is None or len(conv.input) < 2 or _dq_inputs(gr.producer.get(conv.input[1])) is None:
            continue
        convs += 1
        p = _why_not(conv, gr, consts, model)
        if isinstance(p, str):
            skipped.append(f"{conv.name}: {p}")
            continue
        (x_q, x_s, x_z), (w_q, w_s, w_z) = p["x"], p["w"]
        o, c, kh, kw, h, wd = p["o"], p["c"], p["kh"], p["kw"], p["h"], p["wd"]
        if consts.dtype(x_z) == _INT8:
            x_q, x_z = _as_uint8(x_q, x_s, x_z, gr, consts, names, unsigned, added, model)
        base = f"{conv.name or 'Conv'}{AS_GEMM_SUFFIX}"

        def const(suffix: str, value: np.ndarray) -> str:
            name = names(f"{base}/{suffix}")
            model.graph.initializer.append(numpy_helper.from_array(value, name))
            return name

        weight = numpy_helper.to_array(consts.proto(w_q)).reshape(o, c * kh * kw).T.copy()  # (in, kh, kw) x out
        gemm_w = const("weight", weight)
        grid = (h // kh) * (wd // kw)
        t = [names(f"{base}/{k}") for k in ("blocks", "patches_nd", "patches", "tokens", "channels_first")]
        inputs = [t[2], gemm_w, x_s, w_s, x_z, w_z] + ([p["bias"]] if p["bias"] else [])  # the weight's scales as they were
        added += [
            helper.make_node("Reshape", [x_q, const("blocks_shape", np.array([0, c, h // kh, kh, wd // kw, kw], np.int64))], [t[0]],
                             name=names(f"{base}/patchify_reshape")),
            helper.make_node("Transpose", [t[0]], [t[1]], perm=[0, 2, 4, 1, 3, 5], name=names(f"{base}/patchify_transpose")),
            helper.make_node("Reshape", [t[1], const("patches_shape", np.array([0, grid, c * kh * kw], np.int64))], [t[2]],
                             name=names(f"{base}/patchify_flatten")),
            helper.make_node("MatMulIntegerToFloat", inputs, [t[3]], domain=MS_DOMAIN, name=names(base)),
            helper.make_node("Transpose", [t[3]], [t[4]], perm=[0, 2, 1], name=names(f"{base}/to_channels_first")),
            helper.make_node("Reshape", [t[4], const("grid_shape", np.array([0, o, h // kh, wd // kw], np.int64))], [conv.output[0]],
                             name=names(f"{base}/to_grid")),
        ]
        drop.add(id(conv))
        folded += 1
    if added:
        splice_nodes(model, nodes, added, drop)
        require_opset_import(model, MS_DOMAIN, 1)
        cleanup(model)  # the two DequantizeLinears and the 4-D weight only the Conv read
    return PatchEmbedFusion(convs, folded, tuple(skipped))


def unfold_patch_embedding(model: ModelProto) -> int:
    """The inverse: each GEMM this module wrote becomes ``DQ(image), DQ(W) -> Conv`` again under the Conv's name,
    the weight in its (O, C, kh, kw) layout (in place). The image stays uint8 where it was made so (the same real
    values). Returns how many were unfolded."""
    from onnx import helper, numpy_helper

    nodes = list(model.graph.node)
    consts = _Constants(model)
    names = NameScope(model)
    added, drop = [], set()
    for mm in nodes:
        if mm.op_type != "MatMulIntegerToFloat" or mm.domain != MS_DOMAIN or not mm.name.endswith(AS_GEMM_SUFFIX):
            continue
        base = mm.name
        conv_name = base[: -len(AS_GEMM_SUFFIX)]
        helpers = [n for n in nodes if n.name.startswith(base + "/")]
        first = next((n for n in helpers if n.name.startswith(f"{base}/patchify_reshape")), None)
        last = next((n for n in helpers if n.name.startswith(f"{base}/to_grid")), None)
        if first is None or last is None:
            continue
        _, c, _, kh, _, kw = (int(v) for v in numpy_helper.to_array(consts.proto(first.input[1])))  # [0, C, H/kh, kh, W/kw, kw]
        x_q, w_2d, x_s, w_s, x_z, w_z = mm.input[:6]
        bias = mm.input[6] if len(mm.input) > 6 and mm.input[6] else ""
        weight = numpy_helper.to_array(consts.proto(w_2d))
        o = weight.shape[1]
        w4 = names(f"{conv_name}/weight_quantized")
        model.graph.initializer.append(numpy_helper.from_array(weight.T.reshape(o, c, kh, kw).copy(), w4))
        x, w = names(f"{conv_name}/x_dq"), names(f"{conv_name}/w_dq")
        per_channel = consts.dims(w_s) == (o,)
        added += [helper.make_node("DequantizeLinear", [first.input[0], x_s, x_z], [x], name=names(f"{conv_name}/x_DequantizeLinear")),
                  helper.make_node("DequantizeLinear", [w4, w_s, w_z], [w], name=names(f"{conv_name}/w_DequantizeLinear"),
                                   **({"axis": 0} if per_channel else {})),
                  helper.make_node("Conv", [x, w] + ([bias] if bias else []), [last.output[0]], name=conv_name,
                                   kernel_shape=[kh, kw], strides=[kh, kw], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)]
        drop.update(id(n) for n in helpers + [mm])
    if added:
        splice_nodes(model, nodes, added, drop)
        cleanup(model)
    return len(added) // 3
