"""Validate one built artifact against its FP32 reference on the same runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.profiles import Thresholds
from vitedge.validation.accuracy import collect_outputs, compare_embeddings, compare_logits
from vitedge.validation.inputs import feed_for
from vitedge.validation.latency import measure_latency


@dataclass
class GateRow:
    name: str
    value: float | None
    limit: float
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "limit": self.limit, "passed": self.passed, "detail": self.detail}


@dataclass
class ValidationResult:
    accuracy: dict[str, Any]
    latency: dict[str, Any]  # "fp32"/"int8" -> {batch: stats}
    speedup: float | None
    gate: list[GateRow] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.gate)

    def __bool__(self) -> bool:
        return self.passed

    def failures(self) -> list[GateRow]:
        return [r for r in self.gate if not r.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "accuracy": self.accuracy,
            "latency": self.latency,
            "speedup": self.speedup,
            "gate": [r.to_dict() for r in self.gate],
            "data": self.data,
        }


def evaluate_gate(accuracy: dict[str, Any], speedup: float | None, p99_ms: float | None, t: Thresholds) -> list[GateRow]:
    rows: list[GateRow] = []
    drop = accuracy.get("top1_drop_points")
    if drop is not None:
        rows.append(GateRow("max_top1_drop", drop, t.max_top1_drop, drop <= t.max_top1_drop + 1e-9,
                            f"top-1 {100 * accuracy['int8_top1']:.2f}% vs FP32 {100 * accuracy['fp32_top1']:.2f}%: drop {drop:.2f} points (limit {t.max_top1_drop:g})"))
    agree = accuracy.get("top1_agreement")
    if agree is not None:
        rows.append(GateRow("min_agreement", agree, t.min_agreement, agree >= t.min_agreement - 1e-12,
                            f"top-1 agreement with FP32 {100 * agree:.2f}% (limit {100 * t.min_agreement:.2f}%)"))
    if speedup is not None:
        rows.append(GateRow("min_speedup", speedup, t.min_speedup, speedup >= t.min_speedup,
                            f"speedup over FP32 {speedup:.2f}x at batch 1 (limit {t.min_speedup:g}x)"))
    if t.max_p99_ms is not None and p99_ms is not None:
        rows.append(GateRow("max_p99_ms", p99_ms, t.max_p99_ms, p99_ms <= t.max_p99_ms,
                            f"p99 latency {p99_ms:.2f} ms at batch 1 (limit {t.max_p99_ms:g} ms)"))
    return rows


def validate_artifact(backend, options, model_path: Path, reference_path: Path, source, spec, thresholds: Thresholds,
                      batch_sizes: tuple[int, ...] = (1,), *, measure_speed: bool = True, threads: int | None = None) -> ValidationResult:
    """Run the artifact and its FP32 reference on the same backend and the same inputs."""
    pre = spec.preprocess
    with backend.open_runner(reference_path, options, threads=threads) as ref_runner, \
            backend.open_runner(model_path, options, threads=threads) as int8_runner:
        ref = collect_outputs(ref_runner, source, pre)
        got = collect_outputs(int8_runner, source, pre)
        if spec.output_kind == "embedding":
            accuracy = compare_embeddings(ref.values, got.values)
        else:
            accuracy = compare_logits(ref.values, got.values, ref.labels)
        latency: dict[str, Any] = {"fp32": {}, "int8": {}}
        speedup = p99 = None
        if measure_speed:
            first = next(iter(source.batches(max(batch_sizes))))
            for b in sorted(set((1,) + tuple(batch_sizes))):
                x = np.repeat(first.images, int(np.ceil(b / len(first.images))), axis=0)[:b]
                for name, runner in (("fp32", ref_runner), ("int8", int8_runner)):
                    feed = feed_for(runner, x, pre)
                    latency[name][str(b)] = measure_latency(runner.infer, feed).to_dict()
            speedup = latency["fp32"]["1"]["p50_ms"] / latency["int8"]["1"]["p50_ms"]
            p99 = latency["int8"]["1"]["p99_ms"]
    result = ValidationResult(accuracy=accuracy, latency=latency, speedup=speedup,
                              data={"path": source.summary.path, "items": len(source), "labeled": source.summary.labeled,
                                    "data_hash": source.summary.data_hash})
    result.gate = evaluate_gate(accuracy, speedup, p99, thresholds)
    return result
