"""What the accuracy budget did, as records: one evaluated candidate (``Evaluation``), one
layer kept in float and its cost (``LayerCost``), and the whole search (``BudgetResult``),
whose ``to_dict()`` is the manifest's ``quantization.budget`` record."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vitedge.budget.report import describe_record
from vitedge.budget.settings import BUDGET_VERSION, BudgetSettings

if TYPE_CHECKING:
    from vitedge.quantize.qdq import QuantizedGraph

RUNTIME = "onnxruntime (CPUExecutionProvider, graph optimizations on)"


@dataclass
class Evaluation:
    """One candidate graph, evaluated."""

    index: int  # 1-based
    step: str  # full-int8 | grow | bisect | prune
    returned: tuple[str, ...]  # layers the search returned to float in this candidate
    passed: bool
    accuracy: dict[str, Any]
    failures: list[str]
    seconds: float
    variant: str | None = None  # method select: the calibration candidate this graph was built from

    def to_dict(self) -> dict[str, Any]:
        keys = ("samples", "top1_drop_points", "fp32_top1", "int8_top1", "top1_agreement", "softmax_kl_mean", "embedding_cosine_mean",
                "embedding_cosine_low", "nn_agreement", "stopped_early")
        return {"index": self.index, "step": self.step, "float_layers": len(self.returned), "returned": list(self.returned),
                "passed": self.passed, "accuracy": {k: self.accuracy[k] for k in keys if k in self.accuracy},
                "runtimes": {name: {k: acc[k] for k in keys if k in acc} for name, acc in self.accuracy.get("runtimes", {}).items()},
                "failures": list(self.failures), "seconds": round(self.seconds, 3), **({"calibration": self.variant} if self.variant else {})}

    def describe(self) -> str:
        a = self.accuracy
        parts = []
        if a.get("top1_drop_points") is not None:
            parts.append(f"drop {a['top1_drop_points']:.2f} pt")
        if a.get("embedding_cosine_mean") is not None:
            parts.append(f"cosine mean {a['embedding_cosine_mean']:.5f}, p{a.get('embedding_cosine_low_percentile', 5):g} "
                         f"{a.get('embedding_cosine_low', float('nan')):.5f}")
        elif a.get("top1_agreement") is not None:
            parts.append(f"agreement {100 * a['top1_agreement']:.2f}%")
        head = f"{len(self.returned)} float" + (f" ({self.variant} thresholds)" if self.variant else "")
        if a.get("stopped_early"):
            return f"{head}: miss ({a['stopped_early']})"
        return f"{head}: " + ", ".join(parts) + (" PASS" if self.passed else " miss")


@dataclass
class LayerCost:
    """A layer the Q/DQ graph keeps in float, why, and what that costs."""

    name: str
    kind: str
    op_type: str
    why: str  # budget | pinned | config
    rank: int | None = None  # sensitivity rank (1 = most harmful), budget layers only
    sensitivity: float | None = None  # the ranking metric with only this layer INT8
    float_us: float | None = None  # this node's kernel time, float (chosen graph, ORT profile)
    int8_us: float | None = None  # this node's kernel time, INT8 (full INT8 graph, ORT profile)

    @property
    def cost_us(self) -> float | None:
        if self.float_us is None or self.int8_us is None:
            return None
        return self.float_us - self.int8_us

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cost_us"] = None if self.cost_us is None else round(self.cost_us, 2)
        for k in ("float_us", "int8_us"):
            d[k] = None if d[k] is None else round(d[k], 2)
        return d


@dataclass
class BudgetResult:
    """What the search did and the graph every target is built from."""

    graph: QuantizedGraph
    status: str  # off | int8 (met with no fallback) | fallback (met, layers returned) | not-met
    thresholds: dict[str, Any]
    settings: BudgetSettings
    candidates: int = 0  # INT8 layers of the full INT8 graph
    pinned: tuple[str, ...] = ()  # user's --keep-float, resolved to node names
    returned: tuple[str, ...] = ()  # by the search, most harmful first
    evaluations: list[Evaluation] = field(default_factory=list)
    sensitivity: dict[str, Any] | None = None  # ranking summary (metric, samples, layers)
    sensitivity_cache: str | None = None  # reused | computed | None (not needed)
    sensitivity_evaluations: int = 0  # forward passes of one-layer graphs this run made
    costs: list[LayerCost] = field(default_factory=list)
    latency: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    reason: str = ""  # why not met
    cache_path: str | None = None
    runtimes: list[str] = field(default_factory=lambda: ["onnxruntime"])  # every candidate ran on each
    calibration: str | None = None  # method select: the calibration candidate of the shipped graph
    calibration_chosen: str | None = None  # method select: what calibration chose before the budget ran

    @property
    def met(self) -> bool:
        return self.status in ("int8", "fallback")

    @property
    def evaluations_used(self) -> int:
        return len(self.evaluations)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": BUDGET_VERSION,
            "status": self.status,
            "met": self.met if self.status != "off" else None,
            "reason": self.reason or None,
            "thresholds": self.thresholds,
            "evaluated_on": self.data,
            "runtime": RUNTIME if self.runtimes == ["onnxruntime"] else " + ".join(self.runtimes),
            "runtimes": list(self.runtimes),
            "search": self.settings.describe(),
            "settings": self.settings.to_dict(),
            "candidates": self.candidates,
            "pinned": list(self.pinned),
            "returned": list(self.returned),
            "evaluations_used": self.evaluations_used,
            "max_evals": self.settings.max_evals,
            "evaluations": [e.to_dict() for e in self.evaluations],
            "sensitivity": {"cache": self.sensitivity_cache, "evaluations": self.sensitivity_evaluations,
                            "cache_path": self.cache_path, **(self.sensitivity or {})} if self.sensitivity_cache else None,
            "layer_costs": [c.to_dict() for c in self.costs],
            "latency": self.latency,
            "seconds": round(self.seconds, 3),
            **({"calibration": {"chosen_by_calibration": self.calibration_chosen, "shipped": self.calibration}}
               if self.calibration else {}),
        }

    def one_line(self) -> str:
        return describe_record(self.to_dict())
