"""Sanity checks on what a model file says about itself: finite weights, well-formed metadata,
and, for an ONNX file, that it is a ViT whose output the runtime can serve (batch, classes|features)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.onnxkit.structure import graph_inputs
from vitedge.bundle.spec import INTERPOLATIONS, Preprocess


def check_finite_weights(tensors: Mapping[str, Any], where: str) -> None:
    """Refuse weights holding NaN or Inf, naming the first tensor and how many values are bad."""
    import torch

    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            bad = ~torch.isfinite(t)
            if bool(bad.any()):
                kinds = [k for k, m in (("NaN", torch.isnan(t)), ("Inf", torch.isinf(t))) if bool(m.any())]
                raise ModelLoadError(
                    f"{where}: weight '{name}' holds {int(bad.sum())} non-finite value(s) ({' and '.join(kinds)}); "
                    "the training run diverged or the file is damaged: use an earlier checkpoint"
                )


def check_finite_onnx_weights(graph, where: str) -> None:
    """The same for an ONNX graph's float initializers."""
    from onnx import numpy_helper

    for init in graph.initializer:
        if init.data_type not in (1, 10, 11, 16) or init.data_location == 1:  # float types; skip external data
            continue
        a = numpy_helper.to_array(init)
        bad = ~np.isfinite(a.astype(np.float32, copy=False))
        if bad.any():
            kinds = [k for k, m in (("NaN", np.isnan(a)), ("Inf", np.isinf(a))) if m.any()]
            raise ModelLoadError(f"{where}: weight '{init.name}' holds {int(bad.sum())} non-finite value(s) ({' and '.join(kinds)}); "
                                 "the training run diverged or the file is damaged: use an earlier checkpoint")


_META_TYPES = {"model_kwargs": dict, "preprocess": dict, "class_names": list}


def check_meta(meta: Mapping[str, Any], where: str) -> None:
    """The vitedge metadata a checkpoint carries: each field of the type vitedge reads, or a one-line error."""
    for key, typ in _META_TYPES.items():
        if key in meta and meta[key] is not None and not isinstance(meta[key], (typ, tuple) if typ is list else typ):
            raise ModelLoadError(f"{where}: its metadata field '{key}' is a {type(meta[key]).__name__}, expected a "
                                 f"{'table' if typ is dict else 'list'}; fix or drop it from the checkpoint")
    heads = (meta.get("model_kwargs") or {}).get("num_heads")
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
        raise ModelLoadError(f"{where}: its metadata says num_heads = {heads!r}; it must be a positive integer")
    pre = meta.get("preprocess")
    if pre:

        try:
            Preprocess.from_dict(dict(pre, crop_size=list(pre.get("crop_size") or (224, 224))))
        except Exception as err:  # noqa: BLE001 - any malformed field is the file's fault
            detail = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
            raise ModelLoadError(f"{where}: its metadata field 'preprocess' is malformed ({detail}); "
                                 "fix it, or override with --mean/--std/--crop-pct/--interpolation") from None

        if "interpolation" in pre and pre["interpolation"] not in INTERPOLATIONS:
            raise ModelLoadError(f"{where}: its metadata preprocess.interpolation = {pre['interpolation']!r} is not one of "
                                 f"{', '.join(INTERPOLATIONS)}; fix it or pass --interpolation")
        std = pre.get("std")
        mean = pre.get("mean")
        for name, values in (("mean", mean), ("std", std)):
            if values is not None and not (isinstance(values, (list, tuple)) and len(values) >= 1
                                           and all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)):
                raise ModelLoadError(f"{where}: its metadata preprocess.{name} = {values!r} is not a list of finite numbers "
                                     f"(one per channel); fix it or pass --{name}")
        if std is not None and any(v <= 0 for v in std):
            raise ModelLoadError(f"{where}: its metadata preprocess.std = {std!r} has a value <= 0; fix it or pass --std")


def check_heads_agree(flag: int | None, recorded: int | None, what: str) -> None:
    """--num-heads may fill a gap, never overrule what the file (or --arch) records."""
    if flag and recorded and int(flag) != int(recorded):
        raise UsageError(f"--num-heads {flag} contradicts the {recorded} heads {what}; drop --num-heads "
                         "(a wrong head count silently changes what the model computes)")


QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "QLinearAdd",
                 "QLinearMul", "MatMulInteger", "ConvInteger", "QGemm", "QAttention", "DynamicQuantizeMatMul"}


def check_onnx_fp32(model, where: str) -> None:
    """An ONNX file vitedge quantizes must be FP32: a graph already quantized (Q/DQ or integer ops, or vitedge's own
    INT8 output) cannot be calibrated again, and ONNX Runtime's reference run of it fails deep inside."""
    found = sorted({n.op_type for n in model.graph.node} & QUANTIZED_OPS)
    meta = {p.key for p in model.metadata_props}
    if found or "vitedge.quantization" in meta:
        what = f"quantized ops ({', '.join(found[:4])})" if found else "vitedge's INT8 metadata"
        raise ModelLoadError(f"{where} is already an INT8 graph ({what}); vitedge quantizes an FP32 model itself: pass the FP32 "
                             "model it came from (`vitedge export` writes one)")


def check_onnx_batch(graph, where: str) -> None:
    """The image input's batch axis is dynamic: vitedge validates and serves batches of any size."""
    inputs = graph_inputs(graph)
    image = inputs[0] if inputs else None
    dims = image.type.tensor_type.shape.dim if image is not None else []
    if dims and dims[0].HasField("dim_value"):
        raise ModelLoadError(f"{where}: the ONNX input has a fixed batch of {dims[0].dim_value}; vitedge validates and serves "
                             "batches of any size: re-export with a dynamic batch axis "
                             "(torch.onnx.export(..., dynamic_axes={'input': {0: 'batch'}}))")


def check_onnx_is_vit(graph, where: str) -> None:
    """An ONNX file vitedge builds from: attention (a Softmax or a fused attention op), a fixed or dynamic
    batch axis the runtime can serve, and one (batch, classes|features) output."""
    ops = {n.op_type for n in graph.node}
    if not ops & {"Softmax", "Attention", "MultiHeadAttention", "ScaledDotProductAttention"}:
        raise ModelLoadError(f"{where}: the ONNX graph has no attention (no Softmax or attention op), so it is not a Vision "
                             f"Transformer (ops: {', '.join(sorted(ops)[:8])}); vitedge builds ViTs only")
    check_onnx_batch(graph, where)
    if len(graph.output) < 1:
        raise ModelLoadError(f"{where}: the ONNX graph has no output")
    out = graph.output[0]
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in out.type.tensor_type.shape.dim]
    if len(dims) != 2:
        raise ModelLoadError(f"{where}: the ONNX output '{out.name}' has shape {dims}; vitedge needs a (batch, classes) or "
                             "(batch, features) output (pool the tokens, e.g. take the class token, before exporting)")
