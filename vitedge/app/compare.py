"""`vitedge compare`: the workflow that gates a regression between two validation reports.

    CompareRequest -> validation.compare.load_report (both, checked) -> compare_reports
                   -> compare.json, compare.md, compare-junit.xml (with --report-dir) and the CI job summary
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vitedge.validation.compare import Comparison, compare_reports, load_report, report_path
from vitedge.validation.defaults import DEFAULT_MAX_ACCURACY_REGRESSION, DEFAULT_MAX_LATENCY_REGRESSION
from vitedge.validation.report import append_step_summary, check_report_dir


@dataclass(frozen=True)
class CompareRequest:
    old: Path  # the accepted baseline's validation.json
    new: Path  # the candidate's
    max_latency_regression: float = DEFAULT_MAX_LATENCY_REGRESSION  # a fraction: 0.1 = 10% slower
    max_accuracy_regression: float = DEFAULT_MAX_ACCURACY_REGRESSION  # percentage points
    allow_mismatch: bool = False
    report_dir: Path | None = None


@dataclass
class CompareOutcome:
    comparison: Comparison
    written: list[Path]
    summary_warning: str | None  # why the CI job summary was not appended to, if it was not


def run_compare(request: CompareRequest) -> CompareOutcome:
    check_report_dir(request.report_dir)
    old, new = load_report(request.old), load_report(request.new)
    comparison = compare_reports(old, new, old_path=str(report_path(request.old)), new_path=str(report_path(request.new)),
                                 max_latency_regression=request.max_latency_regression,
                                 max_accuracy_regression=request.max_accuracy_regression, allow_mismatch=request.allow_mismatch)
    written = comparison.write(request.report_dir) if request.report_dir is not None else []
    return CompareOutcome(comparison, written, append_step_summary(comparison.markdown()))
