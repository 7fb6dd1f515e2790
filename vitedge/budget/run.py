"""The accuracy budget as a build stage (the package's entry point, ``run_budget``): for the
Q/DQ graph a set of targets shares, find the graph that meets the strictest of their accuracy
thresholds on every target runtime that runs here, say what its float layers cost, and when no graph
with an INT8 layer left meets it, hand back the closest one, to be shipped marked failed (``budget_failure``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vitedge.budget.cost import float_layers, measure_costs
from vitedge.budget.evaluate import runtime_facts, strictest, target_runtimes
from vitedge.budget.record import BudgetResult
from vitedge.budget.report import budget_criterion
from vitedge.budget.search import BudgetSearch, meet_budget
from vitedge.budget.settings import BudgetSettings
from vitedge.core.errors import GateFailure
from vitedge.targets.profiles import TargetProfile, Thresholds
from vitedge.bundle.spec import ModelSpec
from vitedge.core.ui import StageLog
from vitedge.validation.reference_cache import ReferenceCacheSettings

if TYPE_CHECKING:
    from vitedge.backends.base import Backend
    from vitedge.datasources.base import CalibrationSource
    from vitedge.quantize.qdq import QuantizedGraph
    from vitedge.quantize.record import Calibration


class BudgetNotMet(GateFailure):
    """No graph with at least one INT8 layer met the accuracy budget within the search (for callers that
    want to stop there; `vitedge build` ships the closest graph marked failed instead)."""


@dataclass(frozen=True, kw_only=True)
class BudgetJob:
    """One shared Q/DQ graph and the targets that will consume it.

    calibration  what ``vitedge.quantize.calibrate`` returned (a ``Calibration``)
    graph        the full INT8 graph, ``build_qdq(calibration, keep_float=keep_float)`` (a ``QuantizedGraph``)
    fp32         the FP32 reference graph
    validation   the validation data (a calibration source; labels optional)
    spec         the model's spec (output kind, preprocessing)
    targets      the target profiles that share the graph
    backends     backend by target name (each target's own runtime evaluates the candidates)
    thresholds   thresholds by target name (the budget is the strictest of the targets')
    keep_float   the user's pins (``--keep-float``): float, never searched
    cache        the cache settings of the build: ``root`` is where the per-layer sensitivities are cached
                 (beside the calibration); FP32 outputs come from validation's reference cache when it is
                 enabled, and the outputs of candidates that ran over all the data too with ``int8_outputs``
    """

    calibration: Calibration
    graph: QuantizedGraph
    fp32: Path
    validation: CalibrationSource
    spec: ModelSpec
    targets: Sequence[TargetProfile]
    backends: Mapping[str, Backend]
    thresholds: Mapping[str, Thresholds]
    keep_float: tuple[str, ...] = ()
    cache: ReferenceCacheSettings = field(default_factory=ReferenceCacheSettings)


def not_met_hint(output_kind: str) -> str:
    loosen = "--min-embedding-cosine" if output_kind == "embedding" else "--max-top1-drop / --min-agreement"
    return (f"loosen {loosen}, raise --fallback-max-evals, or pass --no-fallback to build the full INT8 graph and let its "
            "gate report the miss")


def budget_failure(result: BudgetResult | None, output_kind: str) -> str | None:
    """The one line that marks a bundle failed when the budget was not met (its graph is the closest found)."""
    if result is None or result.status != "not-met":
        return None
    return f"{result.one_line()}; this bundle holds the closest INT8 graph found ({result.graph.one_line()}): {not_met_hint(output_kind)}"


def run_budget(job: BudgetJob, settings: BudgetSettings, log: StageLog) -> BudgetResult:
    """The accuracy budget for the Q/DQ graph ``job.targets`` share: the strictest of their
    thresholds, evaluated against FP32 on the validation data on every target runtime that runs here.
    When the search found no graph that meets it, the result's status is ``not-met`` and its graph the
    closest one evaluated that keeps an INT8 layer: the build ships it, marked failed (``budget_failure``)."""
    runtimes = target_runtimes(list(job.targets), job.backends, settings.threads, log)
    spec, fp32, val = job.spec, job.fp32, job.validation
    budget_thresholds = strictest([job.thresholds[p.name] for p in job.targets])
    what = budget_criterion(budget_thresholds.to_dict(), spec.output_kind) if settings.enabled else "off (--no-fallback)"
    with log.stage("budget", f"accuracy budget: {what}"):
        search = BudgetSearch(calibration=job.calibration, source=val, thresholds=budget_thresholds, fp32=fp32, full=job.graph,
                              keep_float=job.keep_float, settings=settings, output_kind=spec.output_kind, preprocess=spec.preprocess,
                              cache=job.cache, runtimes=tuple(runtimes), runtime_facts=runtime_facts(list(job.targets), job.backends))
        result = meet_budget(search, log.info)
        if result.status == "fallback" and settings.measure_cost:
            measure_costs(result, fp32, next(iter(val.batches(1))).images, threads=settings.threads)
        else:
            result.costs = float_layers(result)
        log.info(result.one_line())
        if result.status == "not-met":
            log.info(f"the closest INT8 graph ({result.graph.one_line()}) is built and marked failed: " + not_met_hint(spec.output_kind))
        if result.status == "fallback":
            log.info("kept in float by the budget: " + ", ".join(result.returned))
    return result
