"""Read the engine inspector's layer list: where each layer runs, in which precision, and
whether each attention block of the graph became a fused MHA kernel.

Input is ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`` of an engine
built with ``ProfilingVerbosity.DETAILED`` (TensorRT docs, "Engine Inspector"): a dict whose
"Layers" are dicts with "Name", "LayerType", "Inputs"/"Outputs" (each with a
"Format/Datatype" text such as "Row major linear Int8") and "TacticName". With a lower
verbosity the layers are bare names; then only the count is known.

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


def _precision(tensors: Any) -> str | None:
    for t in tensors or []:
        text = str(t.get("Format/Datatype", "")) if isinstance(t, dict) else str(t)
        for name, pattern in _PRECISIONS:
            if re.search(pattern, text):
                return name
    return None


def layer_precision(layer: dict[str, Any]) -> str | None:
    """INT8 when the layer reads INT8 (the kernel computes in INT8), else its output's type."""
    first_in = _precision(layer.get("Inputs"))
    if first_in in ("int8", "fp8", "int4"):
        return first_in
    return _precision(layer.get("Outputs")) or first_in


def is_mha(layer: dict[str, Any]) -> bool:
    text = " ".join(str(layer.get(k, "")) for k in ("Name", "LayerType", "TacticName"))
    return bool(_MHA.search(text))


def summarize_layers(info: Any, attention: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Layer count, DLA layers, per-layer precision and per-block MHA fusion."""
    layers = info.get("Layers", []) if isinstance(info, dict) else []
    names: list[str] = []
    dla: list[str] = []
    precision: dict[str, str] = {}
    counts: dict[str, int] = {}
    mha_layers: list[str] = []
    records: list[tuple[str, str, bool]] = []  # (name, searchable text, is_mha)
    for layer in layers:
        if isinstance(layer, str):
            name, text, mha, prec = layer, layer, bool(_MHA.search(layer)), None
        else:
            name = str(layer.get("Name", "?"))
            text = json.dumps(layer)
            mha, prec = is_mha(layer), layer_precision(layer)
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
                           "precision_counts": counts, "layer_precision": precision, "mha_layers": mha_layers}
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
    att = summary.get("attention")
    if att is not None and att["blocks"]:
        n = len(att["blocks"])
        line += f"; attention: {att['fused']} of {n} block(s) fused into MHA kernels"
        if att["not_fused"]:
            line += f", {att['not_fused']} not fused"
        if att["unknown"]:
            line += f", {att['unknown']} not visible in the inspector"
    return line
