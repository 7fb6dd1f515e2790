"""What a target's bundle ships after its own INT8 payoff decision (issue 47): the counts and the accuracy budget's
verdict of the manifest speak of that graph, not of the shared all-INT8 Q/DQ graph.

A CPU target may keep float, for its CPU kind, INT8 layers that do not pay there, up to the whole model
(``backend_info.int8_payoff``, vitedge/backends/ov_payoff.py and onnxruntime/payoff.py). Then:

* ``quantization.layers_int8``, ``kept_float``, ``layer_kinds`` and ``summary_line`` count the layers the bundle
  runs in INT8 (``count_shipped``);
* the accuracy budget was searched on the shared graph; where that graph is not what this target ships, its verdict
  for this target is the validation gate's, which ran the shipped graph on the same validation data against this
  target's thresholds (``shipped_budget_verdict``). A target that ships the FP32 graph has nothing to fail there.
"""

from __future__ import annotations

from typing import Any, Iterable

from vitedge.bundle.sections import QuantizationSection
from vitedge.quantize.qdq import QuantizedGraph

SPEED_ROWS = ("min_speedup", "max_p99_ms")


def payoff_record(info: dict[str, Any] | None) -> dict[str, Any]:
    rec = (info or {}).get("int8_payoff")
    return rec if isinstance(rec, dict) else {}


def ships_fp32(info: dict[str, Any] | None) -> bool:
    """Whether the target's timing kept the whole model float (its artifact is the FP32 graph)."""
    rec = payoff_record(info)
    timed = rec.get("timed") if isinstance(rec.get("timed"), dict) else {}
    return bool(rec.get("whole_model_float") or timed.get("whole_model_float"))


def payoff_floated(info: dict[str, Any] | None) -> list[str]:
    """Node names of the INT8 layers the target kept float, in its record's order."""
    return [str(k["name"]) for k in payoff_record(info).get("kept_float") or [] if isinstance(k, dict) and k.get("name")]


def count_shipped(section: QuantizationSection, graph: QuantizedGraph, info: dict[str, Any] | None) -> int:
    """Make ``section``'s layer counts those of the graph the target ships (in place); returns how many INT8 layers of
    the shared graph the target kept float (0: the section is unchanged)."""
    floated = set(payoff_floated(info)) & set(graph.quantized)
    if ships_fp32(info):
        floated = set(graph.quantized)
    if not floated:
        return 0
    shipped = [n for n in graph.quantized if n not in floated]
    section.layers_int8 = len(shipped)
    section.kept_float = list(section.kept_float) + [n for n in graph.quantized if n in floated]
    kinds: dict[str, dict[str, int]] = {}
    for layer in graph.layers:
        row = kinds.setdefault(layer.kind, {"int8": 0, "total": 0})
        row["total"] += 1
        row["int8"] += int(layer.name in shipped)
    section.layer_kinds = kinds
    rec = payoff_record(info)
    # for the CPU kind the bundle is for, where it was not the build machine's (recorded figures decided)
    cpu = f"{rec['cpu_kind']} CPUs" if rec.get("cpu_kind") and rec.get("cpu_kind") != rec.get("built_on") else rec.get("cpu") or "this CPU"
    what = "the whole model" if ships_fp32(info) else f"{len(floated)} INT8 layer(s)"
    section.summary_line = (f"{len(shipped)} of {len(graph.layers)} layers INT8 as shipped ({what} returned to float "
                            f"by the target's INT8 payoff on {cpu}); the shared Q/DQ graph: {section.summary_line}")
    return len(floated)


def shipped_budget_verdict(not_met: str | None, info: dict[str, Any] | None,
                           gate: Iterable[Any] | None) -> tuple[str | None, dict[str, Any] | None]:
    """(the budget failure to record for this target, the budget verdict to write, None: keep the budget's own).

    ``not_met``: the budget's failure line on the shared graph (None when it was met); ``gate``: the validation's
    gate rows of the shipped graph (None when nothing was validated here)."""
    if not_met is None or not payoff_floated(info) and not ships_fp32(info):
        return not_met, None
    if ships_fp32(info):
        return None, {"passed": True, "detail": "not applicable: this target ships the FP32 graph (INT8 did not pay on "
                      f"{payoff_record(info).get('cpu') or 'this CPU'}); the budget's search on the INT8 graph: {not_met}"}
    if gate is None:
        return not_met, None  # the shipped graph was not run here: the budget's verdict on the closest graph stands
    rows = [r for r in gate if getattr(r, "name", None) not in SPEED_ROWS]
    failed = [r for r in rows if getattr(r, "status", "pass") == "fail"]
    n = len(payoff_floated(info))
    if failed:
        detail = (f"accuracy budget not met by the shipped graph ({n} INT8 layer(s) kept float by the target's timing): "
                  + "; ".join(str(r.detail) for r in failed))
        return detail, {"passed": False, "detail": detail}
    return None, {"passed": True, "detail": f"met by the shipped graph ({n} INT8 layer(s) kept float by the target's timing), "
                  f"judged by the validation gate on the same data; the budget's search on the shared graph: {not_met}"}
