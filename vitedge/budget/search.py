"""The fallback search: return the most harmful INT8 layers to float until a Q/DQ graph meets
the budget, with the fewest layers in float.

    full INT8 graph --evaluate--> meets the budget?  yes: done (1 evaluation)
        no: rank the INT8 layers (``vitedge.budget.rank``), return the top 1, 2, 4, ... of the
            ranking to float (doubling, or fixed groups) until a graph meets the budget, then
            bisect back to the fewest top-ranked layers that meet it and try re-quantizing each
            of those, least harmful first (fewest float layers)

A graph in which every candidate layer went back to float is not an INT8 model: the search
reports "not met" rather than return it. Layers the user pins with ``--keep-float`` are float
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

    def evaluate(returned: tuple[str, ...], step: str) -> Evaluation:
        t0 = time.perf_counter()
        g = full if not returned else build_qdq(calibration, keep_float=pins + returned)
        reused = len(ev.reused)
        acc = ev.accuracy(g.model, early_stop=settings.early_stop)
        if len(ev.reused) > reused:
            info(f"budget: candidate outputs on {', '.join(ev.reused[reused:])} read from the validation cache "
                 "(the same graph ran on the same data, runtime and CPU before)")
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
