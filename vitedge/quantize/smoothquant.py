"""SmoothQuant as a pure graph rewrite (Xiao et al., 2023).

Post-LayerNorm activations of a ViT have a few channels far larger than the rest, so
one per-tensor INT8 scale wastes most of its levels on them. For a LayerNorm whose
output feeds Linear layers, with per-channel ``s_j = max|X_j|^a / max|W_j|^(1-a)``:

    X W = (X / s) (diag(s) W)

* the LayerNorm's gamma and beta are divided by ``s`` (so it outputs X / s), and
* the rows of every consuming weight (its input channels) are multiplied by ``s``.

The FP32 function is unchanged (up to float rounding); only what gets quantized moves:
activation outliers shrink, weights (quantized per output channel) absorb them.

A LayerNorm whose output also feeds something else (the residual Add of a post-norm
block) cannot change its output; there an explicit per-channel ``Mul(X, 1/s)`` is put in
front of the Linear layer(s) instead. Whether that pays is measured
(docs/quantization.md); ``shared_mode`` selects it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.onnxkit.structure import NameScope, cleanup, topological_sort
from vitedge.quantize.graph import GraphIndex, SmoothSite, attr

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

S_MIN, S_MAX = 1e-5, 1e5


def weight_input_absmax(gi: GraphIndex, site: SmoothSite) -> np.ndarray:
    """max |W| per input channel over every Linear layer the site feeds."""
    out = np.zeros(site.channels, dtype=np.float64)
    for name in site.layers:
        node = gi.nodes_by_name[name]
        w = np.abs(np.asarray(gi.value(node.input[1]), dtype=np.float64))
        per_in = w.max(axis=0) if _in_axis(node) == 1 else w.max(axis=1)
        out = np.maximum(out, per_in)
    return out


def _in_axis(node: NodeProto) -> int:
    """The input-channel axis of a Linear layer's 2-D weight."""
    if node.op_type == "Gemm" and attr(node, "transB", 0):
        return 1
    return 0


def smoothing_scales(x_absmax: np.ndarray, w_absmax: np.ndarray, alpha: float) -> np.ndarray:
    x = np.asarray(x_absmax, dtype=np.float64)
    w = np.asarray(w_absmax, dtype=np.float64)
    ok = (x > 0) & (w > 0) & np.isfinite(x) & np.isfinite(w)
    s = np.ones_like(x)
    s[ok] = np.power(x[ok], alpha) / np.power(w[ok], 1.0 - alpha)
    return np.clip(s, S_MIN, S_MAX)


def apply(model: ModelProto, sites: list[SmoothSite], scales: dict[str, np.ndarray]) -> tuple[Any, dict[str, str]]:
    """A smoothed copy of ``model`` and the renamed activation tensors (old -> new; only
    where an explicit Mul was inserted)."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    gi = GraphIndex(m)
    names = NameScope(m)
    g = m.graph
    renamed: dict[str, str] = {}
    added: list[Any] = []  # new Muls; topological_sort puts each right after the tensor it scales
    for site in sites:
        s = scales.get(site.norm)
        if s is None:
            continue
        s = np.asarray(s, dtype=np.float64)
        for name in site.layers:
            node = gi.nodes_by_name[name]
            w = np.asarray(gi.value(node.input[1]), dtype=np.float64)
            w = w * (s[None, :] if _in_axis(node) == 1 else s[:, None])
            wname = names(f"{name}/smoothquant/weight")
            g.initializer.append(numpy_helper.from_array(w.astype(np.float32), wname))
            node.input[1] = wname
        if not site.shared:
            ln = gi.nodes_by_name[site.norm]
            gamma = np.asarray(gi.value(ln.input[1]), dtype=np.float64).reshape(-1)
            gname = names(f"{site.norm}/smoothquant/scale")
            g.initializer.append(numpy_helper.from_array((gamma / s).astype(np.float32), gname))
            ln.input[1] = gname
            if len(ln.input) > 2 and ln.input[2]:
                beta = np.asarray(gi.value(ln.input[2]), dtype=np.float64).reshape(-1)
                bname = names(f"{site.norm}/smoothquant/bias")
                g.initializer.append(numpy_helper.from_array((beta / s).astype(np.float32), bname))
                ln.input[2] = bname
            continue
        inv = names(f"{site.norm}/smoothquant/inv_s")
        g.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32), inv))
        for k, tensor in enumerate(site.inputs):
            out = names(f"{tensor}/smoothquant")
            mul = helper.make_node("Mul", [tensor, inv], [out], name=names(f"{site.norm}/smoothquant/Mul_{k}"))
            for name in site.layers:
                node = gi.nodes_by_name[name]
                if node.input[0] == tensor:
                    node.input[0] = out
            renamed[tensor] = out
            added.append(mul)
    if added:
        ordered = topological_sort(added + list(g.node))
        del g.node[:]
        g.node.extend(ordered)
    cleanup(m)
    return m, renamed
