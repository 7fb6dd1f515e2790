"""The TensorRT part of report.md: attention-fusion warnings from the plan, then (once an
engine is built) the inspector's per-layer precision, the MHA fusion of each attention block,
and what happened to the timing cache."""

from __future__ import annotations

from typing import Any

from vitedge.backends.tensorrt.attention import fusion_table
from vitedge.backends.tensorrt.engine_inspect import one_line


def report_lines(info: dict[str, Any]) -> list[str]:
    lines = ["## TensorRT", ""]
    for w in (info.get("attention") or {}).get("warnings", []):
        lines.append(f"- warning: {w}")
    table = fusion_table((info.get("attention") or {}).get("blocks") or [])
    if table:
        lines += ["", "INT8 fused attention, per block (TensorRT's rules: Q/DQ on both inputs of both matmuls, head size "
                  "16/32/64, at most 512 tokens):", "", *table, ""]
    if not info.get("engine_built"):
        lines += [f"- engine: not built here; planned for TensorRT {info.get('planned_for_tensorrt', '?')}", ""]
        return lines
    device = info.get("device") or {}
    mode = f", power mode {device['power_mode']}" if device.get("power_mode") else ""  # a Jetson's nvpmodel mode
    lines.append(f"- built with TensorRT {device.get('tensorrt', '?')} on {device.get('gpu_name', '?')} "
                 f"(compute {device.get('compute_capability', '?')}{mode})")
    timing = info.get("timing_cache")
    if timing:
        lines.append(f"- timing cache: {'reused' if timing.get('reused') else 'fresh'} ({timing.get('source', '')}); "
                     f"sha256 {str(timing.get('sha256', '?'))[:16]}")
    builds = info.get("build") or {}
    int8 = (builds.get("int8") or {}).get("engine_layers")
    for role, b in builds.items():
        layers = b.get("engine_layers")
        if layers:
            lines.append(f"- {role} engine: {one_line(layers)}")
        for w in b.get("warnings", []):
            lines.append(f"- {role} warning: {w}")
    if int8 and (int8.get("attention") or {}).get("blocks"):
        lines += ["", "| attention block | fused MHA kernel |", "|---|---|"]
        lines += [f"| `{b['scope']}` | {b['mha']} |" for b in int8["attention"]["blocks"]]
    if int8 and int8.get("layer_precision"):
        lines += ["", "<details><summary>Per-layer precision of the INT8 engine (engine inspector)</summary>", "",
                  "| layer | precision |", "|---|---|"]
        lines += [f"| `{name}` | {prec} |" for name, prec in int8["layer_precision"].items()]
        lines += ["", "</details>"]
    lines.append("")
    return lines
