"""The budget's speed verdict on each target: layers returned to float must not leave the INT8
graph no faster than FP32 (or under the profile's min_speedup) on the target's own runtime.
Judged from the target's validation speedup, after the build, and recorded in the manifest."""

from __future__ import annotations

import math
from typing import Any

from vitedge.bundle.manifest import Manifest
from vitedge.targets.profiles import TargetProfile, Thresholds
from vitedge.core.ui import StageLog


def speed_verdict(rec: dict[str, Any] | None, speedup: float | None, min_speedup: float, where: str,
                  allowance: str = "") -> str | None:
    """A gate failure line when the layers the budget returned to float leave INT8 no faster than
    FP32 (or under the profile's min_speedup) on the target's runtime; None otherwise.

    ``allowance`` names a CPU-kind allowance the speed gate applies here (the intel-cpu profile's
    min_speedup_without_vnni on an x86 CPU without VNNI/AMX, where INT8 is known not to beat FP32 and the
    bundle is kept for the CPUs that have them): then ``min_speedup`` is that allowance and the budget's
    graph is held to it, as the speed gate holds the full INT8 graph, instead of to "faster than FP32"."""
    if not rec or rec.get("status") != "fallback" or speedup is None or not math.isfinite(speedup):
        return None
    if (speedup >= float(min_speedup)) if allowance else (speedup > 1.0 and speedup >= float(min_speedup)):
        return None
    n = len(rec.get("returned") or [])
    if allowance:
        why = f"under the speed allowance {float(min_speedup):g}x{allowance}"
    else:
        why = ("no faster than FP32, so it is not shipped as INT8" if speedup <= 1.0
               else f"under the profile's min_speedup {float(min_speedup):g}x")
    lat = rec.get("latency") or {}
    context = ""
    if lat.get("int8_speedup") and lat["int8_speedup"] <= max(1.0, float(min_speedup)):
        context = (f" (the full INT8 graph was already only {lat['int8_speedup']:.2f}x FP32 on ONNX Runtime here: "
                   "the float layers are not the only cause)")
    return (f"accuracy budget: meeting it took {n} of {rec.get('candidates')} INT8 layers back to float, and the graph is "
            f"{speedup:.2f}x FP32 on {where} at batch 1: {why}{context}; loosen --max-top1-drop/--min-agreement, fix the "
            "model's activation outliers (e.g. SmoothQuant), or deploy FP32")


def record_speed_verdict(manifest: Manifest, speedup: float | None, thresholds: Thresholds, profile: TargetProfile,
                         log: StageLog) -> str | None:
    """Record (and log) whether the layers the budget returned to float left INT8 no faster than FP32
    on this target's runtime (``speedup``: its validation's batch-1 speedup; None: not measured or not validated)."""
    rec = manifest.quantization.budget
    if not rec:
        return None
    floor, allowance = thresholds.speedup_floor()
    failure = speed_verdict(rec, speedup, floor, f"{profile.name} ({profile.backend})", allowance)
    rec["speed_verdict"] = {"speedup": speedup, "runtime": profile.backend, "passed": None if speedup is None else failure is None,
                            "detail": failure, "floor": floor if allowance else max(1.0, floor),
                            "allowance": allowance.strip() or None}
    if failure:
        log.info("FAIL " + failure)
    return failure


def record_budget_not_met(manifest: Manifest, detail: str) -> None:
    """Mark the budget's record: the closest INT8 graph it found is shipped for inspection, failed."""
    manifest.quantization.budget["verdict"] = {"passed": False, "detail": detail}


def budget_not_met(manifest: Manifest) -> str | None:
    """Why the accuracy budget recorded in the manifest was not met; None when it was, or when none ran."""
    verdict = (manifest.quantization.budget or {}).get("verdict") or {}
    return verdict.get("detail", "accuracy budget not met") if verdict.get("passed") is False else None
