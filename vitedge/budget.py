"""Accuracy budget: return the most harmful INT8 layers to float until the Q/DQ graph meets
the build's accuracy thresholds, then let every target consume that one graph.

    full INT8 graph --evaluate--> meets max_top1_drop / min_agreement?  yes: done (1 evaluation)
        no: rank the INT8 layers by per-layer sensitivity (vitedge.validation.sensitivity;
            cached beside the calibration statistics)
            return the top 1, 2, 4, ... of the ranking to float (doubling) until a graph
            meets the budget, then bisect back to the fewest top-ranked layers that meet it
            and try re-quantizing each of those, least harmful first (fewest float layers)

Every evaluation runs the candidate Q/DQ graph and the FP32 graph on the runtime of every
target that consumes the graph (ONNX Runtime for onnx, OpenVINO for intel-cpu: their INT8
kernels differ) on the validation data and applies the build gate's own
accuracy rows (``vitedge.validation.run.evaluate_gate``): top-1 drop in points when the
data has labels, top-1 agreement with FP32 always. Layers the user pins with
``--keep-float`` are float from the start, never candidates, never re-quantized.

A graph in which every candidate layer went back to float is not an INT8 model: the
search reports "not met" rather than return it. When it returns layers, their cost in
speed is measured (``measure_costs``): end-to-end batch-1 latency of FP32, the full INT8
graph and the chosen graph in ONNX Runtime, timed interleaved, and per layer the
difference of that node's kernel time in ONNX Runtime's profile, float in the chosen
graph vs INT8 in the full INT8 graph. ``speed_verdict`` turns the target's own measured
speedup into a gate failure when the float layers leave INT8 no faster than FP32.

Heavy imports (onnx, onnxruntime, matplotlib) happen inside the functions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.errors import GateFailure, UsageError

BUDGET_VERSION = "1"  # bump when the search or the sensitivity it caches changes meaning
DEFAULT_MAX_EVALS = 12
DEFAULT_SENSITIVITY_SAMPLES = 64
SCHEDULES = ("doubling", "fixed")
RUNTIME = "onnxruntime (CPUExecutionProvider, graph optimizations on)"
_EVAL_BATCH = 64
_MEMO_BYTES = 512 * 2**20  # keep the validation inputs in memory up to this size


class BudgetNotMet(GateFailure):
    """No graph with at least one INT8 layer met the accuracy budget within the search."""


@dataclass(frozen=True, kw_only=True)
class BudgetSettings:
    """How the accuracy-budget search runs.

    enabled              search at all (``--no-fallback`` switches it off)
    max_evals            accuracy evaluations at most, the first (full INT8) one included
    schedule             "doubling" (return 1, 2, 4, ... top-ranked layers) or "fixed"
                         (return ``group`` more each step)
    group                layers per step for schedule="fixed"
    refine               after the first passing group: bisect back to the fewest top-ranked
                         layers, then try re-quantizing each of them (while evaluations last)
    sensitivity_samples  inputs (the first N of the validation data) the ranking runs on
    measure_cost         time what the float layers cost (ORT, batch 1)
    early_stop           stop an evaluation once its miss is certain (exact bounds: verdicts unchanged)
    threads              ONNX Runtime intra-op threads (None: ONNX Runtime's default)
    """

    enabled: bool = True
    max_evals: int = DEFAULT_MAX_EVALS
    schedule: str = "doubling"
    group: int = 1
    refine: bool = True
    sensitivity_samples: int = DEFAULT_SENSITIVITY_SAMPLES
    measure_cost: bool = True
    early_stop: bool = True
    threads: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_evals, bool) or not isinstance(self.max_evals, int) or self.max_evals < 1:
            raise UsageError(f"--fallback-max-evals must be a positive integer, got {self.max_evals!r}")
        if self.schedule not in SCHEDULES:
            raise UsageError(f"budget schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if isinstance(self.group, bool) or not isinstance(self.group, int) or self.group < 1:
            raise UsageError(f"budget group size must be a positive integer, got {self.group!r}")
        if isinstance(self.sensitivity_samples, bool) or not isinstance(self.sensitivity_samples, int) or self.sensitivity_samples < 2:
            raise UsageError(f"sensitivity samples must be an integer >= 2, got {self.sensitivity_samples!r}")

    def describe(self) -> str:
        step = "doubling groups" if self.schedule == "doubling" else f"groups of {self.group}"
        return f"{step}{', then fewest-layer refinement' if self.refine else ''}, at most {self.max_evals} evaluations"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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

    def to_dict(self) -> dict[str, Any]:
        keys = ("samples", "top1_drop_points", "fp32_top1", "int8_top1", "top1_agreement", "softmax_kl_mean", "embedding_cosine_mean",
                "embedding_cosine_low", "nn_agreement", "stopped_early")
        return {"index": self.index, "step": self.step, "float_layers": len(self.returned), "returned": list(self.returned),
                "passed": self.passed, "accuracy": {k: self.accuracy[k] for k in keys if k in self.accuracy},
                "runtimes": {name: {k: acc[k] for k in keys if k in acc} for name, acc in self.accuracy.get("runtimes", {}).items()},
                "failures": list(self.failures), "seconds": round(self.seconds, 3)}

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
        if a.get("stopped_early"):
            return f"{len(self.returned)} float: miss ({a['stopped_early']})"
        return f"{len(self.returned)} float: " + ", ".join(parts) + (" PASS" if self.passed else " miss")


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

    graph: Any  # vitedge.quantize.qdq.QuantizedGraph
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
        }

    def one_line(self) -> str:
        return describe_record(self.to_dict())


# --------------------------------------------------------------------------- records (dict form: manifest)


def describe_record(rec: dict[str, Any]) -> str:
    """One line for logs and summaries, from ``BudgetResult.to_dict()`` (as stored in the manifest)."""
    if not rec or rec.get("status") == "off":
        return "accuracy budget: off (--no-fallback)"
    n, used, cap = len(rec.get("returned") or []), rec.get("evaluations_used", 0), rec.get("max_evals")
    sens = rec.get("sensitivity") or {}
    how = f"{used}/{cap} evaluations, {rec.get('seconds', 0):.1f} s"
    if sens:
        how += f"; sensitivities {'reused from cache' if sens.get('cache') == 'reused' else 'computed'} ({sens.get('evaluations', 0)} layer evaluations)"
    if rec["status"] == "int8":
        return f"accuracy budget met by the full INT8 graph, no layer returned to float ({how})"
    if rec["status"] == "fallback":
        lat = rec.get("latency") or {}
        cost = ""
        if lat.get("int8_ms") and lat.get("chosen_ms"):
            cost = f"; cost {lat['chosen_ms'] - lat['int8_ms']:+.3f} ms/image on ORT (INT8 {lat['int8_ms']:.3f} -> {lat['chosen_ms']:.3f} ms, FP32 {lat['fp32_ms']:.3f} ms)"
        return f"accuracy budget met with {n} of {rec.get('candidates')} INT8 layers returned to float ({how}){cost}"
    return f"accuracy budget NOT met: {rec.get('reason', '')} ({how})"


def budget_criterion(t: dict[str, Any], output_kind: str | None) -> str:
    """The budget's accuracy criterion in words: the build gate's accuracy rows for this kind of model."""
    if output_kind == "embedding":
        text = (f"INT8 vs FP32 embedding cosine, mean >= {t.get('min_embedding_cosine')} and "
                f"p{float(t.get('embedding_cosine_percentile', 5)):g} >= {t.get('min_embedding_cosine_low')}")
        if t.get("min_nn_agreement") is not None:
            text += f", nearest-neighbour agreement >= {100 * float(t['min_nn_agreement']):.2f}%"
        return text
    return (f"top-1 drop <= {t.get('max_top1_drop')} points (when labelled), top-1 agreement >= "
            f"{100 * float(t.get('min_agreement', 0)):.2f}%")


def budget_markdown(rec: dict[str, Any], *, heading: str = "##") -> str:
    """The build report's section on the budget (from the manifest record)."""
    if not rec:
        return ""
    lines = [f"{heading} Accuracy budget", "", describe_record(rec), ""]
    if rec.get("status") == "off":
        return "\n".join(lines)
    t = rec.get("thresholds") or {}
    data = rec.get("evaluated_on") or {}
    lines += [f"Budget: {budget_criterion(t, data.get('output_kind'))}; evaluated on {data.get('items', '?')} items of `{data.get('path', '?')}`"
              f" ({'labelled' if data.get('labeled') else 'no labels: agreement only'}) with {rec.get('runtime')}. "
              f"Search: {rec.get('search')}.", ""]
    costs = [c for c in rec.get("layer_costs") or [] if c["why"] != "config"]
    by_config = [c for c in rec.get("layer_costs") or [] if c["why"] == "config"]
    if by_config:
        kinds = sorted({c["kind"] for c in by_config})
        lines += [f"{len(by_config)} layer(s) float by the quantizer's configuration ({', '.join(kinds)}); not the budget's doing.", ""]
    if costs:
        lines += ["| layer kept in float | kind | why | sensitivity rank | float us | INT8 us | cost us/image |",
                  "|---|---|---|---|---|---|---|"]
        for c in costs:
            f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
            lines.append(f"| `{c['name']}` | {c['kind']} | {c['why']} | {c.get('rank') or '-'} | {f(c.get('float_us'))} | "
                         f"{f(c.get('int8_us'))} | {f(c.get('cost_us'))} |")
        lines += ["", "Per-layer cost: that node's kernel time in ONNX Runtime's profiler (median, batch 1), float in the "
                  "shipped graph minus INT8 in the full INT8 graph; activation-quantize nodes are counted in the end-to-end "
                  "figure only.", ""]
    lat = rec.get("latency")
    if lat:
        lines += [f"End-to-end, {lat.get('runtime')}, batch 1 (p50, interleaved): FP32 {lat['fp32_ms']:.3f} ms, full INT8 "
                  f"{lat['int8_ms']:.3f} ms, shipped graph {lat['chosen_ms']:.3f} ms: {lat['chosen_speedup']:.2f}x FP32 "
                  f"(full INT8 {lat['int8_speedup']:.2f}x).", ""]
    evals = rec.get("evaluations") or []
    if evals:
        embedding = data.get("output_kind") == "embedding"
        head = "embedding cosine mean | embedding cosine, low percentile" if embedding else "top-1 drop (pt) | agreement"
        lines += [f"| # | step | float layers | {head} | verdict |", "|---|---|---|---|---|---|"]
        for e in evals:
            a = e["accuracy"]
            drop = "-" if a.get("top1_drop_points") is None else f"{a['top1_drop_points']:.2f}"
            agree = "-" if a.get("top1_agreement") is None else f"{100 * a['top1_agreement']:.2f}%"
            if embedding:
                drop, agree = (("-" if a.get(k) is None else f"{a[k]:.5f}") for k in ("embedding_cosine_mean", "embedding_cosine_low"))
            verdict = "pass" if e["passed"] else "miss" if not a.get("stopped_early") else f"miss (stopped after {a.get('samples')} items)"
            lines.append(f"| {e['index']} | {e['step']} | {e['float_layers']} | {drop} | {agree} | {verdict} |")
        lines.append("")
    return "\n".join(lines)


def speed_verdict(rec: dict[str, Any] | None, speedup: float | None, min_speedup: float, where: str) -> str | None:
    """A gate failure line when the layers the budget returned to float leave INT8 no faster than
    FP32 (or under the profile's min_speedup) on the target's runtime; None otherwise."""
    if not rec or rec.get("status") != "fallback" or speedup is None or not math.isfinite(speedup):
        return None
    if speedup > 1.0 and speedup >= float(min_speedup):
        return None
    n = len(rec.get("returned") or [])
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


# --------------------------------------------------------------------------- sensitivity cache


def sensitivity_key(calibration: Any, float_layers: Iterable[str], data_hash: str, samples: int, output_kind: str) -> str:
    """Like the calibration cache key (it includes it), plus what changes a ranking: the quantizer
    settings, the layers already float, the evaluation data and how many samples."""
    parts = {
        "budget_version": BUDGET_VERSION,
        "calibration_key": calibration.key,
        "config": calibration.config.to_dict(),
        "float_layers": sorted(float_layers),
        "data_hash": data_hash,
        "samples": int(samples),
        "output_kind": output_kind,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class SensitivityCache:
    """``<cache root>/sensitivity/<key>.json``, beside ``<cache root>/calibration/``."""

    def __init__(self, root: str | Path | None = None):
        from vitedge.quantize.cache import CalibrationCache

        self.root = CalibrationCache(root).root

    def path_for(self, key: str) -> Path:
        return self.root / "sensitivity" / f"{key}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        path = self.path_for(key)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("layers"), list):
            return None
        return doc

    def save(self, key: str, doc: dict[str, Any]) -> Path:
        from vitedge.fsutil import atomic_write_path

        path = self.path_for(key)
        with atomic_write_path(path) as tmp:
            tmp.write_text(json.dumps(dict(doc, key=key), sort_keys=True))
        return path


# --------------------------------------------------------------------------- evaluation


# A runtime the budget evaluates candidates on: (name, open(path) -> a Runner with .infer(batch)).
# None opens ONNX Runtime's CPU provider, as the onnx target runs it.
RuntimeOpener = tuple[str, Callable[[Path], Any]]


class Evaluator:
    """Runs a graph on the validation data in every target runtime that will run it, and
    compares each with FP32's outputs on that same runtime. A candidate passes only when it
    passes on all of them: the build gate of each target is what the budget must predict."""

    def __init__(self, fp32: Any, source: Any, output_kind: str, thresholds: Any, *, threads: int | None = None,
                 runtimes: Sequence[RuntimeOpener] | None = None):
        self.source = source
        self.output_kind = output_kind
        self.thresholds = thresholds
        self.threads = threads
        self.runtimes: list[RuntimeOpener] = list(runtimes) if runtimes else [("onnxruntime", None)]
        self._memo: list[Any] | None = None
        memo, size = [], 0
        for batch in source.batches(_EVAL_BATCH):
            size += batch.images.nbytes
            if size > _MEMO_BYTES:
                memo = None
                break
            memo.append(batch)
        self._memo = memo
        self.labels = None
        self.refs = {name: self._outputs(fp32, opener)[0] for name, opener in self.runtimes}
        self.ref = self.refs[self.runtimes[0][0]]
        self.runs = 0

    def _batches(self):
        return iter(self._memo) if self._memo is not None else self.source.batches(_EVAL_BATCH)

    def _infer_fn(self, model: Any, opener: Callable[[Path], Any] | None, tmp: Path) -> tuple[Callable[[np.ndarray], np.ndarray], Any]:
        if opener is None:
            from vitedge.onnxutil import ort_session

            sess = ort_session(Path(model) if isinstance(model, str) else model, threads=self.threads)  # past 2 GB via external data
            name = sess.get_inputs()[0].name
            return (lambda x: sess.run(None, {name: x})[0]), None
        path = Path(model) if isinstance(model, (str, Path)) else tmp / "candidate.onnx"
        if not isinstance(model, (str, Path)):
            from vitedge.onnxutil import save_onnx

            save_onnx(model, path)
        runner = opener(path)
        runner.open()
        return runner.infer, runner

    def _outputs(self, model: Any, opener: Callable[[Path], Any] | None = None,
                 stop: Callable[[np.ndarray], str | None] | None = None, ref: np.ndarray | None = None) -> tuple[np.ndarray, str | None]:
        import tempfile

        outs, labels, labelled = [], [], True
        reason = None
        with tempfile.TemporaryDirectory(prefix="vitedge-budget-") as tmp:
            infer, runner = self._infer_fn(model, opener, Path(tmp))
            try:
                for batch in self._batches():
                    y = np.asarray(infer(np.ascontiguousarray(batch.images, dtype=np.float32)), dtype=np.float32)
                    outs.append(y.reshape(y.shape[0], -1))
                    if batch.labels is None:
                        labelled = False
                    else:
                        labels.append(batch.labels)
                    if stop is not None:
                        reason = stop(np.concatenate(outs), ref)
                        if reason:
                            break
            finally:
                if runner is not None:
                    runner.close()
        if self.labels is None and labelled and labels and reason is None:
            self.labels = np.concatenate(labels)
        return np.concatenate(outs), reason

    def _usable_labels(self) -> np.ndarray | None:
        labels = self.labels
        if labels is not None and (labels.min() < 0 or labels.max() >= self.ref.shape[1]):
            return None  # the validation gate reports this as a data error; the budget uses agreement
        return labels

    def _certain_miss(self, got: np.ndarray, ref: np.ndarray | None = None) -> str | None:
        """Why this candidate already misses the budget whatever the remaining items give, or None.

        Exact bounds, so stopping early never changes a verdict: top-1 disagreements with FP32
        only grow, and each remaining item can win back at most one correct prediction."""
        full_ref = self.ref if ref is None else ref
        total, n = len(full_ref), len(got)
        if n >= total:
            return None
        ref = full_ref[:n].argmax(1)
        pred = got.argmax(1)
        t = self.thresholds
        allowed = math.floor((1.0 - t.min_agreement) * total + 1e-9)
        disagree = int(np.sum(ref != pred))
        if disagree > allowed:
            return (f"stopped after {n} of {total} items: {disagree} top-1 disagreements with FP32 already exceed the {allowed} "
                    f"that agreement >= {100 * t.min_agreement:g}% allows")
        labels = self._usable_labels()
        if labels is not None:
            y = labels[:n]
            net = int(np.sum((ref == y) & (pred != y)) - np.sum((ref != y) & (pred == y)))
            allowed_lost = math.floor(t.max_top1_drop / 100.0 * total + 1e-9)
            if net - (total - n) > allowed_lost:
                return (f"stopped after {n} of {total} items: {net} correct predictions lost, more than the {total - n} "
                        f"remaining items could win back within a {t.max_top1_drop:g}-point drop")
        return None

    def accuracy(self, model: Any, *, early_stop: bool = True) -> dict[str, Any]:
        """Accuracy of ``model`` vs FP32. With ``early_stop`` (classifiers), the run stops as soon as the
        budget is certainly missed; the figures then cover the items run (``samples``)."""
        from vitedge.validation.accuracy import compare_embeddings, compare_logits

        stop = self._certain_miss if early_stop and self.output_kind != "embedding" else None
        per_runtime: dict[str, dict[str, Any]] = {}
        worst: dict[str, Any] | None = None
        for name, opener in self.runtimes:
            full_ref = self.refs[name]
            got, reason = self._outputs(model, opener, stop, full_ref)
            ref = full_ref[: len(got)]
            if self.output_kind == "embedding":
                acc = compare_embeddings(ref, got, self.thresholds.embedding_cosine_percentile)
            else:
                labels = self._usable_labels()
                acc = compare_logits(ref, got, None if labels is None else labels[: len(got)])
            acc["output_kind"] = self.output_kind
            acc["runtime"] = name
            if reason:
                acc["stopped_early"] = f"{name}: {reason}" if len(self.runtimes) > 1 else reason
            per_runtime[name] = acc
            if worst is None or self._worse(acc, worst):
                worst = acc
            if reason:  # a certain miss on one runtime is a miss: the others need not run
                break
        self.runs += 1
        result = dict(worst)
        if len(self.runtimes) > 1:
            result["runtimes"] = per_runtime
        return result

    def _worse(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        """Whether accuracy ``a`` is further from the budget than ``b`` (a miss beats a pass)."""
        fail_a, fail_b = not self.verdict(a)[0], not self.verdict(b)[0]
        if fail_a != fail_b:
            return fail_a
        key = "embedding_cosine_mean" if self.output_kind == "embedding" else "top1_agreement"
        return (a.get(key) if a.get(key) is not None else 1.0) < (b.get(key) if b.get(key) is not None else 1.0)

    def verdict(self, accuracy: dict[str, Any]) -> tuple[bool, list[str]]:
        """The build gate's own accuracy rows (speed rows are not the budget's)."""
        from vitedge.validation.embedding_gate import ACCURACY_GATE_NAMES
        from vitedge.validation.run import evaluate_gate

        if accuracy.get("stopped_early"):
            return False, [accuracy["stopped_early"]]
        rows = [r for r in evaluate_gate(accuracy, None, None, self.thresholds) if r.name in ACCURACY_GATE_NAMES]
        return all(r.passed for r in rows), [r.detail for r in rows if not r.passed]


# --------------------------------------------------------------------------- the search


def strictest(thresholds: Sequence[Any]) -> Any:
    """One budget for a graph several targets share: the tightest of each accuracy threshold."""
    first = thresholds[0]
    nn = [t.min_nn_agreement for t in thresholds if t.min_nn_agreement is not None]
    return dataclasses.replace(first, max_top1_drop=min(t.max_top1_drop for t in thresholds),
                               min_agreement=max(t.min_agreement for t in thresholds),
                               min_embedding_cosine=max(t.min_embedding_cosine for t in thresholds),
                               min_embedding_cosine_low=max(t.min_embedding_cosine_low for t in thresholds),
                               embedding_cosine_percentile=min(t.embedding_cosine_percentile for t in thresholds),
                               min_nn_agreement=max(nn) if nn else None)


def meet_budget(
    calibration: Any,
    source: Any,
    thresholds: Any,
    *,
    fp32: Any = None,
    full: Any = None,
    keep_float: Iterable[str] | str = (),
    settings: BudgetSettings | None = None,
    output_kind: str = "logits",
    preprocess: Any = None,
    cache_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    runtimes: Sequence[RuntimeOpener] | None = None,
) -> BudgetResult:
    """Build the Q/DQ graph that meets ``thresholds`` on ``source`` with the fewest layers in float.

    calibration  what ``vitedge.quantize.calibrate`` returned
    source       validation data (a calibration source; labels optional)
    thresholds   a ``Thresholds``: max_top1_drop (with labels) and min_agreement are the budget
    fp32         the FP32 reference graph (path or ModelProto); default: the calibrated copy
    full         ``build_qdq(calibration, keep_float=keep_float)`` when the caller has it already
    keep_float   the user's pins (node names, kinds, op types, fnmatch patterns): float, never touched
    runtimes     the runtimes of the targets that will consume the graph, each as (name, open(path));
                 a candidate must pass on every one (default: ONNX Runtime's CPU provider)
    """
    from vitedge.quantize.qdq import build_qdq, resolve_keep_float

    settings = settings or BudgetSettings()
    info = log or (lambda _m: None)
    start = time.perf_counter()
    pins = (keep_float,) if isinstance(keep_float, str) else tuple(keep_float)
    pinned = tuple(sorted(resolve_keep_float(calibration.layers, pins))) if pins else ()
    full = full if full is not None else build_qdq(calibration, keep_float=pins)
    summary = source.summary
    data = {"path": summary.path, "items": len(source), "labeled": bool(summary.labeled and output_kind != "embedding"),
            "data_hash": summary.data_hash, "output_kind": output_kind}
    result = BudgetResult(graph=full, status="off", thresholds=thresholds.to_dict(), settings=settings,
                          candidates=len(full.quantized), pinned=pinned, data=data)
    if not settings.enabled:
        result.seconds = time.perf_counter() - start
        return result

    ev = Evaluator(fp32 if fp32 is not None else calibration.model, source, output_kind, thresholds, threads=settings.threads,
                   runtimes=runtimes)
    result.runtimes = [name for name, _ in ev.runtimes]
    graphs: dict[tuple[str, ...], Any] = {}  # the passing candidates only (a ViT-B graph is ~100 MB)

    def evaluate(returned: tuple[str, ...], step: str) -> Evaluation:
        t0 = time.perf_counter()
        g = full if not returned else build_qdq(calibration, keep_float=pins + returned)
        acc = ev.accuracy(g.model, early_stop=settings.early_stop)
        ok, failures = ev.verdict(acc)
        if ok:
            graphs[returned] = g
        e = Evaluation(len(result.evaluations) + 1, step, returned, ok, acc, failures, time.perf_counter() - t0)
        result.evaluations.append(e)
        info(f"budget evaluation {e.index}: {e.describe()}")
        return e

    first = evaluate((), "full-int8")
    if first.passed:
        result.status = "int8"
        result.seconds = time.perf_counter() - start
        return result
    if not full.quantized:
        result.status, result.reason = "not-met", "no layer is INT8 (every layer pinned float) and the graph still misses the budget"
        result.seconds = time.perf_counter() - start
        return result

    order = _ranking(result, calibration, full, source, output_kind, preprocess, cache_dir, settings, info)
    n = len(order)
    passing: tuple[str, ...] | None = None
    lo = 0  # the largest prefix known to miss
    for size in _group_sizes(n, settings):
        if len(result.evaluations) >= settings.max_evals:
            break
        e = evaluate(tuple(order[:size]), "grow")
        if e.passed:
            passing = e.returned
            break
        lo = size
    if passing is not None and settings.refine:
        hi = len(passing)
        while hi - lo > 1 and len(result.evaluations) < settings.max_evals:
            mid = (lo + hi) // 2
            e = evaluate(tuple(order[:mid]), "bisect")
            if e.passed:
                hi, passing = mid, e.returned
            else:
                lo = mid
        # the last of the prefix is needed (the prefix without it missed); try dropping the others
        for name in reversed(passing[:-1]):
            if len(result.evaluations) >= settings.max_evals:
                break
            trial = tuple(x for x in passing if x != name)
            e = evaluate(trial, "prune")
            if e.passed:
                passing = trial
    if passing is None:
        complete = [e for e in result.evaluations if not e.accuracy.get("stopped_early")]
        best = max(complete, key=lambda e: (_closeness(e.accuracy), -len(e.returned))) if complete else result.evaluations[-1]
        result.status = "not-met"
        if len(result.evaluations) >= settings.max_evals:
            result.reason = (f"the evaluation cap ({settings.max_evals}) was reached; the closest graph ({best.describe()}) "
                             f"misses: {'; '.join(best.failures)}")
        else:
            last = result.evaluations[-1]
            result.reason = (f"no graph with an INT8 layer left meets it: with {len(last.returned)} of the {n} INT8 layers back in "
                             f"float it still misses ({'; '.join(last.failures)}), and all {n} in float is FP32, not INT8")
        result.seconds = time.perf_counter() - start
        return result
    result.status = "fallback"
    result.returned = tuple(passing)
    result.graph = graphs[tuple(passing)]
    result.seconds = time.perf_counter() - start
    return result


def _closeness(accuracy: dict[str, Any]) -> float:
    """How close a candidate came: the gate's own figure (embedding cosine, low percentile, for encoders)."""
    if accuracy.get("output_kind") == "embedding":
        return float(accuracy.get("embedding_cosine_low") or -1.0)
    return float(accuracy.get("top1_agreement") or 0.0)


def _group_sizes(n: int, settings: BudgetSettings) -> list[int]:
    """How many top-ranked layers each grow step returns: 1, 2, 4, ... (doubling) or g, 2g, ...
    (fixed), ending at n - 1: a graph with no INT8 layer left is never a candidate."""
    sizes, k = [], 0
    while k < n - 1:
        k = min(n - 1, 2 * k if k and settings.schedule == "doubling" else k + (settings.group if settings.schedule == "fixed" else 1))
        sizes.append(k)
    return sizes


def _ranking(result: BudgetResult, calibration, full, source, output_kind, preprocess, cache_dir, settings, info) -> list[str]:
    """Candidate layers, most harmful first: from the cache, or from per-layer sensitivity."""
    samples = min(settings.sensitivity_samples, len(source))
    key = sensitivity_key(calibration, full.kept_float, source.summary.data_hash, samples, output_kind)
    cache = SensitivityCache(cache_dir)
    doc = cache.load(key)
    candidates = set(full.quantized)
    if doc is not None and {r["name"] for r in doc["layers"]} == candidates:
        result.sensitivity_cache = "reused"
        result.sensitivity_evaluations = 0
        info(f"sensitivities reused from {cache.path_for(key)}")
    else:
        from vitedge.validation.sensitivity import first_inputs, layer_sensitivity

        x = first_inputs(source, samples)
        sens = layer_sensitivity(calibration.model, full.model, x, output_kind=output_kind, preprocess=preprocess,
                                 batch_size=min(64, len(x)), threads=settings.threads, recover_smoothing=False)  # the exact graph the Q/DQ went into
        doc = sens.to_dict()
        result.sensitivity_cache = "computed"
        result.sensitivity_evaluations = len(sens.layers)
        info(f"per-layer sensitivity: {len(sens.layers)} layers on {len(x)} inputs in {sens.seconds:.1f} s")
        try:
            cache.save(key, doc)
        except OSError as err:
            info(f"could not write the sensitivity cache in {cache.root}: {err.strerror or err}")
    result.cache_path = str(cache.path_for(key))
    metric = doc["metric"]
    ranked = [r for r in doc["layers"] if r["name"] in candidates]
    ranked.sort(key=lambda r: (r.get("rank") or 0))
    result.sensitivity = {"metric": metric, "samples": doc.get("samples"), "seconds": doc.get("seconds"),
                          "baseline": doc.get("baseline"), "full": doc.get("full"),
                          "layers": [{"rank": r["rank"], "name": r["name"], "kind": r["kind"], metric: r[metric]} for r in ranked]}
    return [r["name"] for r in ranked]


# --------------------------------------------------------------------------- what the float layers cost


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


def measure_costs(result: BudgetResult, fp32: Any, example: np.ndarray, *, threads: int | None = None,
                  latency_seconds: float = 0.3, profile_runs: int = 100, profile_seconds: float = 0.5) -> None:
    """Fill ``result.costs`` (per-layer, ORT profiler) and ``result.latency`` (end to end, ORT).

    ``example`` is one model-ready input (1 x C x H x W). Only layers the budget returned get a
    measured cost; pinned and config layers are listed without one."""
    from vitedge.validation.latency import LatencySettings, measure_interleaved

    result.costs = float_layers(result)
    if result.status != "fallback":
        return
    from vitedge.quantize.qdq import build_qdq

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


def timing_session(src: Any, *, threads: int | None = None, profile_prefix: str | None = None):
    """An ONNX Runtime CPU session for timing several graphs interleaved in one process: full graph
    optimizations, and intra-op threads that sleep instead of spinning when idle.

    With spinning on (ONNX Runtime's default, right for one session per process), the idle
    sessions' threads busy-wait while another session runs: on a loaded 2-core machine the FP32
    graph, whose GEMMs wait on both threads, measured 12-14 ms against 1.7 ms alone, which
    inflates every INT8-vs-FP32 ratio."""
    from vitedge.onnxutil import SessionSettings, ort_session

    settings = SessionSettings(threads=threads, spinning=False, profile_prefix=profile_prefix)
    return ort_session(src, settings)  # a path, bytes or a ModelProto (past 2 GB via external data)


def _node_times(model: Any, x: np.ndarray, runs: int, threads: int | None) -> dict[str, float]:
    """Median kernel time (us) per node name from ONNX Runtime's profiler."""
    import os
    import tempfile

    from vitedge.outputs import work_prefix

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


# --------------------------------------------------------------------------- plot


def budget_plot(rec: dict[str, Any], title: str, top: int = 40) -> bytes | None:
    """Per-layer sensitivity bars, the layers the budget returned to float marked; None without
    matplotlib or without a ranking."""
    sens = (rec or {}).get("sensitivity") or {}
    layers = sens.get("layers") or []
    if not layers:
        return None
    try:
        import matplotlib
    except ImportError:
        return None
    import io

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = sens["metric"]
    returned = set(rec.get("returned") or [])
    shown = layers[:top][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(shown) + 1.6))
    colours = ["#d62728" if r["name"] in returned else "#1f77b4" for r in shown]
    ax.barh(range(len(shown)), [max(r[metric], 1e-12) for r in shown], color=colours)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([("[float] " if r["name"] in returned else "") + r["name"][-48:] for r in shown], fontsize=7)
    ax.set_xscale("log")
    floor = (sens.get("baseline") or {}).get(metric)
    if floor:
        ax.axvline(floor, color="black", ls=":", lw=1)
    ax.set_xlabel(f"{metric} vs FP32 with only this layer INT8")
    handles = [plt.Rectangle((0, 0), 1, 1, color="#d62728"), plt.Rectangle((0, 0), 1, 1, color="#1f77b4")]
    ax.legend(handles, [f"returned to float by the budget ({len(returned)})", "INT8"], fontsize=7, loc="lower right")
    pinned = rec.get("pinned") or []
    ax.set_title(title + (f"\n{len(pinned)} layer(s) pinned float by --keep-float (not ranked)" if pinned else ""), fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
