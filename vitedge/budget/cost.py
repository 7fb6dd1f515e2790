"""What the layers the budget returned to float cost in speed (``measure_costs``): end-to-end
batch-1 latency of FP32, the full INT8 graph and the chosen graph in ONNX Runtime, timed
interleaved, and per layer the difference of that node's kernel time in ONNX Runtime's
profile, float in the chosen graph vs INT8 in the full INT8 graph.

Heavy imports (onnxruntime) happen inside the functions.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vitedge.core import telemetry
from vitedge.budget.record import BudgetResult, LayerCost
from vitedge.onnxkit.session import SessionSettings, ort_session
from vitedge.files.outputs import work_prefix
from vitedge.quantize.qdq import build_qdq
from vitedge.validation.latency import LatencySettings, measure_interleaved

if TYPE_CHECKING:
    from onnx import ModelProto
    InferenceSession = telemetry.onnxruntime().InferenceSession


def float_layers(result: BudgetResult) -> list[LayerCost]:
    """Every layer the chosen graph keeps in float, with why (costs not yet measured)."""
    graph = result.graph
    by_name = {l.name: l for l in graph.layers}
    rank = {}
    metric_value = {}
    if result.sensitivity:
        metric = result.sensitivity["metric"]
        for r in result.sensitivity["layers"]:
            rank[r["name"]] = r["rank"]
            metric_value[r["name"]] = r[metric]
    returned, pinned = set(result.returned), set(result.pinned)
    out = []
    for name in graph.kept_float:
        layer = by_name[name]
        why = "budget" if name in returned else "pinned" if name in pinned else "config"
        out.append(LayerCost(name, layer.kind, layer.op_type, why, rank.get(name), metric_value.get(name)))
    out.sort(key=lambda c: ({"budget": 0, "pinned": 1, "config": 2}[c.why], c.rank or 0, c.name))
    return out


def measure_costs(result: BudgetResult, fp32: str | Path | ModelProto, example: np.ndarray, *, threads: int | None = None,
                  latency_seconds: float = 0.3, profile_runs: int = 100, profile_seconds: float = 0.5) -> None:
    """Fill ``result.costs`` (per-layer, ORT profiler) and ``result.latency`` (end to end, ORT).

    ``example`` is one model-ready input (1 x C x H x W). Only layers the budget returned get a
    measured cost; pinned and config layers are listed without one."""

    result.costs = float_layers(result)
    if result.status != "fallback":
        return

    x = np.ascontiguousarray(example[:1], dtype=np.float32)
    int8 = build_qdq(result.graph.calibration, keep_float=result.pinned)  # the full INT8 graph (pins respected)
    sources = {"fp32": Path(fp32) if isinstance(fp32, (str, Path)) else fp32, "int8": int8.model, "chosen": result.graph.model}
    sessions = {k: timing_session(v, threads=threads) for k, v in sources.items()}
    feeds = {k: {s.get_inputs()[0].name: x} for k, s in sessions.items()}
    runs = {k: (lambda s=s, f=feeds[k]: s.run(None, f)) for k, s in sessions.items()}
    stats = measure_interleaved(runs, 1, LatencySettings.for_budget(latency_seconds))
    p50 = {k: s.p50_ms for k, s in stats.items()}
    result.latency = {
        "runtime": "onnxruntime (CPU)", "batch": 1,
        "method": "p50 of interleaved rounds (vitedge.validation.latency)",
        "fp32_ms": p50["fp32"], "int8_ms": p50["int8"], "chosen_ms": p50["chosen"],
        "int8_speedup": p50["fp32"] / p50["int8"], "chosen_speedup": p50["fp32"] / p50["chosen"],
        "stable": all(s.stable for s in stats.values()),
    }
    runs_n = max(10, min(profile_runs, int(1000.0 * profile_seconds / max(p50["chosen"], 1e-3))))
    t_int8 = _node_times(sources["int8"], x, runs_n, threads)
    t_chosen = _node_times(sources["chosen"], x, runs_n, threads)
    for c in result.costs:
        if c.why == "budget":
            c.float_us, c.int8_us = t_chosen.get(c.name), t_int8.get(c.name)


def timing_session(src: str | Path | bytes | ModelProto, *, threads: int | None = None,
                   profile_prefix: str | None = None) -> InferenceSession:
    """An ONNX Runtime CPU session for timing several graphs interleaved in one process: full graph
    optimizations, and intra-op threads that sleep instead of spinning when idle.

    With spinning on (ONNX Runtime's default, right for one session per process), the idle
    sessions' threads busy-wait while another session runs: on a loaded 2-core machine the FP32
    graph, whose GEMMs wait on both threads, measured 12-14 ms against 1.7 ms alone, which
    inflates every INT8-vs-FP32 ratio."""

    settings = SessionSettings(threads=threads, spinning=False, profile_prefix=profile_prefix)
    return ort_session(src, settings)  # a path, bytes or a ModelProto (past 2 GB via external data)


def _node_times(model: str | Path | ModelProto, x: np.ndarray, runs: int, threads: int | None) -> dict[str, float]:
    """Median kernel time (us) per node name from ONNX Runtime's profiler."""


    with tempfile.TemporaryDirectory(prefix=work_prefix("profile")) as tmp:
        sess = timing_session(model, threads=threads, profile_prefix=os.path.join(tmp, "ort"))
        feed = {sess.get_inputs()[0].name: x}
        for _ in range(5):
            sess.run(None, feed)
        for _ in range(runs):
            sess.run(None, feed)
        path = sess.end_profiling()
        events = json.loads(Path(path).read_text())
    times: dict[str, list[float]] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "Node" and name.endswith("_kernel_time"):
            times.setdefault(name[: -len("_kernel_time")], []).append(float(e.get("dur", 0)))
    return {k: float(np.median(v[5:] if len(v) > 5 else v)) for k, v in times.items()}
