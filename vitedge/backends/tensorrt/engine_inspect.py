"""Read the engine inspector's layer list: where each layer runs, in which precision, and
whether each attention block of the graph became a fused MHA kernel.

Input is ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`` of an engine
built with ``ProfilingVerbosity.DETAILED`` (TensorRT docs, "Engine Inspector"), in either schema:

* 8.6-10.x: "Layers" are dicts with "Name", "LayerType", "Inputs"/"Outputs" (each with one
  "Format/Datatype" text such as "Row major linear Int8") and "TacticName"; "Bindings" lists the
  I/O tensor names;
* 11.x: "Bindings" became "I/O Tensors", a list of objects with "Name", "IOMode", "DataType",
  "ProfileInfo" (TensorRT 11 IEngineInspector migration guide), and a layer tensor's format and
  data type are separate fields: "Format" and "Datatype" (lower-case t: "TensorRT 11 split the combined
  "Format/Datatype" field into separate "Datatype" and "Format" keys", Polygraphy 0.53.6,
  ``polygraphy/tools/inspect/subtool/model/extractors/_trt.py``:243-249; issue #29 had read "DataType"). Both
  spellings are read, for the layers' tensors and for "I/O Tensors". No 11.x record from a GPU was
  read here.

An engine with a dynamic profile reports "N/A due to dynamic shapes" for its tensors unless the
inspector has an execution context whose input shapes are set (``inspector.execution_context``);
``build._inspect`` binds one at the profile's opt shape. Where the tensors still say N/A, the
precision is read from the layer's weights type or its tactic name (which names the kernel's types,
e.g. ``..._i8i8_...``), else counted as unknown, never as a precision. With a lower verbosity
the layers are bare names; then only the count is known.

Fused attention shows as a layer whose name, type or tactic names an MHA kernel ("mha",
"fmha", as users look for it, field notes). A block counts as fused when such a layer names
the block's scope, as not fused when its attention MatMuls appear as layers of their own,
and as unknown otherwise (e.g. hidden inside one Myelin "ForeignNode" region).
"""

from __future__ import annotations

import json
import re
from typing import Any

_MHA = re.compile(r"(?i)(f?mha|multi_?head)")
# Order matters: "Int8" before "Int32"/"Float", "FP16"/"Half" before "FP32"/"Float".
_PRECISIONS = (("int8", r"(?i)\bint8\b"), ("fp8", r"(?i)\bfp8\b"), ("int4", r"(?i)\bint4\b"), ("fp16", r"(?i)\b(fp16|half)\b"),
               ("bf16", r"(?i)\bbf16\b"), ("fp32", r"(?i)\b(fp32|float)\b"), ("int32", r"(?i)\bint32\b"),
               ("int64", r"(?i)\bint64\b"), ("bool", r"(?i)\bbool\b"))


NOT_AVAILABLE = "N/A due to dynamic shapes"
# Tactic names carry the kernel's element types: sm87_xmma_gemm_i8i8..., ..._f16f16_..., i8f32_i8i32_f32.
_TACTIC = (("int8", r"(?i)(^|[_x])i8(i8|f16|f32)?($|_)|int8"), ("fp16", r"(?i)(^|_)(f16|h1688|hmma|fp16)"),
           ("fp32", r"(?i)(^|_)(f32f32|sgemm|fp32)(_|$)"))


# The 11.x data-type field: "Datatype" in the layers' tensors, "DataType" as the migration guide spells "I/O Tensors".
DATATYPE_KEYS = ("Datatype", "DataType")


def _datatype(t: dict[str, Any]) -> Any:
    return next((t[k] for k in DATATYPE_KEYS if t.get(k) is not None), None)


def tensor_type(t: object) -> str | None:
    """One tensor's type text from a 10.x ("Format/Datatype") or 11.x ("DataType", "Format") record;
    None when the inspector could not say (dynamic shapes without a bound context)."""
    if isinstance(t, dict) and any(k in t for k in (*DATATYPE_KEYS, "Format")):
        parts = [str(_datatype(t) or ""), str(t.get("Format", ""))]
        text = " ".join(x for x in parts if x.strip() and NOT_AVAILABLE not in x)
    else:
        text = str(t.get("Format/Datatype", "")) if isinstance(t, dict) else str(t)
        text = "" if NOT_AVAILABLE in text else text
    return text.strip() or None


def _precision_of(text: str) -> str | None:
    for name, pattern in _PRECISIONS:
        if re.search(pattern, text):
            return name
    return None


def _precision(tensors: Any) -> str | None:
    for t in tensors or []:
        text = tensor_type(t)
        if text is not None and (prec := _precision_of(text)):
            return prec
    return None


def _unavailable(layer: dict[str, Any]) -> bool:
    tensors = list(layer.get("Inputs") or []) + list(layer.get("Outputs") or [])
    return bool(tensors) and all(tensor_type(t) is None for t in tensors)


def _from_weights_or_tactic(layer: dict[str, Any]) -> str | None:
    weights = layer.get("Weights")
    if isinstance(weights, dict) and (prec := _precision_of(str(weights.get("Type", "")))):
        return prec
    tactic = str(layer.get("TacticName", ""))
    for name, pattern in _TACTIC:
        if tactic and re.search(pattern, tactic):
            return name
    return None


