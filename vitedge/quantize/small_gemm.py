"""The GEMMs too small for INT8 to pay on TensorRT, by NVIDIA ModelOpt's own rule.

NVIDIA's ONNX PTQ (``nvidia-modelopt``, ``modelopt/onnx/quantization/graph_utils.py``,
``find_nodes_from_matmul_to_exclude``, run by ``quantize`` for INT8 and FP8) leaves a MatMul/Gemm in
float when, at batch 1:

- it is a GEMV: a MatMul of two activations whose output's last or second-to-last dimension is 1, or a
  MatMul/Gemm with a constant weight whose output has rank 2 or less and a dimension of 1 (the classifier
  head over the class token or the pooled features: one row per image), "cannot utilize TensorCores";
- its K (the second input's reduction dimension) or its N (the output's last dimension) is below
  ``_MIN_MATMUL_DIM = 16``: "both INT8 and FP8 Tensor Core kernels need K/N >= 16 to be efficient, and
  adding Q/DQ layers on such small GEMMs causes TRT perf regressions" (the 10-class heads; Q.K^T and P.V
  of attention heads narrower than 16).

``small_gemms`` applies that rule to vitedge's quantizable layers (``QuantConfig.float_small_gemms``,
on for the NVIDIA target profiles). Shapes come from ONNX shape inference on a batch-1 copy; a tensor it
leaves unknown is read off one ONNX Runtime run of a batch-1 zero input, as ModelOpt runs its model. A
layer whose shape neither gives stays INT8.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.onnxkit.session import SessionSettings, ort_session
from vitedge.quantize.graph import QuantLayer

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

MIN_GEMM_DIM = 16  # ModelOpt's _MIN_MATMUL_DIM
SOURCE = "NVIDIA ModelOpt, modelopt/onnx/quantization/graph_utils.py: find_nodes_from_matmul_to_exclude, _MIN_MATMUL_DIM = 16"
RULE_KINDS = ("linear", "head", "patch_embed", "attention_matmul")  # MatMul/Gemm layers (a Conv is not a GEMM here)
_CACHE: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}


def small_gemms(model: ModelProto, layers: Iterable[QuantLayer], cache_key: str | None = None) -> dict[str, str]:
    """Layer name -> why ModelOpt's rule keeps it float, for the MatMul/Gemm layers of ``layers`` it selects.
    ``cache_key`` (the FP32 graph's hash) lets the accuracy budget's many graphs share one answer."""
    chosen = [l for l in layers if l.kind in RULE_KINDS and l.op_type in ("MatMul", "Gemm")]
    key = (cache_key, tuple(l.name for l in chosen)) if cache_key else None
    if key is not None and key in _CACHE:
        return dict(_CACHE[key])
    nodes = {n.name: n for n in model.graph.node if n.name}
    wanted = {l.name: (nodes[l.name].output[0], nodes[l.name].input[1]) for l in chosen if l.name in nodes}
    shapes = batch1_shapes(model, {t for pair in wanted.values() for t in pair})
    out: dict[str, str] = {}
    for layer in chosen:
        if layer.name not in wanted:
            continue
        reason = _reason(layer, nodes[layer.name], shapes.get(wanted[layer.name][0]), shapes.get(wanted[layer.name][1]), model)
        if reason:
            out[layer.name] = reason
    if key is not None:
        if len(_CACHE) > 16:
            _CACHE.clear()
        _CACHE[key] = dict(out)
    return out


def _reason(layer: QuantLayer, node: NodeProto, out: list[int] | None, b: list[int] | None, model: ModelProto) -> str | None:
    """Why this layer is a GEMV or a small GEMM at batch 1 (None: it is neither, or its shape is unknown)."""
    if out is None:
        return None
    if layer.weight is None:  # two activations: Q.K^T, P.V
        if len(out) < 2 or 1 in out[-2:]:
            return f"GEMV (output {_dims(out)} at batch 1)"
    elif len(out) < 3 and 1 in out:
        return f"GEMV (output {_dims(out)} at batch 1: one row per image)"
    n = out[-1] if len(out) >= 2 else 0
    k = _k_dim(node, b, layer, model)
    small = [f"{name} {v}" for name, v in (("K", k), ("N", n)) if v is not None and 0 < v < MIN_GEMM_DIM]
    return f"small GEMM ({', '.join(small)} below {MIN_GEMM_DIM})" if small else None


def _k_dim(node: NodeProto, b: list[int] | None, layer: QuantLayer, model: ModelProto) -> int | None:
    """The reduction dimension, off the second input: [N, K] for a Gemm with transB, else [..., K, N]."""
    from onnx import helper

    trans_b = node.op_type == "Gemm" and any(a.name == "transB" and helper.get_attribute_value(a) for a in node.attribute)
    if layer.weight is not None:
        w = next((t for t in model.graph.initializer if t.name == layer.weight), None)
        if w is not None and len(w.dims) >= 2:
            return int(w.dims[-1 if trans_b else -2])
    if b is not None and len(b) >= 2:
        return b[-1 if trans_b else -2]
    return None


def _dims(shape: list[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def batch1_shapes(model: ModelProto, tensors: set[str]) -> dict[str, list[int]]:
    """Tensor -> its full static shape at batch 1, for ``tensors``: ONNX shape inference first, then one
    ONNX Runtime run of a zero input for the ones it left unknown (missing when neither gives them)."""
    import onnx
    from onnx import shape_inference

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inputs = _batch1_inputs(m)
    known: dict[str, list[int]] = {}
    try:
        inferred = shape_inference.infer_shapes(m, data_prop=True)
        for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
            dims = vi.type.tensor_type.shape.dim
            if vi.name in tensors and dims and all(d.HasField("dim_value") for d in dims):
                known[vi.name] = [d.dim_value for d in dims]
    except Exception:  # noqa: BLE001 - a graph shape inference cannot read: the run below answers
        pass
    missing = sorted(t for t in tensors if t not in known and t not in {i.name for i in m.graph.initializer})
    if missing and inputs is not None:
        known.update(_run_shapes(m, missing, inputs))
    return known


def _batch1_inputs(m: ModelProto) -> dict[str, Any] | None:
    """Zero feeds for the graph inputs of ``m`` at batch 1 (its dynamic dimensions set to 1 in ``m``), or None
    when an input has a type or dimension that cannot be fed."""
    from onnx import helper

    inits = {t.name for t in m.graph.initializer}
    feeds: dict[str, Any] = {}
    for inp in m.graph.input:
        if inp.name in inits:
            continue
        dims = inp.type.tensor_type.shape.dim
        for d in dims:
            if not d.HasField("dim_value"):
                d.ClearField("dim_param")
                d.dim_value = 1
        try:
            dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        except Exception:  # noqa: BLE001 - not a tensor type ONNX Runtime could be fed here
            return None
        feeds[inp.name] = np.zeros([d.dim_value for d in dims], dtype=dtype)
    return feeds


def _run_shapes(m: ModelProto, names: list[str], feeds: dict[str, Any]) -> dict[str, list[int]]:
    """The shapes of ``names`` in one ONNX Runtime run of ``m`` on ``feeds`` (empty when it cannot run)."""
    from onnx import ValueInfoProto

    have = {o.name for o in m.graph.output}
    m.graph.output.extend([ValueInfoProto(name=n) for n in names if n not in have])
    try:
        session = ort_session(m, SessionSettings(threads=1))
        outs = session.run(names, feeds)
    except Exception:  # noqa: BLE001 - shapes stay unknown; those layers stay INT8
        return {}
    return {n: [int(d) for d in o.shape] for n, o in zip(names, outs)}
