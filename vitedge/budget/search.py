"""The fallback search: return the most harmful INT8 layers to float until a Q/DQ graph meets
the budget, with the fewest layers in float.

    full INT8 graph --evaluate--> meets the budget?  yes: done (1 evaluation)
        no, and the calibration has other candidates (method select): evaluate the full INT8 graph
            of each, closest to FP32 at calibration first; one that meets it is shipped (no float layer)
        still no: from the candidate that came closest, rank the INT8 layers (``vitedge.budget.rank``), return the top 1, 2, 4, ... of the
            ranking to float (doubling, or fixed groups) until a graph meets the budget, then
            bisect back to the fewest top-ranked layers that meet it and try re-quantizing each
            of those, least harmful first (fewest float layers)

A graph in which every candidate layer went back to float is not an INT8 model: the search
reports "not met" rather than return it, with the closest graph it evaluated that keeps an INT8
layer (the build ships it marked failed, so there is something to inspect). Layers the user pins with ``--keep-float`` are float
from the start, never candidates, never re-quantized.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from vitedge.budget.evaluate import Evaluator, RuntimeOpener
from vitedge.budget.rank import rank_layers
from vitedge.budget.record import BudgetResult, Evaluation
from vitedge.budget.settings import BudgetSettings
from vitedge.quantize.qdq import build_qdq, resolve_keep_float


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
    reference_cache: Any = None,
    runtime_facts: dict[str, tuple[Any, Any]] | None = None,
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
    reference_cache, runtime_facts  the FP32 reference cache of validation (ReferenceCacheSettings) and
                 each runtime's (backend, options) it keys on: FP32 outputs are reused across builds
    """

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
                   runtimes=runtimes, reference_cache=reference_cache, runtime_facts=runtime_facts, preprocess=preprocess)
    for name, lookup in ev.lookups.items():
        info(f"budget {name}: " + lookup.one_line(len(source)))
    result.runtimes = [name for name, _ in ev.runtimes]
    graphs: dict[tuple[str, ...], Any] = {}  # the passing candidates only (a ViT-B graph is ~100 MB)
    closest: list[Any] = [None, None]  # [Evaluation, graph]: the complete miss closest to the budget, shipped when none meets it
    variant = getattr(calibration, "variant", None)
    result.calibration = result.calibration_chosen = variant

    def evaluate(returned: tuple[str, ...], step: str, graph: Any = None) -> Evaluation:
        t0 = time.perf_counter()
        g = graph if graph is not None else full if not returned else build_qdq(calibration, keep_float=pins + returned)
        reused = len(ev.reused)
        acc = ev.accuracy(g.model, early_stop=settings.early_stop)
        if len(ev.reused) > reused:
            info(f"budget: candidate outputs on {', '.join(ev.reused[reused:])} read from the validation cache "
                 "(the same graph ran on the same data, runtime and CPU before)")
        ok, failures = ev.verdict(acc)
        if ok:
            graphs[returned] = g
        e = Evaluation(len(result.evaluations) + 1, step, returned, ok, acc, failures, time.perf_counter() - t0,
                       variant=getattr(g.calibration, "variant", None))
        result.evaluations.append(e)
        info(f"budget evaluation {e.index}: {e.describe()}")
        if not ok and not acc.get("stopped_early") and g.quantized and (
                closest[0] is None or (_closeness(acc), -len(returned)) > (_closeness(closest[0].accuracy), -len(closest[0].returned))):
            closest[:] = [e, g]
        return e

    def not_met(reason: str, fallback_graph: Any) -> BudgetResult:
        result.status, result.reason = "not-met", reason
        result.graph = closest[1] if closest[1] is not None else fallback_graph
        result.returned = tuple(closest[0].returned) if closest[0] is not None else ()
        result.calibration = getattr(result.graph.calibration, "variant", None)
        result.seconds = time.perf_counter() - start
        return result

    first = evaluate((), "full-int8")
    if first.passed:
        result.status = "int8"
        result.seconds = time.perf_counter() - start
        return result
    if not full.quantized:
        return not_met("no layer is INT8 (every layer pinned float) and the graph still misses the budget", full)
    for name in _other_calibrations(calibration):  # calibration choices before float layers
        if len(result.evaluations) >= settings.max_evals:
            break
        e = evaluate((), "calibration", build_qdq(calibration.with_variant(name), keep_float=pins))
        if e.passed:
            result.status, result.graph, result.calibration = "int8", graphs[()], name
            info(f"budget: the full INT8 graph with {name} thresholds meets it (calibration chose {variant}); no layer returned to float")
            result.seconds = time.perf_counter() - start
            return result
    if closest[1] is not None and closest[1] is not full:  # search layers from the calibration that came closest
        calibration, full = closest[1].calibration, closest[1]
        result.calibration = getattr(calibration, "variant", None)
        info(f"budget: returning layers to float from the {result.calibration} thresholds (the closest full INT8 graph)")

    order = rank_layers(result, calibration, full, source, output_kind, preprocess, cache_dir, settings, info)
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
        if len(result.evaluations) >= settings.max_evals:
            reason = (f"the evaluation cap ({settings.max_evals}) was reached; the closest graph ({best.describe()}) "
                      f"misses: {'; '.join(best.failures)}")
        else:
            last = result.evaluations[-1]
            reason = (f"no graph with an INT8 layer left meets it: with {len(last.returned)} of the {n} INT8 layers back in "
                      f"float it still misses ({'; '.join(last.failures)}), and all {n} in float is FP32, not INT8")
        return not_met(reason, full)
    result.status = "fallback"
    result.returned = tuple(passing)
    result.graph = graphs[tuple(passing)]
    result.seconds = time.perf_counter() - start
    return result


def _other_calibrations(calibration: Any) -> list[str]:
    """Method select's other candidates, closest to FP32 at calibration first (none for a fixed method)."""
    variants = getattr(calibration, "variants", None) or {}
    selection = getattr(calibration, "selection", None)
    order = [s.name for s in selection.scores] if selection is not None else list(variants)
    current = getattr(calibration, "variant", None)
    return [name for name in order if name in variants and name != current]


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