def layer_precision(layer: dict[str, Any]) -> str | None:
    """INT8 when the layer reads INT8 (the kernel computes in INT8), else its output's type; where the
    tensors say N/A (dynamic shapes), its weights' type or tactic name; None when nothing says."""
    first_in = _precision(layer.get("Inputs"))
    if first_in in ("int8", "fp8", "int4"):
        return first_in
    found = _precision(layer.get("Outputs")) or first_in
    return found if found is not None else _from_weights_or_tactic(layer)


def is_mha(layer: dict[str, Any]) -> bool:
    text = " ".join(str(layer.get(k, "")) for k in ("Name", "LayerType", "TacticName"))
    return bool(_MHA.search(text))


def io_tensors(info: object) -> list[dict[str, Any]]:
    """The engine's I/O tensors from 10.x "Bindings" (names) or 11.x "I/O Tensors" (objects)."""
    if not isinstance(info, dict):
        return []
    if isinstance(info.get("I/O Tensors"), list):
        return [{"name": str(t.get("Name", "?")), "mode": str(t.get("IOMode", "")).lower() or None,
                 "dtype": (str(_datatype(t)) if _datatype(t) and NOT_AVAILABLE not in str(_datatype(t)) else None)}
                for t in info["I/O Tensors"] if isinstance(t, dict)]
    return [{"name": str(n), "mode": None, "dtype": None} for n in info.get("Bindings") or []]


def summarize_layers(info: object, attention: list[dict[str, Any]] | None = None, *, context_bound: bool | None = None
                     ) -> dict[str, Any]:
    """Layer count, DLA layers, per-layer precision, per-block MHA fusion and the I/O tensors.
    ``context_bound`` records whether the inspection had an execution context at the opt shape."""
    layers = info.get("Layers", []) if isinstance(info, dict) else []
    names: list[str] = []
    dla: list[str] = []
    precision: dict[str, str] = {}
    counts: dict[str, int] = {}
    mha_layers: list[str] = []
    unknown: list[str] = []
    records: list[tuple[str, str, bool]] = []  # (name, searchable text, is_mha)
    for layer in layers:
        if isinstance(layer, str):
            name, text, mha, prec = layer, layer, bool(_MHA.search(layer)), None
        else:
            name = str(layer.get("Name", "?"))
            text = json.dumps(layer)
            mha, prec = is_mha(layer), layer_precision(layer)
            if prec is None and _unavailable(layer):
                unknown.append(name)
        names.append(name)
        if "DLA" in text:
            dla.append(name)
        if prec is not None:
            precision[name] = prec
            counts[prec] = counts.get(prec, 0) + 1
        if mha:
            mha_layers.append(name)
        records.append((name, text, mha))
    out: dict[str, Any] = {"count": len(names), "dla_layers": dla, "gpu_layers": len(names) - len(dla),
                           "precision_counts": counts, "layer_precision": precision, "mha_layers": mha_layers,
                           "schema": "11.x" if isinstance(info, dict) and "I/O Tensors" in info else "8.6-10.x",
                           "io_tensors": io_tensors(info)}
    if unknown:
        out["precision_unknown"] = len(unknown)
    if context_bound is not None:
        out["context_bound"] = context_bound
    if attention is not None:
        out["attention"] = attention_fusion(records, attention)
    return out


def attention_fusion(records: list[tuple[str, str, bool]], attention: list[dict[str, Any]]) -> dict[str, Any]:
    blocks = []
    for block in attention:
        scope = block["scope"]
        own = [block["qk_matmul"], block.get("pv_matmul")]
        if any(mha and scope and scope in text for _n, text, mha in records):
            state = "fused"
        elif any(not mha and name in own for name, _t, mha in records):
            state = "not fused"
        else:
            state = "unknown"
        blocks.append({"scope": scope, "mha": state})
    fused = sum(b["mha"] == "fused" for b in blocks)
    not_fused = sum(b["mha"] == "not fused" for b in blocks)
    return {"blocks": blocks, "fused": fused, "not_fused": not_fused, "unknown": len(blocks) - fused - not_fused}


def one_line(summary: dict[str, Any]) -> str:
    """'12 layers: 5 int8, 7 fp16; attention: 2 of 2 blocks fused into MHA kernels'."""
    counts = summary.get("precision_counts") or {}
    prec = ", ".join(f"{n} {p}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "precision not reported"
    line = f"{summary.get('count', 0)} engine layers: {prec}"
    if summary.get("precision_unknown"):
        line += f", {summary['precision_unknown']} not reported ({NOT_AVAILABLE})"
    att = summary.get("attention")
    if att is not None and att["blocks"]:
        n = len(att["blocks"])
        line += f"; attention: {att['fused']} of {n} block(s) fused into MHA kernels"
        if att["not_fused"]:
            line += f", {att['not_fused']} not fused"
        if att["unknown"]:
            line += f", {att['unknown']} not visible in the inspector"
    return line
