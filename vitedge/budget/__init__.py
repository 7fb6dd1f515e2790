"""Accuracy budget: return the most harmful INT8 layers to float until the Q/DQ graph meets
the build's accuracy thresholds, then let every target consume that one graph.

    full INT8 graph --evaluate--> meets max_top1_drop / min_agreement?  yes: done (1 evaluation)
        no: rank the INT8 layers by per-layer sensitivity (cached beside the calibration statistics)
            return the top 1, 2, 4, ... of the ranking to float (doubling) until a graph
            meets the budget, then bisect back to the fewest top-ranked layers that meet it
            and try re-quantizing each of those, least harmful first (fewest float layers)

Every evaluation runs the candidate Q/DQ graph and the FP32 graph on the runtime of every
target that consumes the graph (ONNX Runtime for onnx, OpenVINO for intel-cpu: their INT8
kernels differ) on the validation data and applies the build gate's own accuracy rows. Layers
the user pins with ``--keep-float`` are float from the start, never candidates, never
re-quantized. When the search returns layers, their cost in speed is measured, and each
target's own measured speedup becomes a gate failure when the float layers leave INT8 no
faster than FP32.

One job per module (each imports only the ones above it in this list, and lower layers):

    settings   BudgetSettings: how the search runs; the record/cache version
    report     the manifest record in words and pictures: one line, report.md section, plot
    record     Evaluation, LayerCost, BudgetResult: what the search did (the manifest record)
    evaluate   Evaluator: a candidate vs FP32 on every target runtime, judged by the gate's rows;
               which runtimes (target_runtimes) and the shared thresholds (strictest)
    rank       the candidate layers, most harmful first, and the sensitivity cache
    search     meet_budget(BudgetSearch): grow, bisect and prune over the ranking within max_evals
    cost       what the float layers cost in speed (ONNX Runtime latency and profiler)
    speed      the per-target speed verdict, recorded in the manifest
    run        run_budget: the entry point the build pipeline calls, one per shared graph

The ranking itself, ``vitedge.validation.sensitivity.layer_sensitivity``, stays in validation:
it rebuilds the float graph from a bundle's two graphs without calibration data and is a
general diagnostic (``vitedge validate --sensitivity`` runs it on finished bundles, of any
backend). The budget is one consumer of it; what is budget-specific (which layers are
candidates, the cache key, the summary in the manifest) is ``vitedge.budget.rank``.

Heavy imports (onnx, onnxruntime, matplotlib) happen inside the functions.
"""

from vitedge.budget.cost import float_layers, measure_costs, timing_session
from vitedge.budget.evaluate import Evaluator, RuntimeOpener, strictest, target_runtimes
from vitedge.budget.rank import SensitivityCache, rank_layers, sensitivity_key
from vitedge.budget.record import RUNTIME, BudgetResult, Evaluation, LayerCost
from vitedge.budget.report import (
    budget_criterion,
    budget_markdown,
    budget_plot,
    describe_record,
    write_budget_report,
)
from vitedge.budget.run import BudgetJob, BudgetNotMet, budget_failure, run_budget
from vitedge.budget.search import BudgetSearch, meet_budget
from vitedge.budget.settings import (
    BUDGET_VERSION,
    DEFAULT_MAX_EVALS,
    DEFAULT_SENSITIVITY_SAMPLES,
    SCHEDULES,
    BudgetSettings,
)
from vitedge.budget.speed import record_speed_verdict, speed_verdict

__all__ = [
    "BUDGET_VERSION", "DEFAULT_MAX_EVALS", "DEFAULT_SENSITIVITY_SAMPLES", "RUNTIME", "SCHEDULES",
    "BudgetJob", "BudgetNotMet", "budget_failure", "BudgetResult", "BudgetSearch", "BudgetSettings", "Evaluation", "Evaluator", "LayerCost", "RuntimeOpener",
    "SensitivityCache", "budget_criterion", "budget_markdown", "budget_plot", "describe_record", "float_layers",
    "measure_costs", "meet_budget", "rank_layers", "record_speed_verdict", "run_budget", "sensitivity_key", "speed_verdict",
    "strictest", "target_runtimes", "timing_session", "write_budget_report",
]
