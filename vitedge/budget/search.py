"""The fallback search: return the most harmful INT8 layers to float until a Q/DQ graph meets
the budget, with the fewest layers in float.

    full INT8 graph --evaluate--> meets the budget?  yes: done (1 evaluation)
        no, and the calibration has other candidates (method select): evaluate the full INT8 graph
            of each, closest to FP32 at calibration first; one that meets it is shipped (no float layer)
        still no: from the candidate that came closest, rank the INT8 layers (``vitedge.budget.rank``), return the top 1, 2, 4, ... of the
            ranking to float (doubling, or fixed groups) until a graph meets the budget, then
            bisect back to the fewest top-ranked layers that meet it and try re-quantizing each
            of those, least harmful first (fewest float layers)

A candidate passes by the build gate's own accuracy rows (``Evaluator.verdict``: decisive agreement always
judged, labels never excusing a flip). Among the passing candidates evaluated with the fewest float layers (the
fastest the search can tell apart), the one closest to FP32 ships: fewest flips where FP32 is decisive, then the
smallest expected drop under FP32's probabilities (``closest_passing``); a miss is ranked the same way.

A graph in which every candidate layer went back to float is not an INT8 model: the search
reports "not met" rather than return it, with the closest graph it evaluated that keeps an INT8
layer (the build ships it marked failed, so there is something to inspect). Layers the user pins with ``--keep-float`` are float
from the start, never candidates, never re-quantized.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitedge.budget.evaluate import Evaluator, RuntimeFacts, RuntimeOpener
from vitedge.budget.rank import rank_layers
from vitedge.budget.record import BudgetResult, Evaluation
from vitedge.budget.settings import BudgetSettings
from vitedge.targets.profiles import Thresholds
from vitedge.quantize.qdq import QuantizedGraph, build_qdq, resolve_keep_float
from vitedge.validation.noise import MIN_DECISIVE
from vitedge.validation.reference_cache import ReferenceCacheSettings

if TYPE_CHECKING:
    from onnx import ModelProto

    from vitedge.datasources.base import CalibrationSource
    from vitedge.bundle.preprocess import Preprocess
    from vitedge.quantize.record import Calibration


@dataclass(frozen=True, kw_only=True)
class BudgetSearch:
    """Everything the search reads: the calibration, the validation data and the budget.

    calibration   what ``vitedge.quantize.calibrate`` returned (a ``Calibration``)
    source        validation data (a calibration source; labels optional)
    thresholds    max_top1_drop (with labels) and min_agreement are the budget
    fp32          the FP32 reference graph (path or ModelProto); default: the calibrated copy
    full          ``build_qdq(calibration, keep_float=keep_float)`` when the caller has it already
    keep_float    the user's pins (node names, kinds, op types, fnmatch patterns): float, never touched
    settings      how the search runs
    output_kind   "logits" or "embedding" (which gate rows apply)
    preprocess    the model's preprocessing (part of the reference cache's key)
    cache         the cache root (``root``: the per-layer sensitivities are cached beside the calibration)
                  and validation's FP32 reference cache, used for the runtimes ``runtime_facts`` names
    runtimes      the runtimes of the targets that will consume the graph, each as (name, open(path));
                  a candidate must pass on every one (empty: ONNX Runtime's CPU provider)
    runtime_facts each runtime's (backend, options, batch sizes): the budget runs the files that target
                  ships at validation's batch, under validation's cache keys (validation reuses them)
    """

    calibration: Calibration
    source: CalibrationSource
    thresholds: Thresholds
    fp32: str | Path | ModelProto | None = None
    full: QuantizedGraph | None = None
    keep_float: tuple[str, ...] = ()
    settings: BudgetSettings = field(default_factory=BudgetSettings)
    output_kind: str = "logits"
    preprocess: Preprocess | None = None
    cache: ReferenceCacheSettings = field(default_factory=ReferenceCacheSettings)
    runtimes: tuple[RuntimeOpener, ...] = ()
    runtime_facts: Mapping[str, RuntimeFacts] = field(default_factory=dict)


def meet_budget(job: BudgetSearch, log: Callable[[str], None] | None = None) -> BudgetResult:
    """Build the Q/DQ graph that meets ``job.thresholds`` on ``job.source`` with the fewest layers in
    float (the module docstring says how); ``log`` gets one line per step."""
    return _Search(job, log or (lambda _m: None)).run()


class _Search:
    """One run of the search: its result so far, the passing graphs and the closest miss."""

    def __init__(self, job: BudgetSearch, info: Callable[[str], None]):
        self.job, self.info, self.settings = job, info, job.settings
        self.start = time.perf_counter()
        self.pins = tuple(job.keep_float)
        self.calibration = job.calibration
        pinned = tuple(sorted(resolve_keep_float(job.calibration.layers, self.pins))) if self.pins else ()
        self.full = job.full if job.full is not None else build_qdq(job.calibration, keep_float=self.pins)
        summary = job.source.summary
        data = {"path": summary.path, "items": len(job.source), "labeled": bool(summary.labeled and job.output_kind != "embedding"),
                "data_hash": summary.data_hash, "output_kind": job.output_kind}
        self.result = BudgetResult(graph=self.full, status="off", thresholds=job.thresholds.to_dict(), settings=self.settings,
                                   candidates=len(self.full.quantized), pinned=pinned, data=data)
        self.graphs: dict[tuple[str, ...], QuantizedGraph] = {}  # the passing candidates only (a ViT-B graph is ~100 MB)
        self.closest: tuple[Evaluation, QuantizedGraph] | None = None  # the complete miss closest to the budget
        self.variant: str | None = None
        self.ev: Evaluator  # opened by _open_evaluator (not when the budget is off)

    def run(self) -> BudgetResult:
        if not self.settings.enabled:
            return self._done()
        self._open_evaluator()
        if self._evaluate((), "full-int8").passed:
            self.result.status = "int8"
            return self._done()
        if not self.full.quantized:
            return self._not_met("no layer is INT8 (every layer pinned float) and the graph still misses the budget")
        if self._other_calibration_meets():
            return self._done()
        self._continue_from_closest()
        order = rank_layers(self.result, self.calibration, self.full, self.job.source, self.job.output_kind, self.job.preprocess,
                            self.job.cache.root, self.settings, self.info)
        passing, lo = self._grow(order)
        if passing is not None and self.settings.refine:
            passing = self._refine(order, passing, lo)
        if passing is None:
            return self._not_met(self._miss_reason(len(order)))
        passing = closest_passing([e for e in self.result.evaluations if tuple(e.returned) in self.graphs], passing)
        self.result.status = "fallback"
        self.result.returned = tuple(passing)
        self.result.graph = self.graphs[tuple(passing)]
        return self._done()

    def _open_evaluator(self) -> None:
        job = self.job
        self.ev = Evaluator(job.fp32 if job.fp32 is not None else self.calibration.model, job.source, job.output_kind, job.thresholds,
                            threads=self.settings.threads, runtimes=job.runtimes or None, reference_cache=job.cache,
                            runtime_facts=job.runtime_facts, preprocess=job.preprocess)
        for name, lookup in self.ev.lookups.items():
            if lookup.note:  # e.g. FP32 outputs another runtime computed, not believed after this runtime's spot check
                self.info(f"WARNING budget {name}: {lookup.note}")
            self.info(f"budget {name}: " + lookup.one_line(len(job.source)))
        self.result.runtimes = [name for name, _ in self.ev.runtimes]
        self.variant = getattr(self.calibration, "variant", None)
        self.result.calibration = self.result.calibration_chosen = self.variant

    def _capped(self) -> bool:
        return len(self.result.evaluations) >= self.settings.max_evals

    def _evaluate(self, returned: tuple[str, ...], step: str, graph: QuantizedGraph | None = None) -> Evaluation:
        """Evaluate one candidate (``returned`` back in float), record it, keep it if it passes or came closest."""
        t0 = time.perf_counter()
        g = graph if graph is not None else self.full if not returned else build_qdq(self.calibration, keep_float=self.pins + returned)
        reused = len(self.ev.reused)
        acc = self.ev.accuracy(g.model, early_stop=self.settings.early_stop)
        if len(self.ev.reused) > reused:
            self.info(f"budget: candidate outputs on {', '.join(self.ev.reused[reused:])} read from the validation cache "
                      "(the same graph ran on the same data, runtime and CPU before)")
        ok, failures = self.ev.verdict(acc)
        if ok:
            self.graphs[returned] = g
        e = Evaluation(len(self.result.evaluations) + 1, step, returned, ok, acc, failures, time.perf_counter() - t0,
                       variant=getattr(g.calibration, "variant", None))
        self.result.evaluations.append(e)
        self.info(f"budget evaluation {e.index}: {e.describe()}")
        if not ok and not acc.get("stopped_early") and g.quantized and (self.closest is None or (
                (_closeness(acc), -len(returned)) > (_closeness(self.closest[0].accuracy), -len(self.closest[0].returned)))):
            self.closest = (e, g)
        return e

    def _other_calibration_meets(self) -> bool:
        """Method select's other candidates, full INT8, before any layer goes to float; True when one meets it."""
        for name in _other_calibrations(self.calibration):
            if self._capped():
                break
            e = self._evaluate((), "calibration", build_qdq(self.calibration.with_variant(name), keep_float=self.pins))
            if e.passed:
                self.result.status, self.result.graph, self.result.calibration = "int8", self.graphs[()], name
                self.info(f"budget: the full INT8 graph with {name} thresholds meets it (calibration chose {self.variant}); "
                          "no layer returned to float")
                return True
        return False

    def _continue_from_closest(self) -> None:
        """Search layers from the calibration candidate whose full INT8 graph came closest."""
        if self.closest is not None and self.closest[1] is not self.full:
            self.full = self.closest[1]
            self.calibration = self.full.calibration
            self.result.calibration = getattr(self.calibration, "variant", None)
            self.info(f"budget: returning layers to float from the {self.result.calibration} thresholds (the closest full INT8 graph)")

    def _grow(self, order: list[str]) -> tuple[tuple[str, ...] | None, int]:
        """Return the top 1, 2, 4, ... (or fixed groups) to float until a graph passes:
        (the passing layers or None, the largest prefix known to miss)."""
        lo = 0
        for size in _group_sizes(len(order), self.settings):
            if self._capped():
                break
            e = self._evaluate(tuple(order[:size]), "grow")
            if e.passed:
                return e.returned, lo
            lo = size
        return None, lo

    def _refine(self, order: list[str], passing: tuple[str, ...], lo: int) -> tuple[str, ...]:
        """Bisect back to the fewest top-ranked layers that pass, then try re-quantizing each but the last."""
        hi = len(passing)
        while hi - lo > 1 and not self._capped():
            mid = (lo + hi) // 2
            e = self._evaluate(tuple(order[:mid]), "bisect")
            if e.passed:
                hi, passing = mid, e.returned
            else:
                lo = mid
        # the last of the prefix is needed (the prefix without it missed); try dropping the others
        for name in reversed(passing[:-1]):
            if self._capped():
                break
            trial = tuple(x for x in passing if x != name)
            if self._evaluate(trial, "prune").passed:
                passing = trial
        return passing

    def _miss_reason(self, n: int) -> str:
        evaluations = self.result.evaluations
        complete = [e for e in evaluations if not e.accuracy.get("stopped_early")]
        best = max(complete, key=lambda e: (_closeness(e.accuracy), -len(e.returned))) if complete else evaluations[-1]
        if self._capped():
            return (f"the evaluation cap ({self.settings.max_evals}) was reached; the closest graph ({best.describe()}) "
                    f"misses: {'; '.join(best.failures)}")
        last = evaluations[-1]
        return (f"no graph with an INT8 layer left meets it: with {len(last.returned)} of the {n} INT8 layers back in "
                f"float it still misses ({'; '.join(last.failures)}), and all {n} in float is FP32, not INT8")

    def _not_met(self, reason: str) -> BudgetResult:
        """No graph with an INT8 layer left met it: the closest complete miss is handed back (else the full graph)."""
        result = self.result
        result.status, result.reason = "not-met", reason
        result.graph = self.closest[1] if self.closest is not None else self.full
        result.returned = tuple(self.closest[0].returned) if self.closest is not None else ()
        result.calibration = getattr(result.graph.calibration, "variant", None)
        return self._done()

    def _done(self) -> BudgetResult:
        self.result.seconds = time.perf_counter() - self.start
        return self.result


def _other_calibrations(calibration: Calibration) -> list[str]:
    """Method select's other candidates, closest to FP32 at calibration first (none for a fixed method)."""
    variants = getattr(calibration, "variants", None) or {}
    selection = getattr(calibration, "selection", None)
    order = [s.name for s in selection.scores] if selection is not None else list(variants)
    current = getattr(calibration, "variant", None)
    return [name for name in order if name in variants and name != current]


def _closeness(accuracy: Mapping[str, Any]) -> tuple[float, float]:
    """How close a candidate came to FP32, larger is closer. A classifier: fewest flips on the images where FP32
    is decisive (a share of them; of all images when fewer than MIN_DECISIVE are decisive), then the smallest
    expected drop under FP32's probabilities (docs/gate.md). An encoder: the embedding cosine at its low percentile."""
    if accuracy.get("output_kind") == "embedding":
        return float(accuracy.get("embedding_cosine_low") or -1.0), 0.0
    n, flips = int(accuracy.get("decisive_samples") or 0), accuracy.get("decisive_flips")
    share = flips / n if flips is not None and n >= MIN_DECISIVE else 1.0 - float(accuracy.get("top1_agreement") or 0.0)
    return -share, -float(accuracy.get("expected_drop_points") or 0.0)


def closest_passing(evaluations: Sequence[Evaluation], passing: tuple[str, ...]) -> tuple[str, ...]:
    """Among the passing candidates evaluated with as many float layers as ``passing`` (the same speed, as far as
    the search can tell), the layers of the one closest to FP32 (``_closeness``); ``passing`` on a tie."""
    same = [e for e in evaluations if e.passed and len(e.returned) == len(passing) and not e.accuracy.get("stopped_early")]
    best = max(same, key=lambda e: (_closeness(e.accuracy), tuple(e.returned) == tuple(passing)), default=None)
    return tuple(best.returned) if best is not None else tuple(passing)


def _group_sizes(n: int, settings: BudgetSettings) -> list[int]:
    """How many top-ranked layers each grow step returns: 1, 2, 4, ... (doubling) or g, 2g, ...
    (fixed), ending at n - 1: a graph with no INT8 layer left is never a candidate."""
    sizes, k = [], 0
    while k < n - 1:
        k = min(n - 1, 2 * k if k and settings.schedule == "doubling" else k + (settings.group if settings.schedule == "fixed" else 1))
        sizes.append(k)
    return sizes
